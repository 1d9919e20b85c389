"""Monthly team invoices: the figures (jobs, GPU-hours, rates, totals) and a PDF of them.

The PDF is the HTML invoice: the one template (templates/accounting/_invoice.html) in a print page,
rendered by WeasyPrint (Pango shapes any script; the fonts, CJK included, come from scripts/pdf), so
the page and the PDF show the same rows, the same local times and the full names."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal

from django.conf import settings
from django.template.loader import render_to_string

from accounting.calendar import billing_midnight, next_month
from accounting.charging import booking_charge_mode
from accounting.selectors import booking_charges, invoice_lines
from portal import money
from portal.models import Team


def invoice(*, team: Team, month: dt.date) -> dict:
    """One line per usage slice of the team in the month with usage (a job crossing a month boundary
    or a rate change has one line per part; slices under 0.01 GPU-hours and 0.01 in cost share one
    line), a summary per GPU type and rate, and totals. Two queries."""
    slices = list(invoice_lines(team=team, month=month))
    lines, summary = [], defaultdict(lambda: {"gpu_seconds": 0, "cost": Decimal(0)})
    small = {"count": 0, "gpu_seconds": 0, "cost": Decimal(0)}
    monitored = {"gpu_seconds": 0, "busy_gpu_seconds": Decimal(0), "idle_cost": Decimal(0)}
    for s in slices:
        key = (s.gpu_type or "untyped", s.price_per_gpu_hour)
        summary[key]["gpu_seconds"] += s.gpu_seconds
        summary[key]["cost"] += s.cost
        hours = money.gpu_hours(s.gpu_seconds)
        record = s.record
        busy = record.gpu_busy_fraction
        if busy is not None:
            monitored["gpu_seconds"] += s.gpu_seconds
            monitored["busy_gpu_seconds"] += s.gpu_seconds * busy
            monitored["idle_cost"] += s.cost * (1 - busy)
        if money.display(hours) == 0 and money.display(s.cost) == 0:
            # under 0.01 GPU-hours and 0.01 in cost (a job that failed at once, cancelled before it
            # ran): counted in one line of its own, not a row of 0.00 each
            small["count"] += 1
            small["gpu_seconds"] += s.gpu_seconds
            small["cost"] += s.cost
            continue
        lines.append({
            "job_id": record.job_id,
            "name": record.name,
            "user": record.unix_user,
            "partition": record.partition,
            "state": record.state,
            "gpu_type": s.gpu_type or "untyped",
            "gpus": s.gpus,
            "start": s.slice_start,
            "end": s.slice_end,
            "gpu_hours": money.display(hours),
            "price": s.price_per_gpu_hour,
            "cost": money.display(s.cost),
            "provisional": s.provisional,
            "portal_job_uuid": record.portal_job_uuid,  # the jobs app's page: /jobs/<uuid>/
            # what the GPUs did (UsageRecord.gpu_busy_fraction; None: not monitored)
            "busy_gpu_hours": None if busy is None else money.display(hours * busy),
            "idle_cost": None if busy is None else money.display(s.cost * (1 - busy)),
        })  # fmt: skip
    total_cost = money.display(sum((s.cost for s in slices), Decimal(0)))
    bookings = booking_charges(start_at=billing_midnight(month), end_at=billing_midnight(next_month(month)), team=team)
    bookings_cost = money.display(sum((b["cost"] for b in bookings), Decimal(0)))
    return {
        "team": team,
        "month": month,
        "period_end": next_month(month) - dt.timedelta(days=1),
        "lines": lines,
        # the slices too small for a row of their own: how many, their GPU-hours and cost (in the totals)
        "small_lines": {"count": small["count"], "gpu_hours": money.display(money.gpu_hours(small["gpu_seconds"]), places=4),
                        "cost": money.display(small["cost"])},  # fmt: skip
        "summary": [
            {"gpu_type": t, "price": p, "gpu_hours": money.display(money.gpu_hours(v["gpu_seconds"])),
             "cost": money.display(v["cost"])}
            for (t, p), v in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)) if v["gpu_seconds"] or v["cost"]
        ],  # fmt: skip
        "gpu_hours": money.display(money.gpu_hours(sum(s.gpu_seconds for s in slices))),
        "usage_cost": total_cost,
        # Bookings: reserved GPU-hours charged whether used or not (BOOKING_CHARGE_MODE=reserved; usage
        # inside a booking then costs nothing above). With "used", lines are listed at cost 0.
        "bookings": bookings,
        "bookings_cost": bookings_cost,
        "booking_charge_mode": booking_charge_mode(),
        "total": total_cost + bookings_cost,
        "provisional": any(s.provisional for s in slices),
        "currency": settings.DEFAULT_CURRENCY,
        # GPU monitoring: of the usage whose GPUs were monitored, the busy GPU-hours and the idle ones' cost
        "monitored_gpu_hours": money.display(money.gpu_hours(monitored["gpu_seconds"])),
        "busy_gpu_hours": money.display(money.gpu_hours(monitored["busy_gpu_seconds"])),
        "idle_cost": money.display(monitored["idle_cost"]),
    }


def invoice_pdf(data: dict, *, request=None) -> bytes:
    """The PDF of ``invoice(...)``'s data, rendered in the active time zone (as the HTML invoice: the
    viewer's zone under UserTimezoneMiddleware, else TIME_ZONE). Nothing is fetched while rendering:
    the invoice has no images or stylesheets to load, and links stay links."""
    from weasyprint import HTML  # on use: loading Pango and fontconfig is for invoice requests only

    html = render_to_string("accounting/invoice_print.html", {"invoice": data}, request=request)
    base_url = request.build_absolute_uri("/") if request is not None else None
    return HTML(string=html, base_url=base_url, url_fetcher=_refuse_fetch).write_pdf()


def _refuse_fetch(url: str, *args, **kwargs):
    raise ValueError(f"invoice PDFs load nothing ({url})")
