"""Monthly team invoices: the figures (jobs, GPU-hours, rates, totals) and a PDF of them.

The PDF is the HTML invoice: the one template (templates/accounting/_invoice.html) in a print page,
rendered by WeasyPrint (Pango shapes any script; the fonts, CJK included, come from scripts/pdf), so
the page and the PDF show the same rows, the same local times and the full names."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import defaultdict
from decimal import Decimal

from django.conf import settings
from django.template.loader import render_to_string

from accounting.calendar import billing_midnight, next_month
from accounting.charging import booking_charge_mode
from accounting.models import IssuedInvoice, UsageMonth
from accounting.reports import CSV_BOM, csv_cell
from accounting.selectors import booking_charges, invoice_groups, invoice_job_rows, invoice_lines
from portal import money
from portal.models import Team


def invoice(*, team: Team, month: dt.date) -> dict:
    """A team's invoice for a month: totals, a summary per GPU type and rate, the lines a finance
    office books (per user × GPU type × rate: jobs, GPU-hours, cost), and, for a month of up to
    INVOICE_JOB_LINES_MAX jobs, one line per job (per usage slice: a job crossing a month boundary or
    a rate change has one line per part; slices under 0.01 GPU-hours and 0.01 in cost share one line).
    A busier month's jobs are the CSV download (``invoice_jobs_csv``): 24 000 rows are no invoice a
    person reads, and a PDF of them takes minutes. Figures are exact sums (of the month's totals once it
    is closed and rolled up, accounting.services.usage_rollup; of its slices before), rounded once
    for display. Three to four queries, whatever the month holds."""
    groups = invoice_groups(team=team, month=month)
    jobs = sum(int(g["slices"]) for g in groups)
    summary = defaultdict(lambda: {"gpu_seconds": 0, "cost": Decimal(0)})
    by_user = []
    for g in groups:
        seconds, cost = int(g["sum_gpu_seconds"] or 0), Decimal(g["sum_cost"] or 0)
        key = (g["gpu_type"] or "untyped", g["price_per_gpu_hour"])
        summary[key]["gpu_seconds"] += seconds
        summary[key]["cost"] += cost
        if seconds or cost:
            by_user.append({"user": g["unix_user"], "gpu_type": key[0], "price": key[1], "jobs": int(g["slices"]),
                            "gpu_hours": money.display(money.gpu_hours(seconds)), "cost": money.display(cost),
                            "provisional": bool(g["any_provisional"])})  # fmt: skip
    lines, small = [], {"count": 0, "gpu_seconds": 0, "cost": Decimal(0)}
    listed = jobs <= settings.INVOICE_JOB_LINES_MAX
    if listed:
        lines, small = _job_lines(team=team, month=month)
    total_seconds = sum(int(g["sum_gpu_seconds"] or 0) for g in groups)
    total_cost = _usage_cost(groups)
    monitored = sum((Decimal(g.get("sum_monitored_gpu_seconds") or 0) for g in groups), Decimal(0))
    busy = sum((Decimal(g.get("sum_busy_gpu_seconds") or 0) for g in groups), Decimal(0))
    idle = sum((Decimal(g.get("sum_idle_cost") or 0) for g in groups), Decimal(0))
    bookings = booking_charges(start_at=billing_midnight(month), end_at=billing_midnight(next_month(month)), team=team)
    bookings_cost = money.display(sum((b["cost"] for b in bookings), Decimal(0)))
    issued, adjustments, revised = _issue_state(team=team, month=month, usage_cost=total_cost)
    adjustments_cost = sum((a["amount"] for a in adjustments), Decimal(0))
    return {
        "team": team,
        "month": month,
        "period_end": next_month(month) - dt.timedelta(days=1),
        "lines": lines,
        "jobs": jobs,  # usage slices in the month (a job under two rates counts under each)
        "jobs_listed": listed,  # False: the per-job lines are the CSV download only
        "by_user": sorted(by_user, key=lambda r: (r["user"], r["gpu_type"], r["price"] or 0)),
        # the slices too small for a row of their own: how many, their GPU-hours and cost (in the totals)
        "small_lines": {"count": small["count"], "gpu_hours": money.display(money.gpu_hours(small["gpu_seconds"]), places=4),
                        "cost": money.display(small["cost"])},  # fmt: skip
        "summary": [
            {"gpu_type": t, "price": p, "gpu_hours": money.display(money.gpu_hours(v["gpu_seconds"])),
             "cost": money.display(v["cost"])}
            for (t, p), v in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)) if v["gpu_seconds"] or v["cost"]
        ],  # fmt: skip
        "gpu_hours": money.display(money.gpu_hours(total_seconds)),
        "usage_cost": issued.usage_cost if issued else total_cost,  # as billed once issued
        # Bookings: reserved GPU-hours charged whether used or not (BOOKING_CHARGE_MODE=reserved; usage
        # inside a booking then costs nothing above). With "used", lines are listed at cost 0.
        "bookings": bookings,
        "bookings_cost": issued.bookings_cost if issued else bookings_cost,
        "booking_charge_mode": booking_charge_mode(),
        # usage recorded after an earlier month's invoice was issued (accounting.services.invoicing):
        # billed here, once; on an issued invoice, what it carried
        "adjustments": adjustments,
        "adjustments_cost": adjustments_cost,
        "total": issued.total if issued else total_cost + bookings_cost + adjustments_cost,
        "issued": issued,  # the IssuedInvoice (its PDF is the invoice as sent), or None
        "revised_since_issue": revised,  # the month's usage cost now minus as issued (0 when unchanged)
        "provisional": any(g["any_provisional"] for g in groups),
        "currency": settings.DEFAULT_CURRENCY,
        # GPU monitoring: of the usage whose GPUs were monitored, the busy GPU-hours and the idle ones' cost
        "monitored_gpu_hours": money.display(money.gpu_hours(monitored)),
        "busy_gpu_hours": money.display(money.gpu_hours(busy)),
        "idle_cost": money.display(idle),
    }


def _usage_cost(groups) -> Decimal:
    """A month's usage cost as an invoice bills it: the exact sum, rounded once."""
    return money.display(sum((Decimal(g["sum_cost"] or 0) for g in groups), Decimal(0)))


