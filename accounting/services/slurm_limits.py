"""Budget enforcement in the schedulers: the association limits (GrpTRESMins / GrpTRES gres/gpu[:type]) the
quotas in force call for, the drift between them and what Slurm holds (slurm_reconcile), applying them
(accounting.tasks.quota_mirror_task) and the roll-over at a new quota period.

On a Kubernetes cluster (issue 41) the same limits are mirrored, through the same functions, to the
team's namespace: the gateway holds what a namespace can (``association_limits_held``: the cap on
GPUs at once as the ResourceQuota ``requests.nvidia.com/gpu``); the GPU-hour budget stays the
portal's own there (its budget holds, as for every job)."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import replace
from decimal import Decimal

from django.utils import timezone

from accounting.models import Quota, QuotaState
from accounting.selectors.budgets import quotas_effective
from portal.models import SyncStatus, Team
from portal.selectors import team_cluster_accounts
from portal.slurm import AssociationLimits, NotPermitted, SlurmRejected, cluster_config, configured_clusters, get_gateway

logger = logging.getLogger(__name__)
ROLLOVER_KIND = "quota-rollover"


def quota_expected_limits(*, team: Team, at: dt.datetime | None = None):
    """The association limits the team's quotas in force call for: GrpTRESMins gres/gpu[:type] =
    budget minutes, GrpTRES gres/gpu[:type] = the cap. No quota: no limits."""
    quotas = quotas_effective(team=team, at=at).values()
    return AssociationLimits(
        account=team.slurm_account,
        grp_tres_mins={q.slurm_tres: int(Decimal(q.gpu_hours) * 60) for q in quotas},
        grp_tres={q.slurm_tres: q.max_gpus for q in quotas if q.max_gpus is not None},
    )


def _managed(limits: dict) -> dict:
    return {k: v for k, v in (limits or {}).items() if k == "gres/gpu" or k.startswith("gres/gpu:")}


def _quota_teams() -> list[Team]:
    """Teams that have (or had) an approved quota: the accounts whose GPU limits the portal owns."""
    ids = Quota.objects.filter(state__in=[QuotaState.APPROVED, QuotaState.SUPERSEDED, QuotaState.CANCELLED],
                               approved_at__isnull=False).values("team_id")  # fmt: skip
    return list(Team.objects.filter(pk__in=ids).order_by("slug"))


def _mirrors(team: Team) -> list[tuple[str, str]]:
    """(cluster, the team's account there) where its limits are mirrored: the default Slurm cluster's
    associations (Team.slurm_account), and the namespace's ResourceQuota on each Kubernetes cluster
    the team has one on (issue 41: its cap on GPUs at once; TeamClusterAccount). One query."""
    kubernetes = {config.name for config in configured_clusters() if config.is_kubernetes}
    default = cluster_config().name
    return [(name, account) for name, account in team_cluster_accounts(team).items() if name == default or name in kubernetes]


def _drift_of(team: Team, cluster: str, account: str, gateway) -> tuple[object, list[str]]:
    """The limits the team's quotas call for on one cluster (what its scheduler can hold of them),
    and a line per difference from what the scheduler holds."""
    wanted = quota_expected_limits(team=team)
    expected = gateway.association_limits_held(replace(wanted, account=account))
    kubernetes = cluster_config(cluster).is_kubernetes
    try:
        actual = gateway.association_limits_get(account)
    except (SlurmRejected, NotPermitted) as exc:
        if not kubernetes:
            raise
        # a namespace the portal may not read (no RoleBinding there): said, and the other teams go on
        return expected, [f"quota limits of namespace {account} on {cluster}: cannot be read: {exc.message}"]
    lines = []
    for label, want, have in (
        ("GrpTRESMins", expected.grp_tres_mins, _managed(actual.grp_tres_mins)),
        ("GrpTRES", expected.grp_tres, _managed(actual.grp_tres)),
    ):
        for key in sorted(set(want) | set(have)):
            if want.get(key) != have.get(key):
                if kubernetes:
                    lines.append(
                        f"quota limits of namespace {account} on {cluster}: ResourceQuota requests.nvidia.com/gpu is "
                        f"{have.get(key, 'unset')} in Kubernetes, the portal expects {want.get(key, 'unset')}"
                    )  # fmt: skip
                else:
                    lines.append(
                        f"quota limits of account {account}: {label} {key} is "
                        f"{have.get(key, 'unset')} in Slurm, the portal expects {want.get(key, 'unset')}"
                    )
    return expected, lines


def quota_limit_drift() -> list[str]:
    """Differences between the limits the portal's quotas call for and what the schedulers hold —
    Slurm's associations, a Kubernetes namespace's ResourceQuota — for every team with a quota (one
    read per team and cluster). For slurm_reconcile."""
    lines = []
    for team in _quota_teams():
        for cluster, account in _mirrors(team):
            lines.extend(_drift_of(team, cluster, account, get_gateway(cluster))[1])
    return lines


def quota_limits_apply(*, teams: list[Team] | None = None, force: bool = False) -> list[str]:
    """Set the expected limits on every team's account (and namespace) that drifted (``force``: on
    all of them). Returns what was fixed. Idempotent (sacctmgr modify, a ResourceQuota patched, to
    the same values)."""
    fixed = []
    for team in teams if teams is not None else _quota_teams():
        for cluster, account in _mirrors(team):
            gateway = get_gateway(cluster)
            expected, lines = _drift_of(team, cluster, account, gateway)
            if lines or force:
                try:
                    gateway.association_limits_set(expected)
                except (SlurmRejected, NotPermitted) as exc:
                    if not cluster_config(cluster).is_kubernetes:
                        raise
                    logger.warning("team %s: quota limits not mirrored to %s: %s", team.slug, cluster, exc.message)
                    continue
                fixed.extend(f"fixed: {line}" for line in lines)
        Quota.objects.filter(team=team, state=QuotaState.APPROVED).update(slurm_mirrored_at=timezone.now())
    return fixed


def quota_period_rollover(*, at: dt.datetime | None = None) -> list[str]:
    """At a new period: reset the Slurm usage of each quota team's account (its GrpTRESMins count from
    0 again) and mirror the new period's limits. The period of a team is that of its any-type quota in
    force (or the earliest-starting typed one); a team seen for the first time is only recorded (its
    Slurm usage of the running period stays). The cluster's PriorityUsageResetPeriod=MONTHLY resets
    usage at each calendar month too; this covers non-calendar periods and a missed reset. Idempotent:
    the last period reset per account is kept in SyncStatus(kind="quota-rollover")."""
    gateway = get_gateway()
    status, _ = SyncStatus.objects.get_or_create(kind=ROLLOVER_KIND)
    seen = dict(status.data.get("accounts", {}))
    effective = quotas_effective(at=at)
    starts: dict[int, dt.date] = {}
    for (team_id, gpu_type), quota in effective.items():
        if gpu_type == "" or team_id not in starts:
            starts[team_id] = quota.period_start if gpu_type == "" else min(starts.get(team_id, quota.period_start), quota.period_start)
    done = []
    for team in _quota_teams():
        period = starts.get(team.pk)
        key = period.isoformat() if period else ""
        previous = seen.get(team.slurm_account)
        if period and previous is not None and previous != key:
            gateway.account_usage_reset(team.slurm_account)
            done.append(f"reset usage of account {team.slurm_account} for the period from {key}")
        seen[team.slurm_account] = key
    done.extend(quota_limits_apply())
    SyncStatus.objects.filter(pk=status.pk).update(data={**status.data, "accounts": seen}, last_success_at=timezone.now(),
                                                   last_attempt_at=timezone.now())  # fmt: skip
    return done

