"""Reads of usage: the cost report (one aggregate query over UsageSlice, bookings' charges added),
the stacked usage chart, the sreport reconciliation's per-account figures, invoice lines and who may
read a team's usage."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db.models import (
    Case,
    Count,
    DecimalField,
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    Max,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Greatest, Least

from accounting.calendar import billing_midnight, billing_zone, month_start, next_month, range_bounds
from accounting.models import UsageMonthTotal, UsageRecord, UsageSlice
from accounting.selectors.bookings import booking_charges, booking_charges_by_month
from accounting.selectors.usage_totals import aggregate_totals, month_rolled, rolled_months, totals_of
from portal import money
from portal.models import Team
from portal.roles import can_read_cost_reports, is_manager
from portal.selectors import teams_visible_to

GROUP_BY_CHOICES = ("team", "user", "gpu_type", "month", "cluster")
_GROUP_COLUMNS = {"team": "account", "user": "unix_user", "gpu_type": "gpu_type", "month": "period", "cluster": "cluster"}


class _Seconds(Func):
    """Seconds from the first datetime expression to the second."""

    arity = 2
    output_field = DecimalField(max_digits=24, decimal_places=6)

    def as_sql(self, compiler, connection, **extra):
        sql, params = self._args_sql(compiler, connection)
        return f"EXTRACT(EPOCH FROM ({sql[1]} - {sql[0]}))", params[1] + params[0]

    def _args_sql(self, compiler, connection):
        compiled = [compiler.compile(expr) for expr in self.get_source_expressions()]
        return [c[0] for c in compiled], [list(c[1]) for c in compiled]


def slices_in(start_at: dt.datetime, end_at: dt.datetime) -> QuerySet[UsageSlice]:
    last_day = (end_at - dt.timedelta(microseconds=1)).astimezone(billing_zone()).date()
    first_day = start_at.astimezone(billing_zone()).date()
    return UsageSlice.objects.filter(
        period__gte=month_start(first_day),
        period__lte=month_start(last_day),
        slice_start__lt=end_at,
        slice_end__gt=start_at,
    )


def aggregate_slices(
    queryset: QuerySet[UsageSlice], start_at: dt.datetime, end_at: dt.datetime, columns: Sequence[str], *, gpu_busy: bool = False
):
    """One GROUP BY over slices; a slice cut by the range counts in proportion (exact: GPU count and
    price are constant within a slice). ``gpu_busy``: also what the GPUs did (one join to the records:
    UsageRecord.gpu_busy_fraction) — the GPU-seconds monitored, the busy ones among them and the cost
    of the idle ones."""
    decimal = DecimalField(max_digits=30, decimal_places=6)
    overlap = _Seconds(Greatest("slice_start", Value(start_at)), Least("slice_end", Value(end_at)))
    fraction = ExpressionWrapper(overlap / _Seconds(F("slice_start"), F("slice_end")), output_field=decimal)
    inside = Q(slice_start__gte=start_at, slice_end__lte=end_at)  # most slices: no arithmetic needed

    def part(column: str, prorated):
        return Sum(Case(When(inside, then=F(column)), default=prorated, output_field=decimal))

    used = ExpressionWrapper(F("gpus") * overlap, output_field=decimal)
    extra = {}
    if gpu_busy:
        busy = F("record__gpu_busy_fraction")
        monitored = Q(record__gpu_busy_fraction__isnull=False)
        seconds = Case(When(inside, then=F("gpu_seconds")), default=used, output_field=decimal)
        cost = Case(When(inside, then=F("cost")), default=ExpressionWrapper(F("cost") * fraction, output_field=decimal), output_field=decimal)
        extra = {
            "sum_monitored_gpu_seconds": Sum(seconds, filter=monitored),
            "sum_busy_gpu_seconds": Sum(ExpressionWrapper(seconds * busy, output_field=decimal), filter=monitored),
            "sum_idle_cost": Sum(ExpressionWrapper(cost * (Value(1) - busy), output_field=decimal), filter=monitored),
        }
    return (
        queryset.values(*columns)
        .annotate(**extra)
        .annotate(
            sum_gpu_seconds=part("gpu_seconds", used),
            sum_requested_gpu_seconds=part("requested_gpu_seconds", ExpressionWrapper(F("requested_gpu_seconds") * fraction, output_field=decimal)),
            sum_cost=part("cost", ExpressionWrapper(F("cost") * fraction, output_field=decimal)),
            sum_unpriced_gpu_seconds=Sum(
                Case(When(rate__isnull=True, then=Case(When(inside, then=F("gpu_seconds")), default=used, output_field=decimal)),
                     default=Value(0), output_field=decimal)
            ),  # fmt: skip
            any_provisional=Max(Cast("provisional", IntegerField())),
        )
        .order_by(*columns)
    )


_SUMS = ("sum_gpu_seconds", "sum_requested_gpu_seconds", "sum_cost", "sum_unpriced_gpu_seconds",
         "sum_monitored_gpu_seconds", "sum_busy_gpu_seconds", "sum_idle_cost")  # fmt: skip


def usage_aggregate(
    start_at: dt.datetime, end_at: dt.datetime, columns: Sequence[str], *, team: Team | None = None, cluster: str = "",
    gpu_busy: bool = False, labels: dict | None = None,
) -> list[dict]:
    """Usage in [start_at, end_at) grouped by ``columns`` (aggregate_slices' names and meaning): the
    whole closed months of the range from their totals (accounting.selectors.usage_totals, written by
    accounting.services.usage_rollup), the rest from the slices, the two added exactly per group.
    Two queries at most (the totals, the slices; which months are rolled is a snapshot); ``labels``: more
    aggregates over the team (``Max("team__name")``) that both tables answer."""
    months = rolled_months(start_at, end_at)
    slices = slices_in(start_at, end_at).exclude(period__in=months) if months else slices_in(start_at, end_at)
    totals = totals_of(months) if months else None
    if team is not None:
        slices = slices.filter(team=team)
        totals = totals.filter(team=team) if totals is not None else None
    if cluster:
        slices = slices.filter(cluster=cluster)
        totals = totals.filter(cluster=cluster) if totals is not None else None
    parts = []
    if totals is not None:
        parts.append(list(aggregate_totals(totals, columns, gpu_busy=gpu_busy).annotate(**(labels or {}))))
    if not months or _open_part(start_at, end_at, months):
        parts.append(list(aggregate_slices(slices, start_at, end_at, columns, gpu_busy=gpu_busy).annotate(**(labels or {}))))
    if len(parts) == 1:
        return parts[0]
    merged: dict[tuple, dict] = {}
    for values in (v for part in parts for v in part):
        key = tuple(values[c] for c in columns)
        row = merged.get(key)
        if row is None:
            merged[key] = dict(values)
            continue
        for name in _SUMS:
            if name in values:
                row[name] = (row.get(name) or 0) + (values[name] or 0)
        row["any_provisional"] = max(row["any_provisional"] or 0, values["any_provisional"] or 0)
        for name in labels or {}:
            row[name] = row.get(name) or values.get(name)
    # the database sorts text by code point (C collation): Python's order of str and dates is the same
    return [merged[key] for key in sorted(merged)]


def _open_part(start_at: dt.datetime, end_at: dt.datetime, months: list[dt.date]) -> bool:
    """Whether [start_at, end_at) holds time outside the rolled months (so slices are to be read)."""
    covered = sum(((billing_midnight(next_month(m)) - billing_midnight(m)) for m in months), dt.timedelta(0))
    return covered < end_at - start_at


def _hours(seconds) -> Decimal:
    return money.display(money.gpu_hours(seconds or 0))


def _row(group_by: str, key, values: dict) -> dict:
    used = Decimal(values["sum_gpu_seconds"] or 0)
    requested = Decimal(values["sum_requested_gpu_seconds"] or 0)
    if group_by == "month":
        key = key.strftime("%Y-%m")
    return {
        "group_by": group_by,
        "key": key if key is not None else "",
        "label": values.get("label") or (key if key not in (None, "") else "(none)"),
        "gpu_hours": _hours(used),
        "requested_gpu_hours": _hours(requested),
        "efficiency": float((used / requested).quantize(Decimal("0.0001"))) if requested else None,
        "cost": money.display(values["sum_cost"] or 0),
        "unpriced_gpu_hours": _hours(values["sum_unpriced_gpu_seconds"]),
        "provisional": bool(values["any_provisional"]),
        "currency": settings.DEFAULT_CURRENCY,
    } | _gpu_busy_columns(values)


def _gpu_busy_columns(values: dict) -> dict:
    """What the GPUs did, beside what was paid (aggregate_slices(gpu_busy=True)): GPU-hours monitored,
    busy GPU-hours (utilisation-weighted), GPU efficiency = busy / monitored, cost of the idle
    GPU-hours. None where nothing was monitored."""
    if "sum_monitored_gpu_seconds" not in values:  # a row of bookings only
        return {"monitored_gpu_hours": None, "busy_gpu_hours": None, "gpu_efficiency": None, "idle_cost": None}
    monitored = Decimal(values.get("sum_monitored_gpu_seconds") or 0)
    busy = Decimal(values.get("sum_busy_gpu_seconds") or 0)
    return {
        "monitored_gpu_hours": _hours(monitored),
        "busy_gpu_hours": _hours(busy) if monitored else None,
        "gpu_efficiency": float((busy / monitored).quantize(Decimal("0.0001"))) if monitored else None,
        "idle_cost": money.display(values.get("sum_idle_cost") or 0) if monitored else None,
    }


def cost_report(
    *, start: dt.date | None = None, end: dt.date | None = None, group_by: str, team: Team | None = None,
    cluster: str = "", start_at: dt.datetime | None = None, end_at: dt.datetime | None = None,
    bookings: list[dict] | None = None,
) -> list[dict]:
    """GPU-hours used and requested, efficiency and cost between ``start`` and ``end`` (inclusive days,
    billing time zone) — or any range [``start_at``, ``end_at``) of aware datetimes (one hour: usage
    is prorated to the second within a slice) — grouped by team (Slurm account), user (cluster user
    name), gpu_type, month or cluster: whole closed months from their totals, the rest from the
    slices (``usage_aggregate``). ``team`` narrows to one team (its usage page), ``cluster`` to one
    cluster's usage and bookings; ``bookings``: booking_charges of the same range and team, read once
    by a caller that asks for several groupings (not for "month"). Callers check ``can_read_cost_reports`` (or team membership) first."""
    if group_by not in GROUP_BY_CHOICES:
        raise ValueError(f"group_by must be one of {GROUP_BY_CHOICES}")
    if start_at is None or end_at is None:
        start_at, end_at = range_bounds(start, end)
    column = _GROUP_COLUMNS[group_by]
    labels = {"label": Max("team__name"), "team_slug": Max("team__slug")} if group_by == "team" else {}
    result = []
    for values in usage_aggregate(start_at, end_at, [column], team=team, cluster=cluster, gpu_busy=True, labels=labels):
        row = _row(group_by, values[column], values)
        if group_by == "team":
            row["team_slug"] = values["team_slug"] or ""
            row["label"] = values["label"] or f"{values[column]} (no team)"
        result.append(row)
    return _with_booking_charges(result, group_by=group_by, start_at=start_at, end_at=end_at, team=team, cluster=cluster,
                                 bookings=bookings)  # fmt: skip


def _with_booking_charges(
    rows: list[dict], *, group_by: str, start_at: dt.datetime, end_at: dt.datetime, team: Team | None, cluster: str = "",
    bookings: list[dict] | None = None,
) -> list[dict]:
    """Add what bookings are charged (accounting.selectors.booking_charges) to cost report rows:
    ``usage_cost`` is the usage alone, ``bookings_cost`` the bookings', ``cost`` their sum (so totals =
    usage outside bookings + bookings, usage inside bookings being free in charge mode "reserved").
    By user, bookings (a team's, not a user's) get one row of their own."""
    for row in rows:
        row["usage_cost"] = row["cost"]
        row["bookings_cost"] = Decimal("0.00")
    if group_by == "month":
        pieces = [(month, line) for month, line in booking_charges_by_month(start_at=start_at, end_at=end_at, team=team)
                  if not cluster or line["cluster"] == cluster]  # fmt: skip
    else:
        key_of = {"team": lambda line: line["team"].slurm_account, "gpu_type": lambda line: line["gpu_type"],
                  "user": lambda line: "", "cluster": lambda line: line["cluster"]}[group_by]  # fmt: skip
        if bookings is None:
            bookings = booking_charges(start_at=start_at, end_at=end_at, team=team)
        pieces = [(key_of(line), line) for line in bookings if not cluster or line["cluster"] == cluster]
    by_key = {row["key"]: row for row in rows} if group_by != "user" else {}
    for key, line in pieces:
        row = by_key.get(key)
        if row is None:
            label = {"team": line["team"].name, "user": "(bookings of teams)"}.get(group_by, key)
            row = _row(group_by if group_by != "month" else "_", key, {
                "sum_gpu_seconds": 0, "sum_requested_gpu_seconds": 0, "sum_cost": 0, "sum_unpriced_gpu_seconds": 0,
                "any_provisional": 0, "label": label})  # fmt: skip
            row.update(group_by=group_by, usage_cost=row["cost"], bookings_cost=Decimal("0.00"))
            if group_by == "team":
                row["team_slug"] = line["team"].slug
            by_key[key] = row
            rows.append(row)
        row["bookings_cost"] += line["cost"]
        row["cost"] += line["cost"]
    if group_by == "user":
        return rows
    return sorted(rows, key=lambda r: str(r["key"]))


def usage_by_team_and_month(*, start_at: dt.datetime, end_at: dt.datetime) -> list[dict]:
    """GPU-hours and cost per (account, month) in [start_at, end_at) (prorated to the second, as
    ``cost_report``): the stacked chart. One aggregate query."""
    rows = usage_aggregate(start_at, end_at, ["account", "period"])
    return [
        {"account": v["account"], "month": v["period"].strftime("%Y-%m"), "gpu_hours": _hours(v["sum_gpu_seconds"]),
         "cost": money.display(v["sum_cost"] or 0)}
        for v in rows
    ]  # fmt: skip


@dataclass(frozen=True)
class TaskUsage:
    """One Slurm job's (an array task's) usage: exact GPU-seconds and cost."""

    gpu_seconds: int
    cost: Decimal

    @property
    def gpu_hours(self) -> Decimal:
        return money.gpu_hours(self.gpu_seconds)


@dataclass(frozen=True)
class JobUsage:
    """What a portal job has really used so far, from accounting (its usage records and their
    priced slices): exact GPU-seconds, cost (six places; round for display), whether every record is
    final, and per Slurm job id (an array: each task's own id) the same figures."""

    gpu_seconds: int
    cost: Decimal
    currency: str
    final: bool
    tasks: dict[int, TaskUsage]  # Slurm job id (an array task's own) -> its usage

    @property
    def gpu_hours(self) -> Decimal:
        return money.gpu_hours(self.gpu_seconds)


def jobs_usage(job_uuids) -> dict:
    """{portal job uuid: JobUsage} for the jobs that have usage records (the others: absent). One
    aggregate query (index usagerecord_portal_job), whatever the number of jobs."""
    wanted = list(job_uuids)
    if not wanted:
        return {}
    rows = (
        UsageRecord.objects.filter(portal_job_uuid__in=wanted)
        .values("pk", "portal_job_uuid", "job_id", "gpu_seconds", "provisional")
        .annotate(cost=Sum("slices__cost"))
        .order_by()
    )
    parts: dict = {}
    for row in rows:
        parts.setdefault(row["portal_job_uuid"], []).append(row)
    out = {}
    for job_uuid, records in parts.items():
        tasks: dict[int, TaskUsage] = {}
        for row in records:  # a requeued job: several records of one id
            old = tasks.get(row["job_id"], TaskUsage(0, Decimal(0)))
            tasks[row["job_id"]] = TaskUsage(old.gpu_seconds + int(row["gpu_seconds"]), old.cost + Decimal(row["cost"] or 0))
        out[job_uuid] = JobUsage(
            gpu_seconds=sum(t.gpu_seconds for t in tasks.values()), cost=sum((t.cost for t in tasks.values()), Decimal(0)),
            currency=settings.DEFAULT_CURRENCY, final=not any(row["provisional"] for row in records), tasks=tasks,
        )  # fmt: skip
    return out


def account_gpu_seconds(*, start_at: dt.datetime, end_at: dt.datetime, cluster: str | None = None) -> dict[str, Decimal]:
    """GPU-seconds per Slurm account in [start_at, end_at), of one cluster or all (reconciliation with
    that cluster's sreport)."""
    slices = slices_in(start_at, end_at)
    if cluster is not None:
        slices = slices.filter(cluster=cluster)
    rows = aggregate_slices(slices, start_at, end_at, ["account"])
    return {v["account"]: Decimal(v["sum_gpu_seconds"] or 0) for v in rows}


def usage_teams_visible_to(user) -> QuerySet[Team]:
    """Teams whose usage the user may read: the same rule as the teams pages."""
    return teams_visible_to(user)


def can_see_user_breakdown(user, team: Team) -> bool:
    return can_read_cost_reports(user) or is_manager(user, team)


def can_read_invoice(user, team: Team) -> bool:
    """Admins, finance and the team's managers (members see their team's totals on the usage page)."""
    return can_read_cost_reports(user) or is_manager(user, team)


def invoice_lines(*, team: Team, month: dt.date) -> QuerySet[UsageSlice]:
    """The team's slices in one month, with their records: one query (index usageslice_team_period)."""
    return (
        UsageSlice.objects.filter(team=team, period=month_start(month))
        .select_related("record")
        .order_by("slice_start", "record__job_id")
    )


INVOICE_GROUP = ("unix_user", "gpu_type", "price_per_gpu_hour")


def invoice_groups(*, team: Team, month: dt.date) -> list[dict]:
    """The team's usage in one month per user × GPU type × rate: slices, GPU-seconds, cost, the
    monitored and busy GPU-seconds and the idle GPU-hours' cost (exact sums) and whether any is
    provisional. One query: on the month's totals when it is
    closed and rolled (accounting.services.usage_rollup), on its slices otherwise."""
    period = month_start(month)
    if month_rolled(period):
        rows = aggregate_totals(UsageMonthTotal.objects.filter(team=team, period=period), INVOICE_GROUP, gpu_busy=True)
    else:
        start_at, end_at = billing_midnight(period), billing_midnight(next_month(period))
        rows = aggregate_slices(UsageSlice.objects.filter(team=team, period=period), start_at, end_at, INVOICE_GROUP, gpu_busy=True)
        rows = rows.annotate(slices=Count("id"))
    return list(rows)


def invoice_job_rows(*, team: Team, month: dt.date):
    """The team's slices in one month as plain values for the per-job CSV (one query, streamed)."""
    return (
        UsageSlice.objects.filter(team=team, period=month_start(month))
        .order_by("slice_start", "record__job_id")
        .values_list("record__job_id", "record__name", "unix_user", "partition", "record__state", "gpu_type", "gpus",
                     "slice_start", "slice_end", "gpu_seconds", "price_per_gpu_hour", "cost", "provisional",
                     "record__portal_job_uuid")  # fmt: skip
        .iterator(chunk_size=5000)
    )


def usage_records_of_team(team: Team) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(team=team)


def usage_final_job_ids(*, cluster: str, job_ids) -> set[int]:
    """Which of these scheduler job ids on ``cluster`` have a final (not provisional) usage record:
    what the portal will not read again (the Kubernetes sync deletes such a finished Job). One query."""
    return set(UsageRecord.objects.filter(cluster=cluster, job_id__in=list(job_ids), provisional=False)
               .values_list("job_id", flat=True))  # fmt: skip
