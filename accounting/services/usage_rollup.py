"""The roll-up of closed months: per month, the sums of its usage slices per team × account × user ×
cluster × GPU type × rate (UsageMonthTotal), which the cost report and the invoice read for a whole
closed month instead of its slices (accounting.selectors.usage_totals). The rule:

- A month is *closed* USAGE_MONTH_CLOSE_DAYS days (default 3) after its end (billing time zone): the
  records of jobs that ended at the month's end have come in by then. The periodic ``usage_rollup``
  (portal/project/celery.py, every USAGE_ROLLUP_SECONDS) rolls every closed month that was never rolled
  or is stale; the current month is never rolled (reports read its slices).
- A *late* record (or a re-pricing) that writes a slice of a month before the current one marks that
  month stale in the same transaction (``usage_months_reopen``, called by
  accounting.services.repricing.slices_replace, the one writer of slices). While a month is stale the
  reports and the invoice read its slices, so what they show is always what the slices say; the next
  run rolls it again (and records ``revised_at`` when its totals changed).
- Deleting a job's detail (jobs.services.retention) touches neither slices nor totals: a closed
  month's report and invoice stay what they were. Usage records and slices are never deleted.

Sums are exact: GPU-seconds whole, costs the slices' stored six-place costs added, busy GPU-seconds
and idle cost the same products the report takes per slice (tests/accounting/test_usage_rollup.py
compares both on the same data, a late record included)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Count, DecimalField, ExpressionWrapper, F, Q, Sum, Value, When
from django.utils import timezone

from accounting.calendar import billing_date, month_start, next_month
from accounting.models import UsageMonth, UsageMonthTotal, UsageSlice
from portal.snapshots import USAGE_MONTHS, snapshot_changed

# what a month's totals are grouped by (the columns of UsageMonthTotal that name a row)
TOTAL_KEYS = ("period", "team_id", "account", "unix_user", "cluster", "gpu_type", "rate_id", "price_per_gpu_hour", "provisional")
_DECIMAL = DecimalField(max_digits=36, decimal_places=12)


def last_closed_month(now: dt.datetime | None = None) -> dt.date:
    """The first day of the latest closed month: the month that ended USAGE_MONTH_CLOSE_DAYS ago or earlier."""
    today = billing_date(now or timezone.now())
    return month_start(month_start(today - dt.timedelta(days=settings.USAGE_MONTH_CLOSE_DAYS)) - dt.timedelta(days=1))


def _month_sums(period: dt.date):
    busy = F("record__gpu_busy_fraction")
    monitored = Q(record__gpu_busy_fraction__isnull=False)
    return (
        UsageSlice.objects.filter(period=period)
        .values(*TOTAL_KEYS)
        .annotate(
            n=Count("id"),
            sum_gpu_seconds=Sum("gpu_seconds"),
            sum_requested=Sum("requested_gpu_seconds"),
            sum_unpriced=Sum(Case(When(rate__isnull=True, then=F("gpu_seconds")), default=Value(0))),
            sum_cost=Sum("cost"),
            sum_monitored=Sum("gpu_seconds", filter=monitored),
            sum_busy=Sum(ExpressionWrapper(F("gpu_seconds") * busy, output_field=_DECIMAL), filter=monitored),
            sum_idle=Sum(ExpressionWrapper(F("cost") * (Value(1) - busy), output_field=_DECIMAL), filter=monitored),
        )
        .order_by()
    )


def usage_month_roll(*, period: dt.date, now: dt.datetime | None = None) -> int:
    """Write the totals of one month from its slices (replacing any earlier ones) and mark it rolled.
    The month's row is locked first: a slice written meanwhile marks it stale after this commits
    (usage_months_reopen waits on the row), so it is rolled again by the next run. Returns the rows."""
    period = month_start(period)
    now = now or timezone.now()
    UsageMonth.objects.get_or_create(period=period)
    with transaction.atomic():
        month = UsageMonth.objects.select_for_update().get(period=period)
        old = _fingerprint(period)
        UsageMonthTotal.objects.filter(period=period).delete()
        rows = [
            UsageMonthTotal(
                **{key: values[key] for key in TOTAL_KEYS}, slices=values["n"], gpu_seconds=values["sum_gpu_seconds"] or 0,
                requested_gpu_seconds=values["sum_requested"] or 0, unpriced_gpu_seconds=values["sum_unpriced"] or 0,
                cost=values["sum_cost"] or 0, monitored_gpu_seconds=values["sum_monitored"] or 0,
                busy_gpu_seconds=values["sum_busy"] or 0, idle_cost=values["sum_idle"] or 0,
            )  # fmt: skip
            for values in _month_sums(period)
        ]
        UsageMonthTotal.objects.bulk_create(rows, batch_size=2000)
        revised = month.rolled_at is not None and old != _fingerprint(period)
        UsageMonth.objects.filter(pk=month.pk).update(
            rolled_at=now, stale=False, slices=sum(r.slices for r in rows), revised_at=now if revised else month.revised_at
        )
    return len(rows)


def _fingerprint(period: dt.date) -> tuple:
    totals = UsageMonthTotal.objects.filter(period=period).aggregate(s=Sum("gpu_seconds"), c=Sum("cost"), n=Sum("slices"))
    return totals["s"], totals["c"], totals["n"]


def usage_rollup(*, now: dt.datetime | None = None) -> list[dt.date]:
    """Roll every closed month that was never rolled or is stale (the periodic task). Months without
    usage get a row too (rolled, nothing to sum), so a report over them reads no slices. Returns the
    months rolled."""
    now = now or timezone.now()
    last = last_closed_month(now)
    first = UsageSlice.objects.filter(period__lte=last).order_by("period").values_list("period", flat=True).first()
    if first is None:
        return []
    done = set(UsageMonth.objects.filter(period__gte=first, period__lte=last, stale=False, rolled_at__isnull=False)
               .values_list("period", flat=True))  # fmt: skip
    rolled, month = [], first
    while month <= last:
        if month not in done:
            usage_month_roll(period=month, now=now)
            rolled.append(month)
        month = next_month(month)
    return rolled


def months_between(start: dt.datetime, end: dt.datetime) -> list[dt.date]:
    """The first days of the months (billing time zone) that [start, end] touches."""
    months, month, last = [], month_start(billing_date(start)), month_start(billing_date(max(start, end)))
    while month <= last:
        months.append(month)
        month = next_month(month)
    return months


def usage_months_reopen(periods, *, now: dt.datetime | None = None) -> None:
    """Slices of these months are being written (in the caller's transaction): mark each month before
    the current one stale, creating its row if need be (one statement). The current month is never
    rolled, so it is left alone (no row lock on the hot month)."""
    current = month_start(billing_date(now or timezone.now()))
    past = sorted({month_start(p) for p in periods if p < current})
    if not past:
        return
    table = UsageMonth._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (period, stale, slices) SELECT p, true, 0 FROM unnest(%s::date[]) AS p "
            f"ON CONFLICT (period) DO UPDATE SET stale = true WHERE {table}.stale = false",
            [past],
        )
        changed = cursor.rowcount
    if changed:
        snapshot_changed(USAGE_MONTHS)  # raw SQL: the manager does not see it
