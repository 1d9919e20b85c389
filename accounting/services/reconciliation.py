"""The portal's usage against Slurm's own report, per cluster, over the hours that cluster's slurmdbd
has rolled up.

sreport reads slurmdbd's hourly roll-up. How far that roll-up goes is read from the cluster itself
(``rolled_up_to``: sreport's cluster Utilization has a row for every rolled-up hour, none for the
others), never assumed from the clock: a slurmdbd that stopped rolling up (issue 34: the local 25.11
daemon) leaves sreport short, and comparing the portal with that is a false difference. So each
cluster is compared with its own sreport over [month start, its roll-up), and a roll-up older than
ACCOUNTING_ROLLUP_STALE_MINUTES is reported as stale, not as a difference."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from accounting.calendar import billing_midnight, next_month
from accounting.selectors.rollup import ROLLUP_KIND, reroll_pending, rollup_message
from accounting.selectors.usage import account_gpu_seconds
from portal.models import SyncStatus
from portal.services import sync_record_failure, sync_record_success
from portal.slurm import SlurmError, cluster_config, get_gateway, slurm_clusters


def _hour_floor(at: dt.datetime) -> dt.datetime:
    return at.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def rolled_up_to(*, cluster: str | None = None, now: dt.datetime | None = None) -> dt.datetime | None:
    """The end of the last hour the cluster's slurmdbd has rolled up (None: none of the last
    ACCOUNTING_ROLLUP_SEARCH_HOURS). One sreport call when the roll-up is current (the hour before
    ``now``'s is rolled up); when it is not, one more per hour further back. Roll-ups advance hour by
    hour, so the hours before the last rolled-up one are rolled up too."""
    gateway = get_gateway(cluster)
    hour = _hour_floor(now or timezone.now())
    for back in range(settings.ACCOUNTING_ROLLUP_SEARCH_HOURS):
        end = hour - dt.timedelta(hours=back)
        if gateway.usage_rolled_up(end - dt.timedelta(hours=1), end):
            return end
    return None


def rollup_record(*, cluster: str | None = None, now: dt.datetime | None = None) -> dt.datetime | None:
    """Read the cluster's roll-up and record it (SyncStatus "rollup" / "rollup:NAME", which /healthz
    and the cluster pages show through accounting.selectors.rollup_status). A Slurm error is recorded
    as that row's failure and raised."""
    name = cluster_config(cluster).name
    kind = SyncStatus.kind_for(ROLLUP_KIND, name)
    try:
        to = rolled_up_to(cluster=name, now=now)
    except SlurmError as exc:
        sync_record_failure(kind, error=f"{type(exc).__name__}: {exc.message}")
        raise
    sync_record_success(kind, data={"rolled_up_to": to.isoformat() if to else None})
    return to


@dataclass
class ClusterReconciliation:
    """One cluster's comparison: the portal's GPU-seconds and sreport's GPU-minutes per account over
    [start, end) (end = start: nothing comparable yet), the roll-up it was cut at, and ``stale``
    (the message when that roll-up is older than it should be)."""

    cluster: str
    start: dt.datetime
    end: dt.datetime
    rolled_up_to: dt.datetime | None
    stale: str = ""
    portal: dict[str, Decimal] = field(default_factory=dict)
    sreport: dict[str, int] = field(default_factory=dict)
    differences: list[tuple[str, Decimal, Decimal]] = field(default_factory=list)

    @property
    def accounts(self) -> list[str]:
        return sorted(set(self.portal) | set(self.sreport))


def differences(portal_seconds: dict[str, Decimal], sreport_minutes: dict[str, int], *, tolerance: Decimal) -> list[tuple]:
    rows = []
    for account in sorted(set(portal_seconds) | set(sreport_minutes)):
        mine = Decimal(portal_seconds.get(account, 0)) / 60
        theirs = Decimal(sreport_minutes.get(account, 0))
        if abs(mine - theirs) > tolerance:
            rows.append((account, mine, theirs))
    return rows


def usage_reconcile(
    *, month: dt.date, now: dt.datetime | None = None, clusters: list[str] | None = None,
    tolerance: Decimal = Decimal("1"),
) -> list[ClusterReconciliation]:  # fmt: skip
    """Each cluster (every configured one, or ``clusters``) against its own sreport over the hours of
    ``month`` that its slurmdbd has rolled up. Raises SlurmError when a cluster does not answer."""
    now = now or timezone.now()
    month_begin, month_end = billing_midnight(month), billing_midnight(next_month(month))
    names = clusters or [config.name for config in slurm_clusters()]
    names = [name for name in names if not cluster_config(name).is_kubernetes]  # no sreport: kubernetes_usage_reconcile
    results = []
    for name in names:
        name = cluster_config(name).name
        to = rolled_up_to(cluster=name, now=now)
        end = max(month_begin, min(month_end, to)) if to is not None else month_begin
        stale, message = rollup_message(to, cluster=name, now=now)
        message = message if stale and end < month_end else ""
        if pending := reroll_pending(to, cluster=name):  # sreport's hours are being rolled up again
            end, message = month_begin, pending
        result = ClusterReconciliation(cluster=name, start=month_begin, end=end, rolled_up_to=to, stale=message)
        if end > month_begin:
            result.sreport = get_gateway(name).account_gpu_minutes(month_begin, end)
            result.portal = account_gpu_seconds(start_at=month_begin, end_at=end, cluster=name)
            result.differences = differences(result.portal, result.sreport, tolerance=tolerance)
        results.append(result)
    return results


def kubernetes_usage_reconcile(*, cluster: str, since: dt.datetime, until: dt.datetime | None = None) -> list[str]:
    """A Kubernetes cluster's usage against the API's own records (issue 41): it has no sreport, so
    each ended Job the API still holds, submitted in [since, until) — its pod's start and end × its
    GPUs — is compared with the portal's record of that Job (the same key as the ingestion's). A
    line per difference: a Job with no record, a record still open, other GPU-seconds. A Job the API
    no longer has (a cancel deletes it) cannot be compared. One accounting read, one query."""
    from accounting.models import UsageRecord
    from accounting.services.ingestion import RUNNING_STATES

    until = until or timezone.now()
    ended = [
        r for r in get_gateway(cluster).accounting(since, until)
        if r.start_time and r.end_time and r.state not in RUNNING_STATES and since <= r.submit_time < until
    ]  # fmt: skip
    stored = {
        (job_id, submit_time): (gpu_seconds, provisional)
        for job_id, submit_time, gpu_seconds, provisional in UsageRecord.objects.filter(
            cluster=cluster, job_id__in=[r.job_id for r in ended]
        ).values_list("job_id", "submit_time", "gpu_seconds", "provisional")
    }  # fmt: skip
    lines = []
    for r in ended:
        theirs = r.gpus * max(int((r.end_time - r.start_time).total_seconds()), 0)
        mine = stored.get((r.job_id, r.submit_time))
        where = f"{cluster}: job {r.job_id} in namespace {r.account}"
        if mine is None:
            lines.append(f"{where}: {theirs} GPU-seconds in Kubernetes, no usage record in the portal")
        elif mine[1]:
            lines.append(f"{where}: ended in Kubernetes ({r.state}), its usage record is still open")
        elif mine[0] != theirs:
            lines.append(f"{where}: {theirs} GPU-seconds in Kubernetes, {mine[0]} in the portal")
    return lines
