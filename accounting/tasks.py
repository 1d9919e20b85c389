"""Celery tasks of accounting. The schedules live in portal/project/celery.py (usage-ingest, every 60 s; the
sweepers). Every task is safe to run twice: ingestion upserts by (cluster, job_id, submit_time) and
writes only what changed; re-pricing claims the rows that say it is owed and rebuilds slices from
the records."""

from __future__ import annotations

import datetime as dt
import logging

from celery import shared_task

from portal.outbox import publish
from portal.slurm import SlurmError, SlurmUnavailable

logger = logging.getLogger(__name__)


def _until_next_beat(what: str, run):
    """Run a periodic task's service; a Slurm error is logged and waits for the next beat (None)."""
    try:
        return run()
    except SlurmError as exc:
        logger.warning("%s: Slurm error: %s", what, exc)
        return None


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=80)
def usage_ingest_task(cluster: str | None = None) -> dict | None:
    """Read one cluster's new accounting from its slurmdbd (one sacct per window; one task per
    cluster, portal/project/celery.py) and record usage. A Slurm failure is recorded in that cluster's
    SyncStatus ("usage", "usage:NAME") and retried by the next beat, a minute later."""
    from accounting.services import usage_ingest

    result = _until_next_beat(f"usage ingest {cluster or '(default)'}", lambda: usage_ingest(cluster=cluster))
    if result is None:
        return None
    _budget_alerts_after_ingest()
    return {"read": result.read, "written": result.written, "slices": result.slices, "seconds": result.seconds}


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=80)
def rollup_check_task(cluster: str | None = None) -> str | None:
    """Periodic (portal/project/celery.py, accounting-rollup, per cluster): how far the cluster's slurmdbd has
    rolled usage up, recorded for /healthz and the cluster pages (accounting.selectors.rollup_status)."""
    from accounting.services import rollup_record

    result = _until_next_beat(f"accounting roll-up {cluster or '(default)'}", lambda: rollup_record(cluster=cluster))
    return result.isoformat() if result else None


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=600, time_limit=900)
def usage_rollup_task() -> list[str]:
    """Periodic (portal/project/celery.py, usage-rollup): roll up the closed months never rolled or
    re-opened by a late record (accounting.services.usage_rollup)."""
    from accounting.services import usage_rollup

    return [month.isoformat() for month in usage_rollup()]


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=600, time_limit=900)
def budget_totals_check_task() -> int:
    """Periodic (portal/project/celery.py, budget-totals-check): the running budget totals' used
    figures checked against the usage slices, a stale one corrected (accounting.services.budget)."""
    from accounting.services import budget_totals_check

    return len(budget_totals_check())


def _budget_alerts_after_ingest() -> None:
    """Budget thresholds are crossed by new usage: check them after each ingest (never fails the ingest)."""
    from accounting.services import budget_alerts_check

    try:
        budget_alerts_check()
    except Exception:
        logger.exception("budget alerts check failed")


@shared_task(
    acks_late=True,
    ignore_result=True,
    autoretry_for=(Exception,),
    retry_backoff=5,
    max_retries=5,
    soft_time_limit=600,
    time_limit=660,
)
def usage_reprice_task(gpu_type: str, since: str) -> int | None:
    """Rebuild the cost of usage of ``gpu_type`` from ``since`` (ISO date) after a rate was added: the
    re-pricing its PendingReprice rows say is owed (None: already done by another run)."""
    from accounting.services import usage_reprice_pending

    return usage_reprice_pending(gpu_type=gpu_type, since=dt.date.fromisoformat(since))


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=30, time_limit=60)
def usage_reprice_sweep_task() -> list[tuple[str, str]]:
    """Periodic (portal/project/celery.py, usage-reprice-sweep): re-enqueue re-pricing a lost task left owed."""
    from accounting.services import usage_reprice_sweep

    return usage_reprice_sweep()


# ---------------------------------------------------------------- bookings

