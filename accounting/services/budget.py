"""Budget enforcement in the portal: a job's estimate and a booking's reserved hours
(accounting.services.bookings) must fit budget − used − held − booked
(accounting.selectors.budgets.budget_rows). The one wording of "over budget" and "no quota" refusals.
Enforcement in Slurm (association limits) is accounting.services.slurm_limits.

The jobs app's interface to the budget (jobs depends on accounting, never the reverse):

- ``budget_holds_place``   in the transaction that stores the jobs: one BudgetHold per job, added to
                           the team's running totals (BudgetTotal) under their row locks, refused
                           (409) when a quota does not have room — rolled back with the job rows
- ``budget_holds_release`` a job ended without running, its submission failed, it was cancelled
                           before it started — or its final usage never came (the jobs app's
                           sweeper, audited): its hold stops holding
- ``budget_holds_convert`` (usage ingestion) ingested GPU-hours move from held to used; a final usage
                           record releases the hold; the totals' used figures move by what the
                           ingestion changed (``budget_used_change``, read before its writes)

``budget_totals_check`` (beat, hourly) compares the totals of periods not over yet with the usage
slices and corrects a stale one.

Enforcement in Slurm (association limits) is accounting.services.slurm_limits."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.urls import reverse_lazy
from django.utils import timezone

from accounting.calendar import billing_midnight, current_month
from accounting.charging import bookings_charge_reserved
from accounting.models import BudgetHold, BudgetTotal, UsageRecord
from accounting.selectors.budgets import (
    budget_copies_current, budget_rows, budget_total_figures, budget_used_seconds, quotas_effective,
)
from portal import money
from portal.db import any_of
from portal.exceptions import Conflict
from portal.models import AuditEvent, Team
from portal.services import audit_event

logger = logging.getLogger(__name__)

QUOTA_PAGE = reverse_lazy("accounting:quotas")  # the quota request page, for messages


def gpu_hours_text(value) -> str:
    """GPU-hours for messages: one decimal place ("16.0", "3.5")."""
    return f"{money.display(value, places=1)}"


def no_quota_unlimited() -> bool:
    """Work without an applicable approved quota passes (QUOTA_NO_QUOTA_POLICY=unlimited) or is refused."""
    return settings.QUOTA_NO_QUOTA_POLICY == "unlimited"


def no_quota(*, team: Team, what: str, when: str) -> Conflict:
    """The refusal of work that no approved quota covers (QUOTA_NO_QUOTA_POLICY=blocked)."""
    message = f"{team.slug} has no approved {what} {when}: a team manager can request one at {QUOTA_PAGE}"
    return Conflict(message, errors={"team": [message]})


def over_budget(*, row: dict, needs: Decimal, subject: str, measure: str, span: str, fix: dict) -> Conflict:
    """The refusal of work needing ``needs`` GPU-hours more than the budget row has left: one wording
    for jobs (``subject`` "") and bookings ("the booking "), with the figures; ``measure``/``span``
    word the hint on "gpus" ("The job needs" … "time limit"), ``fix`` names the other field at fault."""
    kind = f"{row['gpu_type']} " if row["gpu_type"] else ""
    left = max(row["remaining"], Decimal(0))
    gh = gpu_hours_text
    message = (
        f"Over budget: {subject}needs {gh(needs)} GPU-h; {gh(left)} of {gh(row['budget'])} {kind}GPU-h left for "
        f"{row['team'].slug} in {row['period_label']} (used {gh(row['used'])}, held by unfinished jobs "
        f"{gh(row['held'])}, booked {gh(row['booked'])})."
    )
    hint = f"{measure} {gh(needs)} GPU-h (GPUs × {span}); {gh(left)} {kind}GPU-h are left."
    return Conflict(message, errors={"gpus": [hint], **fix})


@dataclass(frozen=True)
class HoldRequest:
    """One job's hold: its id (the jobs app's Job pk), its estimate (``gpu_hours``, ``gpu_seconds``,
    ``gpu_type``, ``gpu_type_assumed``, ``gpu_types``, ``cost``: a jobs.estimate.JobQuote), the
    booking it runs in and its array tasks (each holds its share until its own final record)."""

    job_uuid: uuid.UUID
    estimate: object
    booking_id: uuid.UUID | None = None
    tasks: int = 1

    @property
    def gpu_type(self) -> str:
        """The types whose quotas the hold counts against (BudgetHold.gpu_type): the type the job
        asked for, or every type a job without one can land on ("a100,h100"); "" = any-type only."""
        types = getattr(self.estimate, "gpu_types", ()) or ()
        if types:
            return ",".join(sorted(types))
        return "" if getattr(self.estimate, "gpu_type_assumed", False) else (getattr(self.estimate, "gpu_type", "") or "")

    @property
    def task_gpu_hours(self) -> Decimal:
        """One task's share of the estimate, to six places rounded up (exact from GPU-seconds)."""
        tasks = max(self.tasks, 1)
        seconds = getattr(self.estimate, "gpu_seconds", 0)
        if seconds:
            return money.stored(money.gpu_hours(Decimal(seconds) / tasks), up=True)
        return money.stored(Decimal(self.estimate.gpu_hours) / tasks, up=True)


