"""Quotas: requested by a team's managers, approved, rejected or cancelled by admins.

A quota is a team's GPU-hour budget for a period (a calendar month by default), for any GPU type
or one type, with an optional cap on GPUs in use at once. Managers request, admins approve or
reject; a newer approval for the same team, type and period supersedes the older one. Approved
quotas are enforced twice: by the portal at submission (budget_holds_place, inside job_submit's
transaction, under the row locks of the team's running totals) and by Slurm (GrpTRESMins / GrpTRES on the team's
account, mirrored by accounting.tasks.quota_mirror_task; quota_limit_drift / quota_limits_apply
for slurm_reconcile; quota_period_rollover at a new period)."""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from accounting.calendar import current_month, next_month
from accounting.models import Quota, QuotaState
from portal.exceptions import ApplicationError, Conflict
from portal.models import NodeInfo, Team
from portal.outbox import after_commit
from portal.roles import is_admin, is_manager
from portal.services import audit_record

logger = logging.getLogger(__name__)


def _forbidden(message: str) -> ApplicationError:
    return ApplicationError(message, status_code=403)


@transaction.atomic
def quota_request(
    *,
    team: Team,
    user,
    gpu_hours,
    gpu_type: str = "",
    period_start: dt.date | None = None,
    period_end: dt.date | None = None,
    max_gpus: int | None = None,
    justification: str = "",
    request=None,
):
    """A manager of the team (or an admin) asks for a budget. Period: the current calendar month
    unless given ([period_start, period_end), end exclusive)."""
    if not (is_admin(user) or is_manager(user, team)):
        raise _forbidden(f"Only managers of {team.name} can request a quota.")
    errors: dict[str, list[str]] = {}
    default_start, default_end = current_month()
    period_start = period_start or default_start
    period_end = period_end or (default_end if period_start == default_start else next_month(period_start))
    if period_end <= period_start:
        errors["period_end"] = ["The period must end after it starts."]
    try:
        gpu_hours = Decimal(str(gpu_hours))
    except (ArithmeticError, ValueError, TypeError):
        gpu_hours = None
    if gpu_hours is None or not gpu_hours.is_finite() or gpu_hours < 0 or gpu_hours >= Decimal("1e10"):
        errors["gpu_hours"] = ["Give a number of GPU-hours (0 or more)."]
    if max_gpus is not None and (isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 0):
        errors["max_gpus"] = ["Give a whole number of GPUs (0 or more), or leave it empty."]
    gpu_type = (gpu_type or "").strip()
    known_types = set(NodeInfo.objects.exclude(gpu_type="").values_list("gpu_type", flat=True))
    if gpu_type and known_types and gpu_type not in known_types:
        errors["gpu_type"] = [f"Unknown GPU type {gpu_type!r} (types: {', '.join(sorted(known_types))})."]
    justification = (justification or "").strip()
    if not justification:
        errors["justification"] = ["Say what the GPU-hours are for."]
    if errors:
        first = next(iter(errors.values()))[0]
        raise ApplicationError(f"The quota cannot be requested: {first}", errors=errors)
    quota = Quota.objects.create(
        team=team, gpu_type=gpu_type, period_start=period_start, period_end=period_end, gpu_hours=gpu_hours,
        max_gpus=max_gpus, justification=justification[:5000], requested_by=user, state=QuotaState.REQUESTED,
    )  # fmt: skip
    audit_record(
        actor=user, action="quota.request", target=quota, team=team, request=request,
        data={"gpu_type": gpu_type, "period": quota.period_label, "gpu_hours": str(gpu_hours), "max_gpus": max_gpus},
    )  # fmt: skip
    return quota


def _quota_for_decision(quota_id):
    """The quota row, locked, with its team row locked first (FOR UPDATE: it waits for the budget
    holds being placed, which hold the team row FOR KEY SHARE, and they wait for it)."""
    team_id = Quota.objects.filter(pk=quota_id).values_list("team_id", flat=True).first()
    if team_id is None:
        raise ApplicationError("No such quota.", status_code=404)
    Team.objects.select_for_update().filter(pk=team_id).first()
    return Quota.objects.select_for_update().select_related("team").get(pk=quota_id)


