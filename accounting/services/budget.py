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
                           record releases the hold

Enforcement in Slurm (association limits) is accounting.services.slurm_limits."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounting.calendar import billing_midnight, current_month
from accounting.charging import bookings_charge_reserved
from accounting.models import BudgetHold, BudgetTotal
from accounting.selectors.budgets import budget_rows, budget_total_figures, quotas_effective
from portal.db import prepared_cursor
from portal.exceptions import Conflict
from portal.models import AuditEvent, Team
from portal.services import audit_event

logger = logging.getLogger(__name__)

QUOTA_PAGE = "/accounting/quotas/"


def gpu_hours_text(value) -> str:
    """GPU-hours for messages: one decimal place ("16.0", "3.5")."""
    return f"{Decimal(value).quantize(Decimal('0.1'), ROUND_HALF_UP)}"


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
    """One job's hold: its id (the jobs app's Job pk), its estimate (``gpu_hours``, ``gpu_type``,
    ``gpu_type_assumed``, ``cost``: a jobs.estimate.JobQuote) and the booking it runs in."""

    job_uuid: uuid.UUID
    estimate: object
    booking_id: uuid.UUID | None = None

    @property
    def gpu_type(self) -> str:
        """The type the job asked for ("" = any: its estimate's dearest type is an assumption)."""
        return "" if getattr(self.estimate, "gpu_type_assumed", False) else (getattr(self.estimate, "gpu_type", "") or "")


_SIX = Decimal("0.000001")


def _hours(value) -> Decimal:
    return Decimal(value).quantize(_SIX, ROUND_HALF_UP)


def _place_sql(holds: list[tuple], increments: dict[str, Decimal], *, team_id: int, at: dt.datetime) -> tuple[str, list]:
    """One statement: lock the team row FOR KEY SHARE (placements of a team run side by side; a quota
    approval or booking, which lock it FOR UPDATE, waits for them), insert the holds, lock the
    team's totals of periods not over yet in id order and add the holds to them. Returns the totals
    with their new figures."""
    params: list = []
    values = []
    for job_uuid, gpu_type, booking_id, estimate, cost, held, placed_at in holds:
        values.append("(%s::uuid, %s, %s::uuid, %s::numeric, %s::numeric, %s::numeric, %s::timestamptz)")
        params += [job_uuid, gpu_type, booking_id, estimate, cost, held, placed_at]
    sql = (
        "WITH team AS (SELECT id FROM portal_team WHERE id = %s FOR KEY SHARE), "
        "holds AS (INSERT INTO accounting_budgethold (job_uuid, team_id, gpu_type, booking_id, estimated_gpu_hours, "
        "estimated_cost, held_gpu_hours, created_at) SELECT v.job_uuid, team.id, v.gpu_type, v.booking_id, v.est, v.cost, "
        f"v.held, v.at FROM team, (VALUES {', '.join(values)}) AS v(job_uuid, gpu_type, booking_id, est, cost, held, at) "
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
        "FROM locked, inc WHERE t.id = locked.id AND t.gpu_type = inc.gpu_type "
        "RETURNING t.id, t.team_id, t.gpu_type, t.period_start, t.period_end, t.held_gpu_hours, t.used_gpu_hours"
    )
    return sql, head + params + inc_params + [at, at]


def _increments(rows: Iterable[tuple[str, Decimal]]) -> dict[str, Decimal]:
    """What holds add to a team's totals per GPU type: all of them to "" (every type), each to its type."""
    out: dict[str, Decimal] = {}
    for gpu_type, held in rows:
        if held <= 0:
            continue
        out[""] = out.get("", Decimal(0)) + held
        if gpu_type:
            out[gpu_type] = out.get(gpu_type, Decimal(0)) + held
    return out