def _keys(gpu_type: str) -> frozenset[str]:
    """The running totals' GPU-type keys a hold counts in: "" (every type) and each of its types."""
    return frozenset(("", *BudgetHold.types_of(gpu_type)))


def _place_sql(holds: list[tuple], increments: dict[str, Decimal], *, team_id: int, at: dt.datetime) -> tuple[str, list]:
    """One statement: lock the team row FOR KEY SHARE (placements of a team run side by side; a quota
    approval or booking, which lock it FOR UPDATE, waits for them), insert the holds, lock the
    team's totals of periods not over yet in id order and add the holds to them. Returns the totals
    with their new figures, each with the team's budget_version as the lock read it (the latest
    committed: a row lock reads the row's newest version)."""
    params: list = []
    values = []
    for job_uuid, gpu_type, booking_id, estimate, cost, held, placed_at, tasks, task_hours in holds:
        values.append("(%s::uuid, %s, %s::uuid, %s::numeric, %s::numeric, %s::numeric, %s::timestamptz, %s::integer, "
                      "%s::numeric)")  # fmt: skip
        params += [job_uuid, gpu_type, booking_id, estimate, cost, held, placed_at, tasks, task_hours]
    sql = (
        "WITH team AS (SELECT id, budget_version FROM portal_team WHERE id = %s FOR KEY SHARE), "
        "holds AS (INSERT INTO accounting_budgethold (job_uuid, team_id, gpu_type, booking_id, estimated_gpu_hours, "
        "estimated_cost, held_gpu_hours, created_at, tasks, task_gpu_hours, slurm_cluster) SELECT v.job_uuid, team.id, "
        "v.gpu_type, v.booking_id, v.est, v.cost, v.held, v.at, v.tasks, v.task_hours, '' FROM team, "
        f"(VALUES {', '.join(values)}) AS v(job_uuid, gpu_type, booking_id, est, cost, held, at, tasks, task_hours) "
        "RETURNING 1)"
    )
    head = [team_id]
    if not increments:
        return sql + " SELECT count(*) FROM holds", head + params
    incs = ", ".join("(%s, %s::numeric)" for _ in increments)
    inc_params = [x for gpu_type, hours in sorted(increments.items()) for x in (gpu_type, hours)]
    sql += (
        f", inc(gpu_type, hours) AS (VALUES {incs}), "
        "locked AS (SELECT t.id FROM accounting_budgettotal t, team WHERE t.team_id = team.id AND t.ends_at > %s "
        "AND t.gpu_type IN (SELECT gpu_type FROM inc) ORDER BY t.id FOR UPDATE OF t) "
        "UPDATE accounting_budgettotal t SET held_gpu_hours = t.held_gpu_hours + inc.hours, updated_at = %s "
        "FROM locked, inc, team WHERE t.id = locked.id AND t.gpu_type = inc.gpu_type "
        "RETURNING t.id, t.team_id, t.gpu_type, t.period_start, t.period_end, t.held_gpu_hours, t.used_gpu_hours, "
        "team.budget_version"
    )
    return sql, head + params + inc_params + [at, at]


