"""How current each cluster's accounting roll-up is (what sreport-based figures can know), from what
the periodic check recorded (accounting.services.rollup_record, SyncStatus "rollup" / "rollup:NAME").
One rule for /healthz, the admin's cluster list and the reconciliation: ``rollup_message``."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from accounting.models import UsageRecord
from portal.models import SyncStatus
from portal.slurm import cluster_config

ROLLUP_KIND = "rollup"
# When the portal last had Slurm fix runaway jobs on a cluster (jobs.services.sync, ``sacctmgr -i show
# runawayjobs``): SyncStatus "runaway_fix" / "runaway_fix:NAME", its last_success_at.
RUNAWAY_FIX_KIND = "runaway_fix"


@dataclass(frozen=True)
class RollupStatus:
    cluster: str
    rolled_up_to: dt.datetime | None  # end of the last hour slurmdbd has rolled up
    checked_at: dt.datetime | None  # when the portal last read it (None: never)
    stale: bool
    message: str

    def as_dict(self) -> dict:
        return {
            "rolled_up_to": self.rolled_up_to.isoformat() if self.rolled_up_to else None,
            "checked_at": self.checked_at.isoformat() if self.checked_at else None,
            "stale": self.stale,
            "message": self.message,
        }


def rollup_message(rolled_up_to: dt.datetime | None, *, cluster: str, now: dt.datetime) -> tuple[bool, str]:
    """(stale, what to say). Stale: the last rolled-up hour ended more than
    ACCOUNTING_ROLLUP_STALE_MINUTES ago (slurmdbd rolls up at every full hour: 70 min allows a late
    one), or nothing is rolled up while the portal holds usage of this cluster from before the last
    full hour (there was something to roll up)."""
    limit = dt.timedelta(minutes=settings.ACCOUNTING_ROLLUP_STALE_MINUTES)
    if rolled_up_to is None:
        last_hour = now.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
        had_usage = UsageRecord.objects.filter(cluster=cluster, start_time__lt=last_hour).exists()
        hours = settings.ACCOUNTING_ROLLUP_SEARCH_HOURS
        if had_usage:
            return True, f"sreport has not rolled up any hour of the last {hours} h on cluster {cluster}"
        return False, f"sreport has rolled up no hour yet on cluster {cluster}"
    when = rolled_up_to.astimezone(dt.UTC)
    if now - rolled_up_to > limit:
        return True, f"sreport has not rolled up since {when:%Y-%m-%d %H:%M} UTC on cluster {cluster}"
    return False, f"sreport has rolled up to {when:%Y-%m-%d %H:%M} UTC"


def reroll_pending(rolled_up_to: dt.datetime | None, *, cluster: str) -> str:
    """What to say while sreport still holds figures that Slurm's runaway fix has made wrong ("" when
    nothing is pending). The fix sets slurmdbd's roll-up marker back (to the start of the week of the
    runaway's start, measured on 22.05 and 25.11) and the next hourly roll-up rolls those hours up
    again; until then sreport counts a fixed runaway as running where sacct and the portal end it at its
    start. That roll-up covers the hour the fix ran in, so the re-roll is done once the cluster's roll-up
    reaches that hour's end."""
    row = SyncStatus.objects.filter(kind=SyncStatus.kind_for(RUNAWAY_FIX_KIND, cluster)).first()
    if row is None or row.last_success_at is None:
        return ""
    fixed_at = row.last_success_at.astimezone(dt.UTC)
    rerolled_by = fixed_at.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    if rolled_up_to is not None and rolled_up_to >= rerolled_by:
        return ""
    return (f"Slurm's runaway jobs were fixed at {fixed_at:%Y-%m-%d %H:%M} UTC on cluster {cluster}: sreport is "
            f"rolled up again by slurmdbd's first roll-up after {rerolled_by:%H:%M} UTC, and its figures are not "
            "compared until then")


def rollup_status(cluster: str | None = None, *, now: dt.datetime | None = None) -> RollupStatus:
    name = cluster_config(cluster).name
    now = now or timezone.now()
    row = SyncStatus.objects.filter(kind=SyncStatus.kind_for(ROLLUP_KIND, name)).first()
    if row is None or row.last_success_at is None:
        return RollupStatus(name, None, None, False, "the accounting roll-up has not been checked yet")
    raw = (row.data or {}).get("rolled_up_to")
    to = dt.datetime.fromisoformat(raw) if raw else None
    stale, message = rollup_message(to, cluster=name, now=now)
    if row.failing_since is not None:
        message = f"{message} (last check failed: {row.last_error[:120]})"
    return RollupStatus(name, to, row.last_success_at, stale, message)