@transaction.atomic
def quota_approve(*, quota, user, comment: str = "", request=None):
    """An admin approves a requested quota: it takes effect now, the approved quota of the same team,
    type and period (if any) becomes SUPERSEDED, and Slurm's limits are mirrored after commit."""
    if not is_admin(user):
        raise _forbidden("Only admins can approve quotas.")
    quota = _quota_for_decision(getattr(quota, "pk", quota))
    if quota.state != QuotaState.REQUESTED:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}, not awaiting approval.",
                       errors={"state": [quota.state]})  # fmt: skip
    now = timezone.now()
    older = list(
        type(quota).objects.select_for_update().filter(
            team_id=quota.team_id, gpu_type=quota.gpu_type, period_start=quota.period_start,
            period_end=quota.period_end, state=QuotaState.APPROVED,
        )
    )  # fmt: skip
    for old in older:
        type(quota).objects.filter(pk=old.pk).update(state=QuotaState.SUPERSEDED, superseded_by=quota)
        audit_record(actor=user, action="quota.supersede", target=old, team=quota.team, request=request,
                     data={"superseded_by": quota.pk})  # fmt: skip
    type(quota).objects.filter(pk=quota.pk).update(
        state=QuotaState.APPROVED, decided_by=user, decided_at=now, approved_at=now, decision_comment=(comment or "")[:1000]
    )
    quota.refresh_from_db()
    audit_record(
        actor=user, action="quota.approve", target=quota, team=quota.team, request=request,
        data={"comment": comment or "", "gpu_hours": str(quota.gpu_hours), "gpu_type": quota.gpu_type,
              "period": quota.period_label, "max_gpus": quota.max_gpus, "superseded": [o.pk for o in older]},
    )  # fmt: skip
    after_commit("accounting.tasks.quota_mirror_task", quota.team_id)
    return quota


@transaction.atomic
def quota_reject(*, quota, user, comment: str, request=None):
    """An admin rejects a requested quota, saying why."""
    if not is_admin(user):
        raise _forbidden("Only admins can reject quotas.")
    if not (comment or "").strip():
        raise ApplicationError("Say why the quota is rejected.", errors={"comment": ["Say why the quota is rejected."]})
    quota = _quota_for_decision(getattr(quota, "pk", quota))
    if quota.state != QuotaState.REQUESTED:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}, not awaiting approval.",
                       errors={"state": [quota.state]})  # fmt: skip
    type(quota).objects.filter(pk=quota.pk).update(
        state=QuotaState.REJECTED, decided_by=user, decided_at=timezone.now(), decision_comment=comment.strip()[:1000]
    )
    quota.refresh_from_db()
    audit_record(actor=user, action="quota.reject", target=quota, team=quota.team, request=request,
                 data={"comment": quota.decision_comment})  # fmt: skip
    return quota


@transaction.atomic
def quota_cancel(*, quota, user, request=None, withdraw: bool = False):
    """Withdraw a request (its team's managers, admins) or revoke an approved quota (admins; Slurm's
    limits are mirrored again after commit). ``withdraw``: only a request awaiting approval (the
    "Withdraw" of the quota page and API; 409 for any other state)."""
    quota = _quota_for_decision(getattr(quota, "pk", quota))
    if withdraw and quota.state != QuotaState.REQUESTED:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}: only a request awaiting approval can be withdrawn.",
                       errors={"state": [quota.state]})  # fmt: skip
    if quota.state == QuotaState.REQUESTED:
        allowed = is_admin(user) or is_manager(user, quota.team)
    elif quota.state == QuotaState.APPROVED:
        allowed = is_admin(user)
    else:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}.", errors={"state": [quota.state]})
    if not allowed:
        raise _forbidden("You may not cancel this quota.")
    was = quota.state
    type(quota).objects.filter(pk=quota.pk).update(state=QuotaState.CANCELLED, decided_by=user, decided_at=timezone.now())
    quota.refresh_from_db()
    audit_record(actor=user, action="quota.cancel", target=quota, team=quota.team, request=request, data={"was": was})
    if was == QuotaState.APPROVED:
        after_commit("accounting.tasks.quota_mirror_task", quota.team_id)
    return quota