def _increments(rows: Iterable[tuple[str, Decimal]]) -> dict[str, Decimal]:
    """What holds add to a team's totals per GPU type: all of them to "" (every type), each to its
    types (a job without a type: to every type it can land on)."""
    out: dict[str, Decimal] = {}
    for gpu_type, held in rows:
        if held <= 0:
            continue
        for key in _keys(gpu_type):
            out[key] = out.get(key, Decimal(0)) + held
    return out


def _total_build(*, team: Team, quota, at: dt.datetime, increment: Decimal) -> BudgetTotal:
    """The running total of a quota's key, built from usage and holds (this transaction's new holds
    included), or — when another placement built it meanwhile — that one with ``increment`` added.
    Locked either way. Once per team, GPU type and period."""
    key = {"team_id": team.pk, "gpu_type": quota.gpu_type, "period_start": quota.period_start, "period_end": quota.period_end}
    used, held = budget_total_figures(team=team, gpu_type=quota.gpu_type, period_start=quota.period_start,
                                      period_end=quota.period_end)  # fmt: skip
    seconds = used * money.HOUR  # exact: the slices' GPU-seconds, not rounded
    total = BudgetTotal(**key, ends_at=billing_midnight(quota.period_end), held_gpu_hours=money.stored(held),
                        used_gpu_seconds=seconds, used_gpu_hours=money.stored(used), updated_at=at)  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounting_budgettotal (team_id, gpu_type, period_start, period_end, ends_at, held_gpu_hours, "
            "used_gpu_seconds, used_gpu_hours, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (team_id, gpu_type, period_start, period_end) DO NOTHING RETURNING id",
            [team.pk, quota.gpu_type, quota.period_start, quota.period_end, total.ends_at, total.held_gpu_hours,
             total.used_gpu_seconds, total.used_gpu_hours, at],
        )  # fmt: skip
        inserted = cursor.fetchone()
    if inserted is not None:
        total.pk = inserted[0]
        return total
    # built by another placement since this one's statement ran: add ours to it, under its lock
    total = BudgetTotal.objects.select_for_update().get(**key)
    BudgetTotal.objects.filter(pk=total.pk).update(held_gpu_hours=total.held_gpu_hours + increment, updated_at=at)
    total.held_gpu_hours += increment
    return total


