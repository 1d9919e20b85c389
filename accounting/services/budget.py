"""Budget enforcement in the portal: a job's estimate (``budget_hold_check``) and a booking's reserved
hours (accounting.services.bookings) must fit budget − used − held − booked
(accounting.selectors.budgets.budget_rows). The one wording of "over budget" and "no quota" refusals.
Enforcement in Slurm (association limits) is accounting.services.slurm_limits."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db import transaction

from accounting.calendar import current_month
from accounting.charging import bookings_charge_reserved
from accounting.selectors.budgets import budget_rows, quotas_effective
from portal.exceptions import Conflict
from portal.models import Team

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


def budget_hold_check(*, team: Team, estimate, booking_id=None, at: dt.datetime | None = None) -> None:
    """Refuse (Conflict, 409) a job whose estimate does not fit the team's budget.

    Called by jobs.services.job_submit INSIDE its transaction, before the job row is inserted: the
    team row is locked (SELECT … FOR UPDATE) so concurrent submissions for one team are serialised —
    the next one sees the committed job in ``held``. For each quota that applies (the any-type quota,
    and the job's type's quota when the job asked for a type), ``estimate.gpu_hours`` must fit in
    budget − used − held − booked (accounting.selectors.budget_rows). Without an applicable approved
    quota, QUOTA_NO_QUOTA_POLICY decides (blocked: 409 asking a manager to request one). A job inside
    a booking is covered by the booking when bookings are charged by their reserved hours."""
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        effective = quotas_effective(team=team, at=at)
        if booking_id is not None and bookings_charge_reserved():
            return
        job_type = "" if getattr(estimate, "gpu_type_assumed", False) else (estimate.gpu_type or "")
        applicable = [q for key, q in effective.items() if key[1] == "" or (job_type and key[1] == job_type)]
        if not applicable:
            if no_quota_unlimited():
                return
            start, _ = current_month(at)
            what = "GPU quota" if not effective else f"GPU quota covering {job_type or 'any-type'} GPUs"
            raise no_quota(team=team, what=what, when=f"for {start:%Y-%m}")
        needs = Decimal(estimate.gpu_hours)
        for row in budget_rows(sorted(applicable, key=lambda q: q.gpu_type), at=at):
            if needs > row["remaining"]:
                raise over_budget(row=row, needs=needs, subject="", measure="The job needs", span="time limit",
                                  fix={"time_limit_minutes": ["Ask for fewer GPUs or a shorter time limit."]})  # fmt: skip
