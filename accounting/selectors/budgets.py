"""Reads of quotas and budgets: visibility, the quotas in force, and the budget figures (budget, used,
held, booked, remaining) that the portal's enforcement (accounting.services.budget), the budget page,
alerts and /metrics share."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from decimal import Decimal

from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from accounting.calendar import billing_date, billing_midnight
from accounting.charging import bookings_charge_reserved
from accounting.models import BudgetHold, BudgetTotal, Quota, QuotaState
from accounting.selectors.bookings import bookings_holding_capacity
from accounting.selectors.usage import aggregate_slices, slices_in
from portal import money
from portal.db import any_of
from portal.models import Team
from portal.selectors import teams_visible_to
from portal.snapshots import BOOKINGS, QUOTAS, snapshot, snapshot_changed_here


def quotas_visible_to(user) -> QuerySet:
    """Quotas of the teams the user may see (members: their teams'; admins and finance: all)."""
    return Quota.objects.filter(team__in=teams_visible_to(user)).select_related("team", "requested_by", "decided_by")


def quota_period_bounds(quota) -> tuple[dt.datetime, dt.datetime]:
    """[00:00 of period_start, 00:00 of period_end) in the billing time zone."""
    return billing_midnight(quota.period_start), billing_midnight(quota.period_end)


def _budget_versions() -> dict[int, int]:
    """Each team's budget_version (portal.Team; moved by the database with every change of a quota or
    booking the budget counts). One query. A copy read AFTER it is at least as new as these."""
    return dict(Team.objects.values_list("pk", "budget_version"))


def _quotas_in_force_load() -> tuple[dt.date, list, dict[int, int]]:
    """(today, the approved quotas whose period ends after today, newest approval first: every quota
    that can be in force today or later, the teams' budget versions read before them). The QUOTAS
    snapshot's value."""
    versions = _budget_versions()
    day = billing_date(timezone.now())
    queryset = Quota.objects.filter(state=QuotaState.APPROVED, period_end__gt=day).select_related("team")
    return day, list(queryset.order_by("-approved_at", "-pk")), versions


def budget_copies_current(team_id: int, version: int | None) -> bool:
    """Whether this process's copies of the quotas in force and of the bookings (QUOTAS, BOOKINGS)
    hold team ``team_id``'s budget as of ``version`` (its budget_version read under its row lock,
    accounting.services.budget_holds_place): then the check reads them instead of the rows (two
    queries fewer per submission). Whoever changes a team's quotas or bookings in the services holds
    that lock FOR UPDATE, so the version read under it is the latest committed one, and a change
    this check waited for moved it. ``None`` (not read), copies turned off, or a transaction that
    changed quotas or bookings itself (the copies are not its view): False."""
    from django.conf import settings

    if version is None or settings.SNAPSHOT_MAX_AGE_SECONDS <= 0:
        return False
    if snapshot_changed_here(QUOTAS) or snapshot_changed_here(BOOKINGS):
        return False
    quotas_versions = snapshot(QUOTAS, _quotas_in_force_load)[2]
    bookings_versions = snapshot(BOOKINGS, _bookings_holding_load)[2]
    return quotas_versions.get(team_id) == version and bookings_versions.get(team_id) == version


def quotas_effective(*, team: Team | None = None, at: dt.datetime | None = None, fresh: bool = False) -> dict:
    """The approved quota in force at ``at`` per (team id, gpu_type) — the most recently approved one
    whose period contains that day (effective-dated: a newer approval wins). From this process's copy
    of the quotas in force (portal.snapshots QUOTAS: re-read once per change of a quota, not per
    submission); a day before the copy's, or ``fresh``, from one query (index quota_team_state_start).
    ``fresh`` is for checks under the team's row lock (budget holds, bookings): a quota changes under
    that lock, so a check that waited for it must read the rows as committed, not a copy whose
    version moves only after the change's commit. Each quota (and its team) is the caller's own: a
    copy of the process's shared row, never the row itself."""
    day = billing_date(at or timezone.now())
    shared = not fresh
    if shared:
        loaded_day, in_force, _versions = snapshot(QUOTAS, _quotas_in_force_load)
        shared = day >= loaded_day
    if not shared:
        queryset = Quota.objects.filter(state=QuotaState.APPROVED, period_start__lte=day, period_end__gt=day)
        if team is not None:
            queryset = queryset.filter(team=team)
        in_force = list(queryset.select_related("team").order_by("-approved_at", "-pk"))
    team_id = team.pk if team is not None else None
    effective: dict[tuple[int, str], object] = {}
    for quota in in_force:
        key = (quota.team_id, quota.gpu_type)
        if key not in effective and (team_id is None or quota.team_id == team_id) and quota.period_start <= day < quota.period_end:
            effective[key] = _own_copy(quota) if shared else quota
    return effective


def _own_copy(quota: Quota) -> Quota:
    """A caller's own copy of a quota of the QUOTAS snapshot, its team copied too (no query)."""
    mine = copy.copy(quota)
    mine.team = copy.copy(quota.team)
    return mine


def _used_seconds(team_ids: Iterable[int], start_at: dt.datetime, end_at: dt.datetime, *,
                  record_ids: Iterable[int] | None = None) -> dict[tuple[int, str], Decimal]:  # fmt: skip
    """GPU-seconds per (team, gpu_type) in [start_at, end_at), usage inside bookings excluded when
    bookings are charged by their reserved hours. One aggregate query. By team, not account: a
    team's usage on every cluster (each under its account there) counts against its quotas, which
    apply across all clusters. ``record_ids``: only these usage records' slices (what an ingestion
    replaces: budget_used_seconds)."""
    queryset = slices_in(start_at, end_at).filter(team_id__in=list(team_ids))
    if record_ids is not None:
        queryset = queryset.filter(record_id__in=any_of(record_ids, "bigint"))
    if bookings_charge_reserved():
        queryset = queryset.filter(record__booking__isnull=True)
    rows = aggregate_slices(queryset, start_at, end_at, ["team", "gpu_type"])
    return {(v["team"], v["gpu_type"]): Decimal(v["sum_gpu_seconds"] or 0) for v in rows}


# The BOOKINGS snapshot holds the bookings that held capacity in a window ending after this many
# days before it was read (a year and a month: a yearly quota's period); older windows are queried.
BOOKINGS_SNAPSHOT_DAYS = 400


def _bookings_holding_load() -> tuple[dt.datetime, list, dict[int, int]]:
    """(horizon, the bookings that held capacity after it, the teams' budget versions read before
    them): the BOOKINGS snapshot's value."""
    versions = _budget_versions()
    horizon = timezone.now() - dt.timedelta(days=BOOKINGS_SNAPSHOT_DAYS)
    far = horizon + dt.timedelta(days=100 * 366)
    rows = bookings_holding_capacity(start=horizon, end=far).only(
        "team_id", "gpu_type", "gpus", "start", "end", "status", "approved_at", "cancelled_at"
    )
    return horizon, list(rows), versions


def _booked_hours_bulk(start_at: dt.datetime, end_at: dt.datetime, teams: list[Team], *,
                       fresh: bool = False) -> dict[tuple[int, str], Decimal]:  # fmt: skip
    """GPU-hours booked per (team id, gpu_type) within [start_at, end_at); {} when bookings are not
    charged by their reserved hours. From this process's copy of the bookings that hold capacity
    (portal.snapshots BOOKINGS: re-read once per change of a booking); a range starting before the
    copy's horizon, or ``fresh`` (a check under the team's row lock, as quotas_effective's), from one
    query."""
    if not bookings_charge_reserved():
        return {}
    team_ids = {team.pk for team in teams}
    horizon, holding, _versions = (None, (), None) if fresh else snapshot(BOOKINGS, _bookings_holding_load)
    if fresh or start_at < horizon:
        holding = bookings_holding_capacity(start=start_at, end=end_at).filter(team__in=teams)
    seconds: dict[tuple[int, str], int] = {}
    for booking in holding:
        if booking.team_id not in team_ids or not (booking.start < end_at and booking.end > start_at):
            continue
        held_until = booking.held_until
        if held_until is None:
            continue
        lo, hi = max(booking.start, start_at), min(held_until, end_at)
        if hi > lo:
            key = (booking.team_id, booking.gpu_type)
            seconds[key] = seconds.get(key, 0) + booking.gpus * int((hi - lo).total_seconds())
    return {key: money.gpu_hours(value) for key, value in seconds.items()}


def _held_hours(team_ids: Iterable[int], ends_at: dt.datetime) -> dict[tuple[int, str], Decimal]:
    """GPU-hours held per (team id, the holds' GPU types: BudgetHold.gpu_type) by the teams' unreleased budget holds placed
    before ``ends_at`` (a period's end): what the running total of that period counts
    (accounting.models.BudgetTotal). For quotas whose total is not built yet, and to build one. One
    query (index budgethold_open)."""
    rows = (
        BudgetHold.objects.filter(team_id__in=list(team_ids), released_at__isnull=True, created_at__lt=ends_at)
        .values("team_id", "gpu_type")
        .annotate(total=Sum("held_gpu_hours"))
        .order_by()
    )
    return {(r["team_id"], r["gpu_type"]): Decimal(r["total"] or 0) for r in rows}


def budget_total_figures(*, team: Team, gpu_type: str, period_start: dt.date, period_end: dt.date,
                         held: bool = True) -> tuple[Decimal, Decimal]:  # fmt: skip
    """(used, held) GPU-hours of one team, GPU type ("" = all) and period computed from usage slices
    and budget holds, not rounded: what a running total (BudgetTotal) holds. One aggregate query each."""
    start_at, end_at = billing_midnight(period_start), billing_midnight(period_end)
    used = _used_seconds([team.pk], start_at, end_at)
    held = _held_hours([team.pk], end_at) if held else {}
    held_h = sum((v for (_, t), v in held.items() if not gpu_type or gpu_type in BudgetHold.types_of(t)), Decimal(0))
    return money.gpu_hours(_total_seconds(used, team.pk, gpu_type)), held_h


def _total_seconds(used: dict[tuple[int, str], Decimal], team_id: int, gpu_type: str) -> Decimal:
    """A total's used GPU-seconds from _used_seconds' figures: its team's, of its GPU type ("": all)."""
    return sum((v for (team, t), v in used.items() if team == team_id and (not gpu_type or t == gpu_type)), Decimal(0))


def budget_used_seconds(totals: Iterable[BudgetTotal], *, record_ids: Iterable[int] | None = None) -> dict:
    """The used GPU-seconds of running totals (by id; a total not saved yet: None) from the usage
    slices — exact, not rounded — with ONE aggregate query per distinct period for all their teams
    and GPU types. ``record_ids``: only these records' slices — what an ingestion moves a total by
    (accounting.services.budget.budget_used_change: O(the records it changes), never a period's
    slices); none at all when it is empty (no query)."""
    periods: dict[tuple[dt.date, dt.date], list[BudgetTotal]] = {}
    for total in totals:
        periods.setdefault((total.period_start, total.period_end), []).append(total)
    record_ids = None if record_ids is None else list(record_ids)
    out: dict = {}
    for (start, end), group in periods.items():
        used = {} if record_ids == [] else _used_seconds(
            {total.team_id for total in group}, billing_midnight(start), billing_midnight(end), record_ids=record_ids
        )  # fmt: skip
        out.update((total.pk, _total_seconds(used, total.team_id, total.gpu_type)) for total in group)
    return out


def totals_for(quotas: Iterable) -> dict[tuple[int, str, dt.date, dt.date], BudgetTotal]:
    """The running totals (BudgetTotal) of the quotas' keys (team, gpu_type, period), those built.
    One query."""
    keys = {(q.team_id, q.gpu_type, q.period_start, q.period_end) for q in quotas}
    if not keys:
        return {}
    condition = Q()
    for team_id, gpu_type, start, end in keys:
        condition |= Q(team_id=team_id, gpu_type=gpu_type, period_start=start, period_end=end)
    return {(t.team_id, t.gpu_type, t.period_start, t.period_end): t for t in BudgetTotal.objects.filter(condition)}


_two = money.display  # the burn-down chart's figures: hundredths of a GPU-hour, half up


def budget_rows(quotas: list, *, at: dt.datetime | None = None, with_held: bool = True,
                totals: dict | None = None, fresh: bool = False) -> list[dict]:  # fmt: skip
    """Budget figures of approved quotas (any teams): budget, used, held, booked, remaining, consumed
    (used + booked) and the day the budget runs out at the current burn rate. One query for the
    quotas' running totals (BudgetTotal; ``totals`` when the caller has them), then per distinct
    period (usually one): booked, and used and held only for quotas whose total is not built yet —
    constant in the number of teams and jobs.

    used: accounted GPU-hours in the period (the team's account; the quota's GPU type, or all types);
    held: what the budget holds of unfinished jobs hold (per type: jobs that asked for it);
    booked: approved bookings' reserved GPU-hours in the period (``fresh``: read from the database,
    for a check under the team's row lock, under which bookings are approved).

    The figures are exact GPU-hours (Decimal, never rounded here): the budget checks
    (accounting.services.budget, .bookings) compare a need with ``remaining`` as it is; whoever
    shows a figure rounds it once (portal.fields.DecimalStringField in the API, the templates)."""
    now = at or timezone.now()
    periods: dict[tuple[dt.date, dt.date], list] = {}
    for quota in quotas:
        periods.setdefault((quota.period_start, quota.period_end), []).append(quota)
    totals = totals_for(quotas) if totals is None else totals
    rows = []
    for (start, end), group in periods.items():
        start_at, end_at = billing_midnight(start), billing_midnight(end)
        teams = list({q.team_id: q.team for q in group}.values())
        unbuilt = [q for q in group if (q.team_id, q.gpu_type, start, end) not in totals]
        used = _used_seconds({q.team_id for q in unbuilt}, start_at, end_at) if unbuilt else {}
        held = _held_hours({q.team_id for q in unbuilt}, end_at) if unbuilt and with_held else {}
        booked = _booked_hours_bulk(start_at, end_at, teams, fresh=fresh)
        for quota in group:
            kind = quota.gpu_type
            booked_h = sum((v for (team_id, t), v in booked.items() if team_id == quota.team_id and (not kind or t == kind)), Decimal(0))
            total = totals.get((quota.team_id, kind, start, end))
            if total is not None:
                used_h = Decimal(total.used_gpu_hours)
                held_h = Decimal(total.held_gpu_hours) if with_held else Decimal(0)
            else:
                used_s = sum((v for (team_id, t), v in used.items() if team_id == quota.team_id and (not kind or t == kind)), Decimal(0))
                held_h = sum((v for (team_id, t), v in held.items()
                              if team_id == quota.team_id and (not kind or kind in BudgetHold.types_of(t))), Decimal(0))  # fmt: skip
                used_h = money.gpu_hours(used_s)
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
                    # exact GPU-hours: the budget checks compare them; pages and the API round for display
                    "budget": budget,
                    "used": used_h,
                    "held": held_h,
                    "booked": booked_h,
                    "remaining": remaining,
                    "consumed": used_h + booked_h,  # alerts compare it with the budget
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
    queryset = slices_in(start_at, end_at).filter(team_id=quota.team_id)  # every cluster's usage of the team
    if quota.gpu_type:
        queryset = queryset.filter(gpu_type=quota.gpu_type)
    if bookings_charge_reserved():
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
    used_seconds = Decimal(0)
    for index in range(days):
        day = quota.period_start + dt.timedelta(days=index)
        labels.append(day.isoformat())
        ideal.append(float(_two(budget * (days - index - 1) / days)))
        used_seconds += per_day[index]
        used = money.gpu_hours(used_seconds)  # exact seconds summed, divided once
        remaining.append(float(_two(budget - used)) if index <= today_index and now >= start_at else None)
    return {"labels": labels, "remaining": remaining, "ideal": ideal, "budget": float(budget)}