def budget_holds_place(*, team: Team, holds: Sequence[HoldRequest], at: dt.datetime | None = None) -> None:
    """Place the jobs' budget holds, refusing (Conflict, 409, with the figures) when they do not fit.

    Call INSIDE the transaction that inserts the job rows (jobs.services.job_submit / job_submit_batch):
    a refusal or a failing job insert rolls the holds back with them. For each quota that applies
    (the any-type quota, and the quota of the type a job asked for), the new holds' GPU-hours must fit
    in budget − used − held − booked. Without an applicable approved quota, QUOTA_NO_QUOTA_POLICY
    decides (blocked: 409 asking a manager to request one). A job inside a booking holds nothing when
    bookings are charged by their reserved hours (its hold row only names the booking).

    Queries: one statement locks the team row and the team's running totals (BudgetTotal, one row
    per quota key), inserts the holds and adds them, and returns the team's budget_version as the
    lock read it. Then the team's quotas in force and the bookings' booked hours, as of that lock
    (a quota or a booking approved while this placement waited for it counts): from this process's
    copies when they were read at that version (accounting.selectors.budget_copies_current: no
    query), else from the database (two) — one or three, whatever the number of jobs, live jobs
    and usage records.
    The first hold of a team's period builds its total from usage and holds (once)."""
    at = at or timezone.now()
    covered = bookings_charge_reserved()
    rows = []
    for hold in holds:
        estimate = money.stored(hold.estimate.gpu_hours, up=True)
        cost = getattr(hold.estimate, "cost", None)
        held = Decimal(0) if (hold.booking_id is not None and covered) else estimate
        rows.append((hold.job_uuid, hold.gpu_type, hold.booking_id, estimate, cost, held, at, max(hold.tasks, 1),
                     hold.task_gpu_hours))  # fmt: skip
    increments = _increments((row[1], row[5]) for row in rows)
    with transaction.atomic(savepoint=False):
        sql, params = _place_sql(rows, increments, team_id=team.pk, at=at)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            returned = cursor.fetchall() if increments else []
        if not increments:
            return  # every job runs in a booking that carries its charge
        # the quotas in force and the bookings as of the team's row lock: a quota or booking changes
        # under that lock, so a change this placement waited for is seen
        # (tests/accounting/test_quotas_race.py) — from this process's copies when they were read at
        # the budget version the lock read, else from the rows
        fresh = not budget_copies_current(team.pk, returned[0][7] if returned else None)
        effective = quotas_effective(team=team, at=at, fresh=fresh)
        totals = {
            (team_id, gpu_type, start, end): BudgetTotal(pk=pk, team_id=team_id, gpu_type=gpu_type, period_start=start,
                                                         period_end=end, held_gpu_hours=held, used_gpu_hours=used)
            for pk, team_id, gpu_type, start, end, held, used, _version in returned
        }  # fmt: skip
        checked: dict[int, object] = {}
        for job_type in sorted({row[1] for row in rows if row[5] > 0}):
            keys = _keys(job_type)  # a job without a type: the quota of every type it can land on
            applicable = [q for key, q in effective.items() if key[1] in keys]
            if not applicable:
                if no_quota_unlimited():
                    continue
                start, _ = current_month(at)
                what = "GPU quota" if not effective else f"GPU quota covering {job_type.replace(',', ' or ') or 'any-type'} GPUs"
                raise no_quota(team=team, what=what, when=f"for {start:%Y-%m}")
            checked.update((q.pk, q) for q in applicable)
        quotas = sorted(checked.values(), key=lambda q: q.gpu_type)
        before: dict[tuple, BudgetTotal] = {}
        for quota in quotas:
            key = (team.pk, quota.gpu_type, quota.period_start, quota.period_end)
            needs = increments.get(quota.gpu_type, Decimal(0))
            total = totals.get(key) or _total_build(team=team, quota=quota, at=at, increment=needs)
            # the figures without this placement, for the check and its message
            before[key] = BudgetTotal(team_id=team.pk, gpu_type=quota.gpu_type, period_start=quota.period_start,
                                      period_end=quota.period_end, held_gpu_hours=total.held_gpu_hours - needs,
                                      used_gpu_hours=total.used_gpu_hours)  # fmt: skip
        for row in budget_rows(quotas, at=at, totals=before, fresh=fresh):
            needs = increments.get(row["gpu_type"], Decimal(0))
            if needs > row["remaining"]:
                raise over_budget(row=row, needs=needs, subject="", measure="The job needs", span="time limit",
                                  fix={"time_limit_minutes": ["Ask for fewer GPUs or a shorter time limit."]})  # fmt: skip


@dataclass(frozen=True)
class UsedChange:
    """What an ingestion moves the running totals' used figures by (budget_used_change): the totals
    its records count in (their teams', of periods ending after the earliest start) and what the
    records it replaces counted there before (GPU-seconds by total id); ``moves`` adds, after its
    writes, what the records it wrote count."""

    team_ids: frozenset[int]
    since: dt.datetime | None
    totals: list[BudgetTotal]
    before: dict[int, Decimal]

    def moves(self, *, record_ids: Iterable[int]) -> dict[int, Decimal]:
        """The GPU-seconds each total moves by: what the written records count there now minus what
        the replaced ones counted. One aggregate per distinct period over those records' slices."""
        after = budget_used_seconds(self.totals, record_ids=record_ids) if self.totals else {}
        return {pk: after.get(pk, Decimal(0)) - self.before.get(pk, Decimal(0)) for pk in after.keys() | self.before.keys()}


