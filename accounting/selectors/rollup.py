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