def _issue_state(*, team: Team, month: dt.date, usage_cost: Decimal) -> tuple[IssuedInvoice | None, list[dict], Decimal]:
    """(this month's issued invoice or None, its adjustment lines, how much its usage cost moved since
    it was issued). The adjustments of a month not issued yet: for each earlier issued month whose
    totals were revised after its issue (UsageMonth.revised_at; or stale), what its usage costs now
    minus what was billed for it — on its own invoice and as adjustments carried since. One query
    when the team was never issued an invoice; a month revised after its issue costs one more."""
    rows = list(IssuedInvoice.objects.filter(team=team, period__lte=month).defer("pdf").order_by("period"))
    this = next((row for row in rows if row.period == month), None)
    if this is not None:
        adjustments = [{"period": dt.date.fromisoformat(a["period"]), "amount": Decimal(a["amount"])} for a in this.adjustments]
        return this, adjustments, usage_cost - this.usage_cost
    earlier = [row for row in rows if row.period < month]
    if not earlier:
        return None, [], Decimal(0)
    months = {m.period: m for m in UsageMonth.objects.filter(period__in=[row.period for row in earlier])}
    carried: dict[dt.date, Decimal] = defaultdict(Decimal)
    for row in earlier:
        for a in row.adjustments:
            carried[dt.date.fromisoformat(a["period"])] += Decimal(a["amount"])
    adjustments = []
    for row in earlier:
        state = months.get(row.period)
        if state is None or not (state.stale or (state.revised_at and state.revised_at > row.issued_at)):
            continue
        amount = _usage_cost(invoice_groups(team=team, month=row.period)) - row.usage_cost - carried[row.period]
        if amount:
            adjustments.append({"period": row.period, "amount": amount})
    return None, adjustments, Decimal(0)


def _job_lines(*, team: Team, month: dt.date) -> tuple[list[dict], dict]:
    """One line per usage slice of the team in the month, and the slices under 0.01 GPU-hours and
    0.01 in cost counted together. One query."""
    lines, small = [], {"count": 0, "gpu_seconds": 0, "cost": Decimal(0)}
    for s in invoice_lines(team=team, month=month):
        hours = money.gpu_hours(s.gpu_seconds)
        record = s.record
        busy = record.gpu_busy_fraction
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
    return lines, small


INVOICE_CSV_COLUMNS = ("job_id", "name", "user", "partition", "state", "gpu_type", "gpus", "start", "end", "gpu_seconds",
                       "gpu_hours", "price_per_gpu_hour", "cost", "provisional", "portal_job_uuid")  # fmt: skip


def invoice_jobs_csv(*, team: Team, month: dt.date):
    """The invoice's jobs, one row per usage slice, as CSV lines (a generator for a streaming
    response; the report CSV's rules: UTF-8 with a BOM, formula-looking text escaped). Times in UTC
    (ISO 8601), GPU-seconds exact, GPU-hours and cost rounded for display (their sum may differ from
    the invoice's total by cents: the total adds the exact figures)."""
    out = io.StringIO()
    writer = csv.writer(out)

    def flush() -> str:
        text = out.getvalue()
        out.seek(0)
        out.truncate()
        return text

    writer.writerow(INVOICE_CSV_COLUMNS)
    yield CSV_BOM + flush()
    for n, (job_id, name, user, partition, state, gpu_type, gpus, start, end, seconds, price, cost, provisional, job_uuid) in enumerate(
        invoice_job_rows(team=team, month=month)
    ):
        writer.writerow([job_id, csv_cell(name), csv_cell(user), csv_cell(partition), state, csv_cell(gpu_type or "untyped"), gpus,
                         start.astimezone(dt.UTC).isoformat(), end.astimezone(dt.UTC).isoformat(), seconds,
                         money.display(money.gpu_hours(seconds)), "" if price is None else price, money.display(cost),
                         "yes" if provisional else "", job_uuid or ""])  # fmt: skip
        if n % 1000 == 999:
            yield flush()
    yield flush()


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