def budget_used_change(*, team_ids: Iterable[int], since: dt.datetime | None, record_ids: Iterable[int]) -> UsedChange:
    """Call BEFORE an ingestion replaces usage records and their slices: the running totals of
    ``team_ids`` (the records' teams, old and new) of periods ending after ``since`` (their earliest
    start, old or new), and what the records it replaces (``record_ids``: stored records whose
    reading changed) count in them. Then budget_holds_convert(used=…, record_ids=the records
    written) moves each total by the difference: the ingestion's cost is O(the records it changes),
    never a sum over the period's usage. Two queries at most (the totals; one aggregate per period
    over the replaced records' slices, none for new records)."""
    teams = frozenset(t for t in team_ids if t)
    if not teams or since is None:
        return UsedChange(teams, since, [], {})
    totals = list(BudgetTotal.objects.filter(team_id__in=teams, ends_at__gt=since))
    replaced = list(record_ids)
    before = budget_used_seconds(totals, record_ids=replaced) if totals and replaced else {}
    return UsedChange(teams, since, totals, before)


def _used_set(total: BudgetTotal, seconds: Decimal) -> None:
    total.used_gpu_seconds = seconds
    total.used_gpu_hours = money.stored(money.gpu_hours(seconds))


def _totals_apply(*, deltas: Sequence[tuple[int, str, dt.datetime, Decimal]], used: UsedChange | None = None,
                  used_moves: dict[int, Decimal] | None = None, at: dt.datetime) -> int:  # fmt: skip
    """Apply held deltas (team id, the hold's GPU types (BudgetHold.gpu_type; or a frozenset of
    total keys), hold placed at, delta) to the totals that count those holds (the team's; "" and the
    types; periods ending after the hold was placed), and move their used GPU-seconds by
    ``used_moves`` (by total id; ``used``: the ingestion's change they come from) — under the totals'
    row locks, taken in id order. A total of ``used``'s teams and periods that its first read did not
    see (built by a placement since) gets its used figure from the slices, under its lock. Two queries
    (lock, one bulk UPDATE) whatever the number of holds, three with such a total."""
    deltas = [d for d in deltas if d[3] != 0]
    moves = {pk: v for pk, v in (used_moves or {}).items() if v != 0}
    teams = {d[0] for d in deltas} | (set(used.team_ids) if used is not None else set())
    if not teams:
        return 0
    oldest = min([d[2] for d in deltas] + ([used.since] if used is not None and used.since is not None else []))
    locked = list(BudgetTotal.objects.select_for_update().filter(team_id__in=teams, ends_at__gt=oldest).order_by("pk"))
    built = []
    if used is not None and used.since is not None:
        seen = {total.pk for total in used.totals}
        built = [t for t in locked if t.pk not in seen and t.team_id in used.team_ids and t.ends_at > used.since]
    rebuilt = budget_used_seconds(built) if built else {}
    changed = []
    for total in locked:
        held = Decimal(total.held_gpu_hours)
        for team_id, gpu_type, placed_at, delta in deltas:
            keys = gpu_type if isinstance(gpu_type, frozenset) else _keys(gpu_type)
            if team_id == total.team_id and total.ends_at > placed_at and total.gpu_type in keys:
                held += delta
        seconds = rebuilt[total.pk] if total.pk in rebuilt else Decimal(total.used_gpu_seconds) + moves.get(total.pk, 0)
        if held != total.held_gpu_hours or seconds != total.used_gpu_seconds:
            total.held_gpu_hours, total.updated_at = max(held, Decimal(0)), at
            _used_set(total, seconds)
            changed.append(total)
    if changed:
        BudgetTotal.objects.bulk_update(changed, ["held_gpu_hours", "used_gpu_seconds", "used_gpu_hours", "updated_at"])
    return len(changed)


