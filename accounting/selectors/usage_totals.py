"""Reads of the closed months' totals (UsageMonthTotal, written by accounting.services.usage_rollup):
which whole months of a range may be read from them, and their sums in the shape of
accounting.selectors.usage.aggregate_slices, so that a report adds the two without knowing which
months came from where."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django.db.models import IntegerField, Max, QuerySet, Sum
from django.db.models.functions import Cast

from accounting.calendar import billing_date, billing_midnight, month_start, next_month
from accounting.models import UsageMonth, UsageMonthTotal
from portal.snapshots import USAGE_MONTHS, snapshot


def rolled_months(start_at: dt.datetime, end_at: dt.datetime) -> list[dt.date]:
    """The months wholly inside [start_at, end_at) whose totals are current (rolled, not stale), from
    this process's copy of the roll-up state (portal.snapshots USAGE_MONTHS: no query while current)."""
    first = month_start(billing_date(start_at))
    if billing_midnight(first) < start_at:
        first = next_month(first)
    if billing_midnight(next_month(first)) > end_at:
        return []
    last = month_start(billing_date(end_at))  # the month containing end_at is whole only if it starts there
    return [month for month in months_current() if first <= month < last]


def months_current() -> tuple[dt.date, ...]:
    """Every month whose totals are current, in order (a few dozen rows at most: one per month)."""
    return snapshot(USAGE_MONTHS, _months_current_load)


def _months_current_load() -> tuple[dt.date, ...]:
    rows = UsageMonth.objects.filter(stale=False, rolled_at__isnull=False).order_by("period")
    return tuple(rows.values_list("period", flat=True))


def totals_of(periods: Sequence[dt.date]) -> QuerySet[UsageMonthTotal]:
    return UsageMonthTotal.objects.filter(period__in=list(periods))


def aggregate_totals(queryset: QuerySet[UsageMonthTotal], columns: Sequence[str], *, gpu_busy: bool = False):
    """One GROUP BY over closed months' totals, with aggregate_slices' names (every row of a closed
    month is inside the range: no proration)."""
    extra = {}
    if gpu_busy:
        extra = {
            "sum_monitored_gpu_seconds": Sum("monitored_gpu_seconds"),
            "sum_busy_gpu_seconds": Sum("busy_gpu_seconds"),
            "sum_idle_cost": Sum("idle_cost"),
        }
    return (
        queryset.values(*columns)
        .annotate(
            **extra,
            sum_gpu_seconds=Sum("gpu_seconds"),
            sum_requested_gpu_seconds=Sum("requested_gpu_seconds"),
            sum_cost=Sum("cost"),
            sum_unpriced_gpu_seconds=Sum("unpriced_gpu_seconds"),
            any_provisional=Max(Cast("provisional", IntegerField())),
            slices=Sum("slices"),
        )
        .order_by(*columns)
    )


def month_rolled(month: dt.date) -> bool:
    """Whether the month's totals are current (rolled, not stale)."""
    return month_start(month) in months_current()