def _total_build(*, team: Team, quota, at: dt.datetime, increment: Decimal) -> BudgetTotal:
    """The running total of a quota's key, built from usage and holds (this transaction's new holds
    included), or — when another placement built it meanwhile — that one with ``increment`` added.
    Locked either way. Once per team, GPU type and period."""
    key = {"team_id": team.pk, "gpu_type": quota.gpu_type, "period_start": quota.period_start, "period_end": quota.period_end}
    used, held = budget_total_figures(team=team, gpu_type=quota.gpu_type, period_start=quota.period_start,
                                      period_end=quota.period_end)  # fmt: skip
    total = BudgetTotal(**key, ends_at=billing_midnight(quota.period_end), held_gpu_hours=_hours(held),
                        used_gpu_hours=_hours(used), updated_at=at)  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounting_budgettotal (team_id, gpu_type, period_start, period_end, ends_at, held_gpu_hours, "
            "used_gpu_hours, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (team_id, gpu_type, period_start, period_end) DO NOTHING RETURNING id",
            [team.pk, quota.gpu_type, quota.period_start, quota.period_end, total.ends_at, total.held_gpu_hours,
             total.used_gpu_hours, at],
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

    Queries: one statement locks the team's running totals (BudgetTotal, one row per quota key),
    inserts the holds and adds them; one reads the quotas in force; one reads the bookings' booked
    hours (only when bookings charge reserved hours) — three, whatever the number of jobs, live jobs
    and usage records. The first hold of a team's period builds its total from usage and holds (once)."""
    at = at or timezone.now()
    covered = bookings_charge_reserved()
    rows = []
    for hold in holds:
        estimate = _hours(hold.estimate.gpu_hours)
        cost = getattr(hold.estimate, "cost", None)
        held = Decimal(0) if (hold.booking_id is not None and covered) else estimate
        rows.append((hold.job_uuid, hold.gpu_type, hold.booking_id, estimate, cost, held, at))
    increments = _increments((gpu_type, held) for _, gpu_type, _, _, _, held, _ in rows)
    # the quotas in force, read before the totals' lock so that it is held for as little as can be:
    # a quota is changed under the team's row lock, which the locking statement waits for
    effective = quotas_effective(team=team, at=at) if increments else {}
    with transaction.atomic(savepoint=False):
        sql, params = _place_sql(rows, increments, team_id=team.pk, at=at)
        with prepared_cursor() as cursor:
            cursor.execute(sql, params)
            returned = cursor.fetchall() if increments else []
        if not increments:
            return  # every job runs in a booking that carries its charge
        totals = {
            (team_id, gpu_type, start, end): BudgetTotal(pk=pk, team_id=team_id, gpu_type=gpu_type, period_start=start,
                                                         period_end=end, held_gpu_hours=held, used_gpu_hours=used)
            for pk, team_id, gpu_type, start, end, held, used in returned
        }  # fmt: skip
        checked: dict[int, object] = {}
        for job_type in sorted({gpu_type for _, gpu_type, _, _, _, held, _ in rows if held > 0}):
            applicable = [q for key, q in effective.items() if key[1] == "" or (job_type and key[1] == job_type)]
            if not applicable:
                if no_quota_unlimited():
                    continue
                start, _ = current_month(at)
                what = "GPU quota" if not effective else f"GPU quota covering {job_type or 'any-type'} GPUs"
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
        for row in budget_rows(quotas, at=at, totals=before):
            needs = increments.get(row["gpu_type"], Decimal(0))
            if needs > row["remaining"]:
                raise over_budget(row=row, needs=needs, subject="", measure="The job needs", span="time limit",
                                  fix={"time_limit_minutes": ["Ask for fewer GPUs or a shorter time limit."]})  # fmt: skip


def _totals_apply(*, deltas: Sequence[tuple[int, str, dt.datetime, Decimal]], used: dict | None = None,
                  team_ids: Iterable[int] = (), since: dt.datetime | None = None, at: dt.datetime) -> int:  # fmt: skip
    """Apply held deltas (team id, GPU type asked, hold placed at, delta) to the totals that count
    those holds (the team's; "" and the type; periods ending after the hold was placed), and set
    ``used`` (by total id) — under the totals' row locks, taken in id order. Two queries (lock, one
    bulk UPDATE) whatever the number of holds."""
    deltas = [d for d in deltas if d[3] != 0]
    teams = {d[0] for d in deltas} | set(team_ids)
    if not teams:
        return 0
    oldest = min([d[2] for d in deltas] + ([since] if since is not None else []))
    locked = list(BudgetTotal.objects.select_for_update().filter(team_id__in=teams, ends_at__gt=oldest).order_by("pk"))
    changed = []
    for total in locked:
        held = Decimal(total.held_gpu_hours)
        for team_id, gpu_type, placed_at, delta in deltas:
            if team_id == total.team_id and total.ends_at > placed_at and total.gpu_type in ("", gpu_type):
                held += delta
        new_used = (used or {}).get(total.pk, total.used_gpu_hours)
        if held != total.held_gpu_hours or new_used != total.used_gpu_hours:
            total.held_gpu_hours, total.used_gpu_hours, total.updated_at = max(held, Decimal(0)), new_used, at
            changed.append(total)
    if changed:
        BudgetTotal.objects.bulk_update(changed, ["held_gpu_hours", "used_gpu_hours", "updated_at"])
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
            BudgetHold.objects.select_for_update().filter(job_uuid__in=wanted, released_at__isnull=True).order_by("job_uuid")
        )
        if not holds:
            return 0
        BudgetHold.objects.filter(job_uuid__in=[h.job_uuid for h in holds]).update(released_at=at, held_gpu_hours=0)
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


def budget_holds_convert(*, ingested: dict, final: set, team_ids: Iterable[int], since: dt.datetime | None,
                         at: dt.datetime) -> None:  # fmt: skip
    """Usage ingestion: the GPU-hours ingested for portal jobs (``ingested``: job uuid → all their
    records' GPU-hours so far) move from held to used — a hold keeps its estimate minus that (never
    below 0) — and a job with a final record (``final``) releases its hold. The totals of
    ``team_ids`` (teams with new or changed usage) of periods ending after ``since`` get their
    ``used`` figures again from the slices. Call inside the ingestion's transaction."""
    covered = bookings_charge_reserved()
    holds = list(
        BudgetHold.objects.select_for_update().filter(job_uuid__in=list(ingested), released_at__isnull=True).order_by("job_uuid")
    ) if ingested else []  # fmt: skip
    deltas, changed = [], []
    for hold in holds:
        done = hold.job_uuid in final
        if done or (hold.booking_id is not None and covered):
            held = Decimal(0)
        else:
            held = max(Decimal(hold.estimated_gpu_hours) - Decimal(ingested[hold.job_uuid]), Decimal(0))
        if held != hold.held_gpu_hours or done:
            deltas.append((hold.team_id, hold.gpu_type, hold.created_at, held - hold.held_gpu_hours))
            hold.held_gpu_hours, hold.released_at = held, (at if done else None)
            changed.append(hold)
    if changed:
        BudgetHold.objects.bulk_update(changed, ["held_gpu_hours", "released_at"])
    team_ids = set(team_ids)
    used: dict[int, Decimal] = {}
    if team_ids and since is not None:
        for total in BudgetTotal.objects.filter(team_id__in=team_ids, ends_at__gt=since).select_related("team"):
            figures = budget_total_figures(team=total.team, gpu_type=total.gpu_type, period_start=total.period_start,
                                           period_end=total.period_end, held=False)  # fmt: skip
            used[total.pk] = _hours(figures[0])
    if deltas or used:
        _totals_apply(deltas=deltas, used=used, team_ids=team_ids if used else (), since=since, at=at)