def budget_holds_release(*, job_uuids: Iterable, at: dt.datetime | None = None, reason: str = "") -> int:
    """The jobs ended without running (cancelled before they started, their submission refused or
    failed, ended in the queue), or their final usage never came (the sweeper,
    jobs.services.budget_holds_sweep): their holds stop holding. Idempotent (released holds are left
    alone); call it in the transaction that records the job's end. Three queries (holds, the totals'
    lock, one UPDATE of them) for any number of jobs; none when no hold is open. With a ``reason``
    each release is also an audit event (``budget.hold_released``, one INSERT) and a log line."""
    wanted = [u if isinstance(u, uuid.UUID) else uuid.UUID(str(u)) for u in job_uuids]
    if not wanted:
        return 0
    at = at or timezone.now()
    with transaction.atomic(savepoint=False):
        holds = list(
            BudgetHold.objects.select_for_update()
            .filter(job_uuid__in=any_of(wanted, "uuid"), released_at__isnull=True)
            .order_by("job_uuid")
        )
        if not holds:
            return 0
        BudgetHold.objects.filter(job_uuid__in=any_of([h.job_uuid for h in holds], "uuid")).update(released_at=at, held_gpu_hours=0)
        _totals_apply(deltas=[(h.team_id, h.gpu_type, h.created_at, -h.held_gpu_hours) for h in holds], at=at)
        if reason:
            _releases_audit(holds, reason=reason)
    return len(holds)


def _releases_audit(holds: Sequence[BudgetHold], *, reason: str) -> None:
    """One audit event per released hold (what it still held, why), in one INSERT; one log line."""
    AuditEvent.objects.bulk_create([
        audit_event(actor=None, action="budget.hold_released", target=hold, team=Team(pk=hold.team_id), data={
            "reason": reason, "held_gpu_hours": str(hold.held_gpu_hours),
            "estimated_gpu_hours": str(hold.estimated_gpu_hours),
        })
        for hold in holds
    ])  # fmt: skip
    freed = sum((Decimal(h.held_gpu_hours) for h in holds), Decimal(0))
    logger.warning("released %d budget holds (%s GPU-h) %s: %s", len(holds), gpu_hours_text(freed), reason,
                   ", ".join(str(h.job_uuid) for h in holds))  # fmt: skip


def hold_figure(hold: BudgetHold, records: Sequence[tuple[bool, Decimal, str]], *, covered: bool) -> tuple[Decimal, bool, str]:
    """(held GPU-hours, final, GPU types) of one hold from all its job's usage records so far
    (``records``: (provisional, GPU-hours, GPU type allocated) each). Each of the ``tasks`` still to
    run holds ``task_gpu_hours`` until a record of it arrives; a running task holds its share minus
    what it used so far (so used + held counts each GPU-second once); a final record ends its task's
    hold. Final when every task has a final record. The types narrow to those Slurm allocated once
    every task has a record (a job without a type)."""
    final = sum(1 for provisional, _, _ in records if not provisional)
    running = [Decimal(hours) for provisional, hours, _ in records if provisional]
    tasks = hold.tasks  # 0: an array none of whose tasks ran (budget_holds_tasks_settle)
    if final >= tasks:
        return Decimal(0), True, hold.gpu_type
    types = hold.gpu_type
    unseen = max(tasks - final - len(running), 0)
    if unseen == 0 and len(hold.gpu_types) > 1:
        seen = {gpu_type for _, _, gpu_type in records if gpu_type}
        if seen and seen <= set(hold.gpu_types):
            types = ",".join(sorted(seen))
    if hold.booking_id is not None and covered:
        return Decimal(0), False, types
    per_task = Decimal(hold.task_gpu_hours) or Decimal(hold.estimated_gpu_hours) / tasks
    held = unseen * per_task + sum((max(per_task - used, Decimal(0)) for used in running[: tasks - final]), Decimal(0))
    return money.stored(min(held, Decimal(hold.estimated_gpu_hours)), up=True), False, types