# A booking's reservation is created or deleted in Slurm: retried while Slurm is unavailable.
_RESERVATION_TASK = {
    "acks_late": True, "ignore_result": True, "autoretry_for": (SlurmUnavailable,), "retry_backoff": 5,
    "retry_backoff_max": 120, "max_retries": 8, "soft_time_limit": 50, "time_limit": 80,
}  # fmt: skip


@shared_task(**_RESERVATION_TASK)
def booking_reserve_task(booking_id: str) -> str:
    """Create the Slurm reservation of an approved booking; retried while Slurm is unavailable."""
    from accounting.services import booking_reserve_run

    return booking_reserve_run(booking_id)


@shared_task(**_RESERVATION_TASK)
def booking_unreserve_task(booking_id: str) -> str:
    """Delete the Slurm reservation of a cancelled booking; retried while Slurm is unavailable."""
    from accounting.services import booking_unreserve_run

    return booking_unreserve_run(booking_id)


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=80)
def booking_cleanup_task() -> dict | None:
    """Periodic (portal/project/celery.py, booking-cleanup): reservations of cancelled/ended bookings still in
    Slurm are deleted; lost creations and deletions are re-enqueued."""
    from accounting.services import booking_cleanup

    return _until_next_beat("booking cleanup", booking_cleanup)


# ---------------------------------------------------------------- quotas


@shared_task(
    acks_late=True, ignore_result=True, autoretry_for=(SlurmError,), retry_backoff=5, retry_backoff_max=300,
    max_retries=8, soft_time_limit=60, time_limit=90,
)  # fmt: skip
def quota_mirror_task(team_id: int) -> list[str]:
    """Set the team's account limits (GrpTRESMins / GrpTRES) to what its quotas in force call for.
    Idempotent: sacctmgr modify to the same values; the roll-over task mends what it misses."""
    from accounting.services import quota_limits_apply
    from portal.models import Team

    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        return []
    return quota_limits_apply(teams=[team], force=True)


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=120, time_limit=180)
def quota_rollover_task() -> list[str] | None:
    """Periodic (portal/project/celery.py): at a new period reset each quota team's Slurm usage and mirror the
    new limits; also mends limit drift. A Slurm failure waits for the next beat."""
    from accounting.services import quota_period_rollover

    return _until_next_beat("quota roll-over", quota_period_rollover)


@shared_task(
    acks_late=True, ignore_result=True, autoretry_for=(OSError,), retry_backoff=10, max_retries=5,
    soft_time_limit=30, time_limit=60,
)  # fmt: skip
def budget_alert_deliver_task(alert_id: int) -> None:
    """Email a budget alert to the team's managers (once), then hand the webhook to its own task (an
    enqueue the broker loses is logged; budget_alert_webhook_sweep_task sends that webhook)."""
    from accounting.services import budget_alert_email

    budget_alert_email(alert_id=alert_id)
    publish(budget_alert_webhook_task, alert_id)


@shared_task(acks_late=True, ignore_result=True)
def budget_alert_sweep_task() -> list[int]:
    """Periodic (portal/project/celery.py, budget-alert-sweep): re-enqueue alerts whose e-mail was lost."""
    from accounting.services import budget_alert_sweep

    return budget_alert_sweep()


@shared_task(
    acks_late=True, ignore_result=True, autoretry_for=(Exception,), retry_backoff=10, retry_backoff_max=600,
    max_retries=6, soft_time_limit=30, time_limit=60,
)  # fmt: skip
def budget_alert_webhook_task(alert_id: int) -> None:
    """POST the alert to the team's webhook (claimed first: once); retried with backoff (urllib
    errors), once delivered a no-op."""
    from accounting.services import budget_alert_webhook

    budget_alert_webhook(alert_id=alert_id)


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=30, time_limit=60)
def budget_alert_webhook_sweep_task() -> list[int]:
    """Periodic (portal/project/celery.py, budget-alert-webhook-sweep): re-enqueue webhooks whose task was lost."""
    from accounting.services import budget_alert_webhook_sweep

    return budget_alert_webhook_sweep()
