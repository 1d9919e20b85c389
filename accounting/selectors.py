"""Reads for accounting: prices, usage and cost reports."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Sequence
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db.models import (
    Case,
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
from django.utils import timezone

from accounting.models import Rate, UsageRecord, UsageSlice
from portal.models import Team
from portal.roles import can_read_cost_reports, is_manager
from portal.selectors import teams_visible_to

HOUR = Decimal(3600)


def billing_zone() -> zoneinfo.ZoneInfo:
    """The time zone of calendar months and of rates' effective dates: settings.TIME_ZONE (UTC by
    default). Invoices, month slices, rate changes and the sreport reconciliation all use it."""
    return zoneinfo.ZoneInfo(settings.TIME_ZONE)


def billing_date(at: dt.datetime) -> dt.date:
    if timezone.is_naive(at):
        raise ValueError("an aware datetime is needed")
    return at.astimezone(billing_zone()).date()


def billing_midnight(day: dt.date) -> dt.datetime:
    """00:00 of ``day`` in the billing time zone, as an aware datetime."""
    return dt.datetime(day.year, day.month, day.day, tzinfo=billing_zone())


def gpu_hour_price(*, gpu_type: str, partition: str = "", at: dt.datetime) -> tuple[Decimal, str] | None:
    """The price of one GPU-hour of ``gpu_type`` on ``partition`` in force at ``at`` (aware datetime;
    rates take effect at 00:00 (billing time zone) of their ``effective_from`` day), as (price, currency), or None when
    no rate applies. A partition-specific rate in force wins over the generic (partition "") one, even
    if the generic one is newer. One query."""
    day = billing_date(at)
    partitions = [""] + ([partition] if partition else [])
    rows = (
        Rate.objects.filter(gpu_type=gpu_type, partition__in=partitions, effective_from__lte=day)
        .order_by("-effective_from")
        .values_list("partition", "price_per_gpu_hour", "currency")
    )
    generic = None
    for row_partition, price, currency in rows:
        if row_partition and row_partition == partition:
            return price, currency
        if generic is None and not row_partition:
            generic = (price, currency)
            if not partition:
                return generic
    return generic


# ---------------------------------------------------------------- periods


def month_start(day: dt.date) -> dt.date:
    return day.replace(day=1)


def next_month(day: dt.date) -> dt.date:
    return dt.date(day.year + (day.month == 12), day.month % 12 + 1, 1)


def range_bounds(start: dt.date, end: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """[00:00 of start, 00:00 of the day after end) in the billing time zone: ``end`` is inclusive."""
    return billing_midnight(start), billing_midnight(end + dt.timedelta(days=1))


# ---------------------------------------------------------------- cost report

GROUP_BY_CHOICES = ("team", "user", "gpu_type", "month")
_GROUP_COLUMNS = {"team": "account", "user": "unix_user", "gpu_type": "gpu_type", "month": "period"}


class _Seconds(Func):
    """Seconds from the first datetime expression to the second (PostgreSQL; SQLite for the demo)."""

    arity = 2
    output_field = DecimalField(max_digits=24, decimal_places=6)

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = self._args_sql(compiler, connection)
        return f"EXTRACT(EPOCH FROM ({sql[1]} - {sql[0]}))", params[1] + params[0]

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = self._args_sql(compiler, connection)
        return f"((julianday({sql[1]}) - julianday({sql[0]})) * 86400.0)", params[1] + params[0]

    def _args_sql(self, compiler, connection):
        compiled = [compiler.compile(expr) for expr in self.get_source_expressions()]
        return [c[0] for c in compiled], [list(c[1]) for c in compiled]


def _slices_in(start_at: dt.datetime, end_at: dt.datetime) -> QuerySet[UsageSlice]:
    last_day = (end_at - dt.timedelta(microseconds=1)).astimezone(billing_zone()).date()
    first_day = start_at.astimezone(billing_zone()).date()
    return UsageSlice.objects.filter(
        period__gte=month_start(first_day),
        period__lte=month_start(last_day),
        slice_start__lt=end_at,
        slice_end__gt=start_at,
    )


def _aggregate(queryset: QuerySet[UsageSlice], start_at: dt.datetime, end_at: dt.datetime, columns: Sequence[str]):
    """One GROUP BY over slices; a slice cut by the range counts in proportion (exact: GPU count and
    price are constant within a slice)."""
    decimal = DecimalField(max_digits=30, decimal_places=6)
    overlap = _Seconds(Greatest("slice_start", Value(start_at)), Least("slice_end", Value(end_at)))
    fraction = ExpressionWrapper(overlap / _Seconds(F("slice_start"), F("slice_end")), output_field=decimal)
    inside = Q(slice_start__gte=start_at, slice_end__lte=end_at)  # most slices: no arithmetic needed

    def part(column: str, prorated):
        return Sum(Case(When(inside, then=F(column)), default=prorated, output_field=decimal))

    used = ExpressionWrapper(F("gpus") * overlap, output_field=decimal)
    return (
        queryset.values(*columns)
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


def _hours(seconds) -> Decimal:
    return (Decimal(seconds or 0) / HOUR).quantize(Decimal("0.01"), ROUND_HALF_UP)


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
        "cost": Decimal(values["sum_cost"] or 0).quantize(Decimal("0.01"), ROUND_HALF_UP),
        "unpriced_gpu_hours": _hours(values["sum_unpriced_gpu_seconds"]),
        "provisional": bool(values["any_provisional"]),
        "currency": settings.DEFAULT_CURRENCY,
    }


def cost_report(*, start: dt.date, end: dt.date, group_by: str, team: Team | None = None) -> list[dict]:
    """GPU-hours used and requested, efficiency and cost between ``start`` and ``end`` (inclusive days,
    billing time zone), grouped by team (Slurm account), user (cluster user name), gpu_type or month.
    One aggregate query on UsageSlice (index usageslice_report). ``team`` narrows to one team (its
    usage page). Callers check ``can_read_cost_reports`` (or team membership) first."""
    if group_by not in GROUP_BY_CHOICES:
        raise ValueError(f"group_by must be one of {GROUP_BY_CHOICES}")
    start_at, end_at = range_bounds(start, end)
    queryset = _slices_in(start_at, end_at)
    if team is not None:
        queryset = queryset.filter(team=team)
    column = _GROUP_COLUMNS[group_by]
    rows = _aggregate(queryset, start_at, end_at, [column])
    if group_by == "team":
        rows = rows.annotate(label=Max("team__name"), team_slug=Max("team__slug"))
    result = []
    for values in rows:
        row = _row(group_by, values[column], values)
        if group_by == "team":
            row["team_slug"] = values["team_slug"] or ""
            row["label"] = values["label"] or f"{values[column]} (no team)"
        result.append(row)
    return _with_booking_charges(result, group_by=group_by, start=start, end=end, team=team)


def _with_booking_charges(rows: list[dict], *, group_by: str, start: dt.date, end: dt.date, team: Team | None) -> list[dict]:
    """Add what bookings are charged (accounting.selectors.booking_charges) to cost report rows:
    ``usage_cost`` is the usage alone, ``bookings_cost`` the bookings', ``cost`` their sum (so totals =
    usage outside bookings + bookings, usage inside bookings being free in charge mode "reserved").
    By user, bookings (a team's, not a user's) get one row of their own."""
    for row in rows:
        row["usage_cost"] = row["cost"]
        row["bookings_cost"] = Decimal("0.00")
    start_at, end_at = range_bounds(start, end)
    if group_by == "month":
        pieces, month = [], month_start(start)
        while month <= end:
            lo, hi = max(billing_midnight(month), start_at), min(billing_midnight(next_month(month)), end_at)
            pieces += [(month.strftime("%Y-%m"), line) for line in booking_charges(start_at=lo, end_at=hi, team=team)]
            month = next_month(month)
    else:
        key_of = {"team": lambda line: line["team"].slurm_account, "gpu_type": lambda line: line["gpu_type"],
                  "user": lambda line: ""}[group_by]  # fmt: skip
        pieces = [(key_of(line), line) for line in booking_charges(start_at=start_at, end_at=end_at, team=team)]
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


def usage_by_team_and_month(*, start: dt.date, end: dt.date) -> list[dict]:
    """GPU-hours and cost per (account, month): the stacked chart. One aggregate query."""
    start_at, end_at = range_bounds(start, end)
    rows = _aggregate(_slices_in(start_at, end_at), start_at, end_at, ["account", "period"])
    return [
        {"account": v["account"], "month": v["period"].strftime("%Y-%m"), "gpu_hours": _hours(v["sum_gpu_seconds"]),
         "cost": Decimal(v["sum_cost"] or 0).quantize(Decimal("0.01"))}
        for v in rows
    ]  # fmt: skip


def account_gpu_seconds(*, start_at: dt.datetime, end_at: dt.datetime) -> dict[str, Decimal]:
    """GPU-seconds per Slurm account in [start_at, end_at) (reconciliation with sreport)."""
    rows = _aggregate(_slices_in(start_at, end_at), start_at, end_at, ["account"])
    return {v["account"]: Decimal(v["sum_gpu_seconds"] or 0) for v in rows}


# ---------------------------------------------------------------- team usage and invoices


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


def jobs_by_uuid(uuids: Iterable) -> dict:
    """Portal jobs (jobs.Job) by pk for usage records tagged gpuportal:<uuid>; {} when the jobs app
    has no Job model yet. One query."""
    from django.apps import apps

    wanted = {u for u in uuids if u}
    if not wanted:
        return {}
    try:
        job_model = apps.get_model("jobs", "Job")
    except LookupError:
        return {}
    return {job.pk: job for job in job_model.objects.filter(pk__in=wanted)}


def rates_current(*, at: dt.datetime | None = None) -> list[Rate]:
    """The rate in force now for every (gpu_type, partition), plus scheduled future ones. One query."""
    today = billing_date(at or timezone.now())
    current: dict[tuple[str, str], Rate] = {}
    upcoming: list[Rate] = []
    for rate in Rate.objects.order_by("gpu_type", "partition", "-effective_from"):
        key = (rate.gpu_type, rate.partition)
        if rate.effective_from > today:
            upcoming.append(rate)
        elif key not in current:
            current[key] = rate
    return sorted(current.values(), key=lambda r: (r.gpu_type, r.partition)) + sorted(
        upcoming, key=lambda r: (r.effective_from, r.gpu_type)
    )


def usage_records_of_team(team: Team) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(team=team)


# ---------------------------------------------------------------- bookings


def _booking_model():
    from accounting.models import Booking

    return Booking


def bookings_holding_capacity(*, start: dt.datetime, end: dt.datetime, gpu_type: str | None = None, team: Team | None = None):
    """Bookings that held (or hold) capacity during part of [start, end): approved ones, and the part
    before cancellation of approved bookings cancelled after they started. One query; evaluate
    ``held_until`` on each row for the exact end."""
    from accounting.models import BookingStatus

    queryset = _booking_model().objects.filter(
        status__in=[BookingStatus.APPROVED, BookingStatus.CANCELLED],
        approved_at__isnull=False,
        start__lt=end,
        end__gt=start,
    )
    if gpu_type:
        queryset = queryset.filter(gpu_type=gpu_type)
    if team is not None:
        queryset = queryset.filter(team=team)
    return queryset


def booked_gpu_hours(*, team: Team, start: dt.datetime, end: dt.datetime, gpu_type: str | None = None) -> Decimal:
    """GPU-hours the team's approved bookings reserve within [start, end) (aware datetimes), each
    booking's window clipped to the range. Counted from the moment a booking is approved (upcoming,
    active and ended bookings alike); requested, rejected and cancelled-before-start bookings count
    nothing; a booking cancelled while active counts up to its cancellation. ``gpu_type`` narrows to
    one type. One query. Exact to the second (not rounded)."""
    if timezone.is_naive(start) or timezone.is_naive(end):
        raise ValueError("aware datetimes are needed")
    if end <= start:
        return Decimal("0")
    seconds = 0
    for booking in bookings_holding_capacity(start=start, end=end, gpu_type=gpu_type, team=team).only(
        "gpus", "start", "end", "status", "approved_at", "cancelled_at"
    ):
        held_until = booking.held_until
        if held_until is None:
            continue
        lo, hi = max(booking.start, start), min(held_until, end)
        if hi > lo:
            seconds += booking.gpus * int((hi - lo).total_seconds())
    return Decimal(seconds) / HOUR


# ---------------------------------------------------------------- quotas and budgets


def quotas_visible_to(user) -> QuerySet:
    """Quotas of the teams the user may see (members: their teams'; admins and finance: all)."""
    from accounting.models import Quota

    return Quota.objects.filter(team__in=teams_visible_to(user)).select_related("team", "requested_by", "decided_by")


def quota_period_bounds(quota) -> tuple[dt.datetime, dt.datetime]:
    """[00:00 of period_start, 00:00 of period_end) in the billing time zone."""
    return billing_midnight(quota.period_start), billing_midnight(quota.period_end)


def current_month(at: dt.datetime | None = None) -> tuple[dt.date, dt.date]:
    """The calendar month (billing time zone) containing ``at``: (first day, first day of the next)."""
    first = month_start(billing_date(at or timezone.now()))
    return first, next_month(first)


def quotas_effective(*, team: Team | None = None, at: dt.datetime | None = None) -> dict:
    """The approved quota in force at ``at`` per (team id, gpu_type) — the most recently approved one
    whose period contains that day (effective-dated: a newer approval wins). One query (index
    quota_team_state_start)."""
    from accounting.models import Quota, QuotaState

    day = billing_date(at or timezone.now())
    queryset = Quota.objects.filter(state=QuotaState.APPROVED, period_start__lte=day, period_end__gt=day)
    if team is not None:
        queryset = queryset.filter(team=team)
    effective: dict[tuple[int, str], object] = {}
    for quota in queryset.select_related("team").order_by("-approved_at", "-pk"):
        effective.setdefault((quota.team_id, quota.gpu_type), quota)
    return effective


def _charge_reserved() -> bool:
    """Bookings charge their reserved hours (usage inside them is then free) unless BOOKING_CHARGE_MODE=used."""
    return getattr(settings, "BOOKING_CHARGE_MODE", "reserved") == "reserved"


def _record_has_booking() -> bool:
    return any(f.name == "booking" for f in UsageRecord._meta.get_fields())


def _used_seconds(accounts: Iterable[str], start_at: dt.datetime, end_at: dt.datetime) -> dict[tuple[str, str], Decimal]:
    """GPU-seconds per (account, gpu_type) in [start_at, end_at), usage inside bookings excluded when
    bookings are charged by their reserved hours. One aggregate query."""
    queryset = _slices_in(start_at, end_at).filter(account__in=list(accounts))
    if _charge_reserved() and _record_has_booking():
        queryset = queryset.filter(record__booking__isnull=True)
    rows = _aggregate(queryset, start_at, end_at, ["account", "gpu_type"])
    return {(v["account"], v["gpu_type"]): Decimal(v["sum_gpu_seconds"] or 0) for v in rows}


def _booked_hours_bulk(start_at: dt.datetime, end_at: dt.datetime, teams: list[Team]) -> dict[tuple[int, str], Decimal]:
    """GPU-hours booked per (team id, gpu_type) within [start_at, end_at). One query when the bookings
    selector ``bookings_holding_capacity`` exists, one ``booked_gpu_hours`` per team otherwise; {} when
    bookings are not charged by reserved hours or do not exist."""
    if not _charge_reserved():
        return {}
    bulk = globals().get("bookings_holding_capacity")
    booked: dict[tuple[int, str], Decimal] = {}
    if bulk is not None:
        seconds: dict[tuple[int, str], int] = {}
        for booking in bulk(start=start_at, end=end_at).filter(team__in=teams):
            held_until = booking.held_until
            if held_until is None:
                continue
            lo, hi = max(booking.start, start_at), min(held_until, end_at)
            if hi > lo:
                key = (booking.team_id, booking.gpu_type)
                seconds[key] = seconds.get(key, 0) + booking.gpus * int((hi - lo).total_seconds())
        return {key: Decimal(value) / HOUR for key, value in seconds.items()}
    single = globals().get("booked_gpu_hours")
    if single is not None:
        for team in teams:
            booked[(team.pk, "")] = Decimal(single(team=team, start=start_at, end=end_at) or 0)
    return booked


def _held_hours(team_ids: Iterable[int], since: dt.datetime) -> dict[tuple[int, str], Decimal]:
    """GPU-hours held per (team id, job gpu_type): for every job not yet accounted — live (ACCEPTED,
    PENDING, RUNNING, …) or ended after ``since`` having started but without a final (non-provisional)
    usage record yet (``accounted_at`` unset: the ingestion sets it) — its estimate minus what has
    been ingested for it so far (never below 0). Jobs inside a booking hold nothing when bookings are
    charged by reserved hours. One query, on two partial indexes (live jobs; ran but unaccounted), so
    its cost follows the jobs in flight, not the team's history: it runs under the team lock of every
    submission."""
    from django.apps import apps
    from django.db.models import OuterRef, Subquery
    from django.db.models.functions import Coalesce

    from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState

    job_model = apps.get_model("jobs", "Job")
    ingested = (
        UsageRecord.objects.filter(portal_job_uuid=OuterRef("pk"))
        .values("portal_job_uuid")
        .annotate(total=Sum("gpu_hours"))
        .values("total")
    )
    ended = TERMINAL_STATES - {JobState.SUBMIT_FAILED}
    queryset = job_model.objects.filter(team_id__in=list(team_ids)).filter(
        Q(state__in=LIVE_STATES) | Q(state__in=ended, started_at__isnull=False, accounted_at__isnull=True, ended_at__gte=since)
    )
    if _charge_reserved():
        queryset = queryset.filter(booking_id__isnull=True)
    decimal = DecimalField(max_digits=16, decimal_places=6)
    hold = Greatest(
        ExpressionWrapper(F("estimated_gpu_hours") - Coalesce(Subquery(ingested, output_field=decimal), Value(Decimal(0)), output_field=decimal), output_field=decimal),
        Value(Decimal(0)),
        output_field=decimal,
    )
    rows = queryset.annotate(hold=hold).values("team_id", "gpu_type").annotate(total=Sum("hold")).order_by()
    return {(r["team_id"], r["gpu_type"]): Decimal(r["total"] or 0) for r in rows}


def _two(value: Decimal) -> Decimal:
    return Decimal(value).quantize(Decimal("0.01"), ROUND_HALF_UP)


def budget_rows(quotas: list, *, at: dt.datetime | None = None, with_held: bool = True) -> list[dict]:
    """Budget figures of approved quotas (any teams): budget, used, held, booked, remaining, consumed
    (used + booked) and the day the budget runs out at the current burn rate. Queries per distinct
    period (usually one): used, held, booked — constant in the number of teams and jobs.

    used: accounted GPU-hours in the period (the team's account; the quota's GPU type, or all types);
    held: estimates of jobs not yet accounted (see _held_hours; per type: jobs that asked for it);
    booked: approved bookings' reserved GPU-hours in the period."""
    now = at or timezone.now()
    periods: dict[tuple[dt.date, dt.date], list] = {}
    for quota in quotas:
        periods.setdefault((quota.period_start, quota.period_end), []).append(quota)
    rows = []
    for (start, end), group in periods.items():
        start_at, end_at = billing_midnight(start), billing_midnight(end)
        teams = list({q.team_id: q.team for q in group}.values())
        used = _used_seconds({t.slurm_account for t in teams}, start_at, end_at)
        held = _held_hours([t.pk for t in teams], start_at) if with_held else {}
        booked = _booked_hours_bulk(start_at, end_at, teams)
        for quota in group:
            account, kind = quota.team.slurm_account, quota.gpu_type
            used_s = sum((v for (a, t), v in used.items() if a == account and (not kind or t == kind)), Decimal(0))
            held_h = sum((v for (team_id, t), v in held.items() if team_id == quota.team_id and (not kind or t == kind)), Decimal(0))
            booked_h = sum((v for (team_id, t), v in booked.items() if team_id == quota.team_id and (not kind or t == kind)), Decimal(0))
            used_h = used_s / HOUR
            budget = Decimal(quota.gpu_hours)
            remaining = budget - used_h - held_h - booked_h
            elapsed = max((min(now, end_at) - start_at).total_seconds(), 0) / 86400
            runs_out = None
            if remaining <= 0:
                runs_out = min(billing_date(now), end - dt.timedelta(days=1))
            elif elapsed > 0 and used_h > 0 and now < end_at:
                days_left = remaining / (used_h / Decimal(elapsed))
                # only a date inside the period (a large budget at a slow burn would overflow datetime)
                if days_left < Decimal((end_at - now).total_seconds()) / 86400:
                    runs_out = billing_date(now + dt.timedelta(days=float(days_left)))
            rows.append(
                {
                    "quota": quota,
                    "team": quota.team,
                    "gpu_type": kind,
                    "period_start": start,
                    "period_end": end,
                    "period_label": quota.period_label,
                    "budget": _two(budget),
                    "used": _two(used_h),
                    "held": _two(held_h),
                    "booked": _two(booked_h),
                    "remaining": _two(remaining),
                    "consumed": used_h + booked_h,  # exact: alerts compare it with the budget
                    "max_gpus": quota.max_gpus,
                    "runs_out_on": runs_out,
                }
            )
    return rows


def team_budget(*, team: Team, at: dt.datetime | None = None) -> list[dict]:
    """The team's budget rows for the quotas in force at ``at`` (any-type first, then per type)."""
    quotas = sorted(quotas_effective(team=team, at=at).values(), key=lambda q: q.gpu_type)
    return budget_rows(quotas, at=at)


def team_budget_ratios() -> list[tuple[str, str, float]]:
    """(team slug, gpu_type, consumed / budget) for every quota in force now — consumed = used +
    booked, as for alerts (held work is not consumption yet). gpu_type "" = any type. For
    /metrics: a constant number of queries (one per distinct period)."""
    rows = budget_rows(list(quotas_effective().values()), with_held=False)
    return [
        (row["team"].slug, row["gpu_type"], float(row["consumed"] / row["budget"]) if row["budget"] else 0.0)
        for row in sorted(rows, key=lambda r: (r["team"].slug, r["gpu_type"]))
    ]


def budget_burndown(*, quota, at: dt.datetime | None = None) -> dict:
    """The burn-down chart of one quota: for each day of the period up to today, the GPU-hours left at
    the end of that day (budget − accounted usage so far), and the ideal straight line from the budget
    to 0. One query (the team's slices in the period, spread over days in Python)."""
    now = at or timezone.now()
    start_at, end_at = quota_period_bounds(quota)
    days = (quota.period_end - quota.period_start).days
    queryset = _slices_in(start_at, end_at).filter(account=quota.team.slurm_account)
    if quota.gpu_type:
        queryset = queryset.filter(gpu_type=quota.gpu_type)
    if _charge_reserved() and _record_has_booking():
        queryset = queryset.filter(record__booking__isnull=True)
    per_day = [Decimal(0)] * days
    for slice_start, slice_end, gpus in queryset.values_list("slice_start", "slice_end", "gpus"):
        lo, hi = max(slice_start, start_at), min(slice_end, end_at)
        while lo < hi:
            index = (billing_date(lo) - quota.period_start).days
            day_end = billing_midnight(quota.period_start + dt.timedelta(days=index + 1))
            part = min(hi, day_end)
            if 0 <= index < days:
                per_day[index] += Decimal(gpus) * Decimal((part - lo).total_seconds())
            lo = part
    budget = Decimal(quota.gpu_hours)
    today_index = (billing_date(min(now, end_at - dt.timedelta(microseconds=1))) - quota.period_start).days
    labels, remaining, ideal = [], [], []
    used = Decimal(0)
    for index in range(days):
        day = quota.period_start + dt.timedelta(days=index)
        labels.append(day.isoformat())
        ideal.append(float(_two(budget * (days - index - 1) / days)))
        used += per_day[index] / HOUR
        remaining.append(float(_two(budget - used)) if index <= today_index and now >= start_at else None)
    return {"labels": labels, "remaining": remaining, "ideal": ideal, "budget": float(budget)}


# ---------------------------------------------------------------- bookings: visibility, availability, charges


def bookings_visible_to(user) -> QuerySet:
    """Admins and finance see every booking; everyone else their teams' bookings (the teams rule)."""
    return _booking_model().objects.filter(team__in=teams_visible_to(user)).select_related("team", "created_by")


def bookings_usable_by(user, *, team: Team | None = None, now: dt.datetime | None = None) -> QuerySet:
    """Approved, reserved bookings that have not ended, of the teams the user may submit to: the
    job form's booking picker."""
    from accounting.models import BookingStatus, ReservationState
    from portal.selectors import teams_user_can_submit_to

    now = now or timezone.now()
    queryset = _booking_model().objects.filter(
        team__in=teams_user_can_submit_to(user), status=BookingStatus.APPROVED,
        reservation_state=ReservationState.ACTIVE, end__gt=now,
    ).select_related("team")  # fmt: skip
    if team is not None:
        queryset = queryset.filter(team=team)
    return queryset.order_by("start")


def booking_availability(*, start: dt.datetime, end: dt.datetime, gpu_type: str | None = None) -> list[dict]:
    """Bookable GPUs over [start, end) per GPU type: capacity (GPUs on available nodes of the type)
    minus what approved bookings hold, as a step function [{start, end, free, booked}] covering the
    range (equal steps merged). Two queries."""
    from accounting.models import BookingStatus
    from accounting.services import booking_load_steps
    from portal.models import NodeInfo

    nodes = NodeInfo.objects.filter(available=True, gpus_total__gt=0).exclude(gpu_type="")
    if gpu_type:
        nodes = nodes.filter(gpu_type=gpu_type)
    capacity: dict[str, list[int]] = {}
    for node in nodes:
        capacity.setdefault(node.gpu_type, []).append(node.gpus_total)
    bookings = _booking_model().objects.filter(
        gpu_type__in=list(capacity), status=BookingStatus.APPROVED, start__lt=end, end__gt=start
    ).only("gpu_type", "gpus", "start", "end")
    by_type: dict[str, list] = {}
    for booking in bookings:
        by_type.setdefault(booking.gpu_type, []).append(booking)
    result = []
    for name in sorted(capacity):
        total = sum(capacity[name])
        steps = [
            {"start": a, "end": b, "free": max(total - load, 0), "booked": load}
            for a, b, load in booking_load_steps(by_type.get(name, []), start=start, end=end)
        ]
        result.append({"gpu_type": name, "capacity": total, "gpus_per_node": min(capacity[name]), "steps": steps})
    return result


def booking_check_for_job(*, booking_id, team: Team, gpu_type: str, gpus: int, time_limit_minutes: int,
                          now: dt.datetime | None = None):  # fmt: skip
    """The booking a job is submitted into, when it may run there: it belongs to the job's team, is
    approved with its reservation in Slurm, has the job's GPU type and at least its GPUs, and the job
    (starting now, or at the booking's start if later) ends by the booking's end. ApplicationError
    (400, field "booking", or the job field at fault) otherwise."""
    from accounting.models import BookingStatus, ReservationState
    from portal.exceptions import ApplicationError

    now = now or timezone.now()
    booking = _booking_model().objects.filter(pk=booking_id, team=team).first()

    def refuse(message: str, field: str = "booking"):
        raise ApplicationError(f"The job cannot run in this booking: {message}", errors={field: [message]})

    if booking is None:
        refuse(f"no such booking of team {team.name}.")
    if booking.status != BookingStatus.APPROVED:
        refuse(f"the booking is {booking.get_status_display().lower()}.")
    if booking.end <= now:
        refuse("the booking has ended.")
    if booking.reservation_state != ReservationState.ACTIVE:
        refuse(f"its Slurm reservation is not ready ({booking.get_reservation_state_display().lower()}); try again shortly.")
    if gpu_type != booking.gpu_type:
        refuse(f"the booking is for {booking.gpu_type} GPUs; set gpu_type to {booking.gpu_type}.", "gpu_type")
    if gpus > booking.gpus:
        refuse(f"the booking holds {booking.gpus} GPUs.", "gpus")
    starts = max(now, booking.start)
    room = int((booking.end - starts).total_seconds() // 60)
    if time_limit_minutes > room:
        refuse(f"the job must end by the booking's end: at most {room} minutes.", "time_limit_minutes")
    return booking


def booking_charges(*, start_at: dt.datetime, end_at: dt.datetime, team: Team | None = None) -> list[dict]:
    """What bookings are charged within [start_at, end_at): every GPU-hour they held (approved, up to
    their end or cancellation), priced at the generic rate of their GPU type in force (split at rate
    changes). Zero cost when BOOKING_CHARGE_MODE=used (then only usage is charged). One line per booking
    with gpu_hours, cost, and the booking. Two queries."""
    reserved = getattr(settings, "BOOKING_CHARGE_MODE", "reserved") == "reserved"
    bookings = list(bookings_holding_capacity(start=start_at, end=end_at, team=team).select_related("team").order_by("start"))
    rates: dict[str, list[Rate]] = {}
    for rate in Rate.objects.filter(gpu_type__in={b.gpu_type for b in bookings}, partition="").order_by("effective_from"):
        rates.setdefault(rate.gpu_type, []).append(rate)
    lines = []
    for booking in bookings:
        held_until = booking.held_until
        if held_until is None:
            continue
        lo, hi = max(booking.start, start_at), min(held_until, end_at)
        if hi <= lo:
            continue
        type_rates = rates.get(booking.gpu_type, [])
        cuts = sorted({billing_midnight(r.effective_from) for r in type_rates} | {lo, hi})
        cuts = [c for c in cuts if lo <= c <= hi]
        cost, price, unpriced = Decimal(0), None, False
        for a, b in zip(cuts, cuts[1:]):
            in_force = [r for r in type_rates if billing_midnight(r.effective_from) <= a]
            if not in_force:
                unpriced = True
                continue
            price = in_force[-1].price_per_gpu_hour
            cost += Decimal(booking.gpus * int((b - a).total_seconds())) * price / HOUR
        seconds = booking.gpus * int((hi - lo).total_seconds())
        lines.append({
            "booking": booking,
            "team": booking.team,
            "gpu_type": booking.gpu_type,
            "gpus": booking.gpus,
            "start": lo,
            "end": hi,
            "gpu_hours": (Decimal(seconds) / HOUR).quantize(Decimal("0.01"), ROUND_HALF_UP),
            "price": price,
            "unpriced": unpriced,
            "cost": (cost if reserved else Decimal(0)).quantize(Decimal("0.01"), ROUND_HALF_UP),
        })  # fmt: skip
    return lines