def _holds_refigure(holds: Sequence[BudgetHold], usage: dict, *, at: dt.datetime, save: frozenset = frozenset()) -> list:
    """Set each hold's figures from its job's usage (hold_figure) and save those that changed, and
    those in ``save`` (one bulk UPDATE); returns the totals' deltas (a hold whose types narrowed
    leaves the dropped types' totals)."""
    covered = bookings_charge_reserved()
    deltas, changed = [], []
    for hold in holds:
        held, done, types = hold_figure(hold, usage.get(hold.job_uuid, ()), covered=covered)
        if held == hold.held_gpu_hours and not done and types == hold.gpu_type:
            if hold.pk in save:
                changed.append(hold)
            continue
        old_keys, new_keys = _keys(hold.gpu_type), _keys(types)
        if old_keys - new_keys:
            deltas.append((hold.team_id, frozenset(old_keys - new_keys), hold.created_at, -Decimal(hold.held_gpu_hours)))
            deltas.append((hold.team_id, frozenset(new_keys), hold.created_at, held - hold.held_gpu_hours))
        else:
            deltas.append((hold.team_id, frozenset(new_keys), hold.created_at, held - hold.held_gpu_hours))
        hold.held_gpu_hours, hold.gpu_type, hold.released_at = held, types, (at if done else None)
        changed.append(hold)
    if changed:
        BudgetHold.objects.bulk_update(changed, ["held_gpu_hours", "gpu_type", "released_at", "tasks"])
    return deltas


def _usage_of(job_uuids: Iterable) -> dict:
    """{job uuid: [(provisional, GPU-hours, GPU type), ...]} of every usage record of these jobs (one query)."""
    usage: dict = {}
    rows = UsageRecord.objects.filter(portal_job_uuid__in=any_of(job_uuids, "uuid")).values_list(
        "portal_job_uuid", "provisional", "gpu_hours", "gpu_type"
    )
    for job_uuid, provisional, hours, gpu_type in rows:
        usage.setdefault(job_uuid, []).append((provisional, hours, gpu_type))
    return usage


def budget_holds_convert(*, job_uuids: Iterable, used: UsedChange | None = None, record_ids: Iterable[int] = (),
                         at: dt.datetime) -> None:  # fmt: skip
    """Usage ingestion: the usage of these portal jobs (every record of each so far) moves from held
    to used, task by task (hold_figure): a running task holds its estimate minus what it used so
    far, a task's final record ends its share, the last one releases the hold. The totals ``used``
    names (budget_used_change, read before the ingestion's writes) move by what the records it
    wrote (``record_ids``) count in them now minus what they counted before. Call inside the
    ingestion's transaction."""
    wanted = list(job_uuids)
    holds = list(
        BudgetHold.objects.select_for_update()
        .filter(job_uuid__in=any_of(wanted, "uuid"), released_at__isnull=True)
        .order_by("job_uuid")
    ) if wanted else []  # fmt: skip
    usage = _usage_of(h.job_uuid for h in holds) if holds else {}
    deltas = _holds_refigure(holds, usage, at=at)
    moves = used.moves(record_ids=record_ids) if used is not None and used.totals else {}
    if deltas or any(moves.values()) or (used is not None and used.team_ids):
        _totals_apply(deltas=deltas, used=used, used_moves=moves, at=at)


