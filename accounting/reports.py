"""Cost reports: the figures behind /accounting/reports/ and its CSV, the cluster utilisation and the
own-cluster-versus-cloud comparison. Reads only (built on accounting.selectors)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import defaultdict
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from accounting.selectors import booking_charges, cost_report, idle_savings_by_team, usage_by_team_and_month
from portal import money
from portal.models import NodeInfo

HOURS_PER_MONTH = Decimal(365 * 24) / Decimal(12)  # 730
# gpu_hours: paid (allocated); busy_gpu_hours: what the GPUs computed of the monitored ones (GPU monitoring)
CSV_COLUMNS = ("group_by", "key", "label", "gpu_hours", "requested_gpu_hours", "efficiency", "cost", "unpriced_gpu_hours", "currency",
               "monitored_gpu_hours", "busy_gpu_hours", "gpu_efficiency", "idle_cost")  # fmt: skip


def parse_gpu_prices(name: str, value: str) -> dict[str, Decimal]:
    """"a100=8,h100=20" → {"a100": Decimal(8), …}; anything else fails loudly like portal.env."""
    prices: dict[str, Decimal] = {}
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        gpu_type, sep, price = item.partition("=")
        try:
            amount = Decimal(price.strip())
        except ArithmeticError:
            amount = None
        if not sep or not gpu_type.strip() or amount is None or not amount.is_finite() or amount < 0:
            raise ImproperlyConfigured(
                f"Environment variable {name}={value!r} is invalid: expected type=price pairs such as a100=8,h100=20."
            )
        prices[gpu_type.strip()] = amount
    return prices


def cloud_gpu_hour_prices() -> dict[str, Decimal]:
    return parse_gpu_prices("CLOUD_GPU_HOUR_PRICES", settings.CLOUD_GPU_HOUR_PRICES)


def gpus_by_type() -> dict[str, int]:
    """GPUs of each type in the portal's inventory (NodeInfo, as last read by cluster_sync)."""
    totals: dict[str, int] = defaultdict(int)
    for gpu_type, count in NodeInfo.objects.filter(gpus_total__gt=0).values_list("gpu_type", "gpus_total"):
        totals[gpu_type or "untyped"] += count
    return dict(totals)


def _hours_in(start_at: dt.datetime, end_at: dt.datetime) -> Decimal:
    """Hours in [start_at, end_at) (a day of a DST change has 23 or 25)."""
    return money.gpu_hours(int((end_at - start_at).total_seconds()))


def utilisation(*, start_at: dt.datetime, end_at: dt.datetime, by_type: list[dict]) -> list[dict]:
    """Used / available GPU-hours per GPU type; available = GPUs of the type × hours in the range
    (today's inventory: nodes added or removed during the range are not accounted for)."""
    hours = _hours_in(start_at, end_at)
    gpus = gpus_by_type()
    used = {row["key"]: row["gpu_hours"] for row in by_type}
    rows = []
    for gpu_type in sorted(set(gpus) | set(used)):
        available = Decimal(gpus.get(gpu_type, 0)) * hours
        rows.append({
            "gpu_type": gpu_type or "untyped",
            "gpus": gpus.get(gpu_type, 0),
            "used_gpu_hours": used.get(gpu_type, Decimal(0)),
            "available_gpu_hours": available,
            "utilisation": float(used.get(gpu_type, 0) / available) if available else None,
        })  # fmt: skip
    return rows


def cloud_comparison(*, start_at: dt.datetime, end_at: dt.datetime, by_type: list[dict]) -> dict:
    """What the same GPU-hours would cost in the cloud, what the own cluster costs over the range
    (depreciation + opex, pro rata), and the break-even utilisation:
    (monthly depreciation + opex) / Σ_type (GPUs × hours per month × cloud price)."""
    prices = cloud_gpu_hour_prices()
    gpus = gpus_by_type()
    monthly_own = Decimal(str(settings.CLUSTER_PURCHASE_COST)) / settings.CLUSTER_DEPRECIATION_MONTHS + Decimal(
        str(settings.CLUSTER_MONTHLY_OPEX)
    )
    months = _hours_in(start_at, end_at) / HOURS_PER_MONTH
    rows, cloud_total, unpriced = [], Decimal(0), []
    for row in by_type:
        price = prices.get(row["key"])
        if price is None:
            unpriced.append(row["key"] or "untyped")
            continue
        cost = money.display(money.cost(gpu_hours=row["gpu_hours"], price=price))
        cloud_total += cost
        rows.append({"gpu_type": row["key"], "gpu_hours": row["gpu_hours"], "cloud_price": price, "cloud_cost": cost})
    full_cloud_month = sum((Decimal(n) * HOURS_PER_MONTH * prices[t] for t, n in gpus.items() if t in prices), Decimal(0))
    return {
        "rows": rows,
        "cloud_cost": cloud_total,
        "own_cost": money.display(monthly_own * months),
        "monthly_own_cost": money.display(monthly_own),
        "break_even_utilisation": float(monthly_own / full_cloud_month) if full_cloud_month else None,
        "types_without_cloud_price": unpriced,
        "currency": settings.DEFAULT_CURRENCY,
    }