def budget_totals_check(*, at: dt.datetime | None = None) -> list[tuple[int, Decimal]]:
    """Check every running total of a period not over yet against the usage slices, team by team
    under the team's totals' row locks, and correct a used figure that differs (logged: the
    ingestion moves used by its changes, and a total a placement built while an ingestion's slices
    were not committed yet would miss them). Periodic (accounting.tasks.budget_totals_check_task),
    and the migration that gave the totals their GPU-seconds. Returns (total id, GPU-seconds
    corrected by) of each correction. One lock and one aggregate per period per team."""
    at = at or timezone.now()
    corrected: list[tuple[int, Decimal]] = []
    team_ids = sorted(set(BudgetTotal.objects.filter(ends_at__gt=at).values_list("team_id", flat=True)))
    for team_id in team_ids:
        with transaction.atomic():
            locked = list(BudgetTotal.objects.select_for_update().filter(team_id=team_id, ends_at__gt=at).order_by("pk"))
            seconds = budget_used_seconds(locked)
            changed = []
            for total in locked:
                if seconds[total.pk] != total.used_gpu_seconds or money.stored(money.gpu_hours(seconds[total.pk])) != total.used_gpu_hours:
                    corrected.append((total.pk, seconds[total.pk] - Decimal(total.used_gpu_seconds)))
                    _used_set(total, seconds[total.pk])
                    total.updated_at = at
                    changed.append(total)
            if changed:
                BudgetTotal.objects.bulk_update(changed, ["used_gpu_seconds", "used_gpu_hours", "updated_at"])
    for pk, by in corrected:
        logger.warning("budget total %s: used corrected by %s GPU-s from the usage slices", pk, by)
    return corrected


def budget_holds_identify(*, jobs: Iterable[tuple]) -> int:
    """The jobs app saw these jobs in Slurm ((job uuid, cluster, Slurm job id — an array's id —, when
    the portal learnt that id) each): their open holds remember it, so that running usage records,
    whose Comment sacct leaves empty until the job ends, are matched to them
    (accounting.services.ingestion, by portal.slurm.tags.record_is_job). One UPDATE."""
    rows = [(uuid.UUID(str(job_uuid)), cluster, int(job_id), known_at) for job_uuid, cluster, job_id, known_at in jobs if job_id]
    if not rows:
        return 0
    values = ", ".join("(%s::uuid, %s, %s::bigint, %s::timestamptz)" for _ in rows)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE accounting_budgethold h SET slurm_cluster = v.cluster, slurm_job_id = v.job_id, slurm_id_known_at = v.known_at "
            f"FROM (VALUES {values}) AS v(job_uuid, cluster, job_id, known_at) WHERE h.job_uuid = v.job_uuid "
            "AND h.released_at IS NULL AND (h.slurm_job_id IS DISTINCT FROM v.job_id OR h.slurm_cluster <> v.cluster "
            "OR h.slurm_id_known_at IS DISTINCT FROM v.known_at)",
            [x for row in rows for x in row],
        )
        return cursor.rowcount


def budget_holds_tasks_settle(*, ran: dict, at: dt.datetime | None = None) -> int:
    """Array jobs ended, some of whose tasks never ran (cancelled while pending: no usage will come
    for them): ``ran`` is {job uuid: how many of its tasks started}. Their holds expect only those
    tasks (never fewer than the records already seen), and one whose tasks are all final is released
    (none ran: at once). Idempotent. Four queries (holds, their usage, one UPDATE, the totals')."""
    wanted = {uuid.UUID(str(k)): int(v) for k, v in ran.items()}
    if not wanted:
        return 0
    at = at or timezone.now()
    with transaction.atomic(savepoint=False):
        holds = list(BudgetHold.objects.select_for_update().filter(job_uuid__in=list(wanted), released_at__isnull=True)
                     .order_by("job_uuid"))  # fmt: skip
        if not holds:
            return 0
        usage = _usage_of(h.job_uuid for h in holds)
        lowered = set()
        for hold in holds:
            expected = max(wanted[hold.job_uuid], len(usage.get(hold.job_uuid, ())))
            if expected < hold.tasks:
                hold.tasks = expected
                lowered.add(hold.pk)
        deltas = _holds_refigure(holds, usage, at=at, save=frozenset(lowered))
        _totals_apply(deltas=deltas, at=at)
    return len(lowered)