def report_page_data(*, start_at: dt.datetime, end_at: dt.datetime) -> dict:
    """Everything the report page shows over [start_at, end_at) (any range: one hour is prorated to
    the second, as the API's ``cost_report``): five aggregate queries, the bookings read twice (whole, by month), one inventory read and the idle
    policies' savings (two more, by cluster, when the portal serves several)."""
    from portal.slurm import configured_clusters

    span = {"start_at": start_at, "end_at": end_at}
    bookings = booking_charges(**span)  # read once for the four groupings that take them whole
    by_team = cost_report(**span, group_by="team", bookings=bookings)
    by_cluster = cost_report(**span, group_by="cluster", bookings=bookings) if len(configured_clusters()) > 1 else []
    by_user = cost_report(**span, group_by="user", bookings=bookings)
    by_type = cost_report(**span, group_by="gpu_type", bookings=bookings)
    by_month = cost_report(**span, group_by="month")
    stacked = usage_by_team_and_month(**span)
    months = sorted({row["month"] for row in stacked})
    accounts = sorted({row["account"] for row in stacked})
    labels = {row["key"]: row["label"] for row in by_team}
    cell = {(row["account"], row["month"]): float(row["gpu_hours"]) for row in stacked}
    for row in by_team:  # the invoice links: only to months in which the team used something
        row["invoice_months"] = [m for m in months if any(r["account"] == row["key"] and r["month"] == m and (r["gpu_hours"] or r["cost"])
                                                         for r in stacked)]  # fmt: skip
    chart = {
        "months": months,
        "teams": [{"label": labels.get(a, a), "data": [cell.get((a, m), 0.0) for m in months]} for a in accounts],
        "share": {"labels": [row["label"] for row in by_team], "data": [float(row["cost"]) for row in by_team]},
    }
    util = utilisation(**span, by_type=by_type)
    chart["utilisation"] = {
        "labels": [row["gpu_type"] for row in util],
        "data": [round(row["utilisation"] * 100, 2) if row["utilisation"] is not None else 0 for row in util],
    }
    # what the teams' idle-GPU policies saved in the range (GPU-hours their cancels freed before the time limits)
    savings = sorted(idle_savings_by_team(**span).values(), key=lambda r: (-r["gpu_seconds"], r["team_name"]))
    saved_by_slug = {r["team_slug"]: r for r in savings}
    for row in by_team:
        row["idle_saved"] = saved_by_slug.get(row.get("team_slug"))
    totals = {
        "idle_saved_gpu_hours": money.display(money.gpu_hours(sum(r["gpu_seconds"] for r in savings))),
        "gpu_hours": sum((r["gpu_hours"] for r in by_team), Decimal(0)),
        "requested_gpu_hours": sum((r["requested_gpu_hours"] for r in by_team), Decimal(0)),
        "cost": sum((r["cost"] for r in by_team), Decimal(0)),
    }
    return {
        "by_team": by_team,
        "idle_savings": savings,
        "by_user": by_user,
        "by_type": by_type,
        "by_month": by_month,
        "by_cluster": by_cluster,
        "utilisation": util,
        "cloud": cloud_comparison(**span, by_type=by_type),
        "chart": chart,
        "totals": totals,
        "currency": settings.DEFAULT_CURRENCY,
    }


# Excel reads a CSV file as the system's ANSI code page unless it starts with a UTF-8 byte order mark
# (视觉组 would show as mojibake); every other reader of UTF-8 CSV skips it ("utf-8-sig").
CSV_BOM = "\ufeff"


# A spreadsheet runs a cell that starts with one of these as a formula (=HYPERLINK(…), +cmd|…, @SUM):
# OWASP's CSV injection rule prefixes such a text cell with a single quote (numbers stay numbers).
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """One cell of a CSV the portal writes: None as empty, text that a spreadsheet would read as a
    formula prefixed with ``'`` (OWASP), anything else (Decimal, int) as it is."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(CSV_FORMULA_STARTS):
        return "'" + value
    return value


def rows_to_csv(rows: list[dict]) -> str:
    """The cost report as CSV for spreadsheets (the page's and the API's ``format=csv``): UTF-8 with a
    BOM, formula-looking text escaped (``csv_cell``)."""
    out = io.StringIO()
    out.write(CSV_BOM)
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in CSV_COLUMNS])
    return out.getvalue()
