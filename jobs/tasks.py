"""Celery tasks of the jobs app. Each takes ids, calls a service and is safe to run twice: the
relay claims the row with a conditional update and looks for its tag in Slurm before a repeat
sbatch; the sync and the sweeper are periodic (schedules in portal/project/celery.py)."""

from __future__ import annotations

import logging

from celery import shared_task

from jobs import services
from portal.slurm import SlurmUnavailable

logger = logging.getLogger(__name__)

RELAY_MAX_RETRIES = 10
RELAY_BACKOFF_CAP_SECONDS = 60

# Every task that talks to Slurm for a job (relay, batch relay, cancel): retried with backoff while
# Slurm is unavailable, redelivered if a worker dies (acks_late), bounded in time.
RELAY_TASK_OPTIONS = {
    "bind": True,
    "acks_late": True,
    "autoretry_for": (SlurmUnavailable,),
    "retry_backoff": 1,  # 1, 2, 4, … s
    "retry_backoff_max": RELAY_BACKOFF_CAP_SECONDS,
    "retry_jitter": True,
    "max_retries": RELAY_MAX_RETRIES,
    "soft_time_limit": services.RELAY_SOFT_TIME_LIMIT,
    "time_limit": services.RELAY_HARD_TIME_LIMIT,  # a relay killed at it stops renewing its lease: another takes its jobs
}


@shared_task(**RELAY_TASK_OPTIONS)
def job_relay(self, job_id: str) -> str:
    """Send an ACCEPTED job to Slurm exactly once (see services.job_relay_run). After the last retry
    the job stays ACCEPTED and the sweeper tries again later."""
    outcome = services.job_relay_run(job_id)
    logger.info("job relay %s: %s", job_id, outcome)
    return outcome


@shared_task(**RELAY_TASK_OPTIONS)
def job_relay_batch(self, job_ids: list[str]) -> dict:
    """Send many ACCEPTED jobs to Slurm, each exactly once (see services.job_relay_batch_run): one
    claim, sbatch calls a few at a time, one bulk write. Slurm unavailable for some: those claims are
    released and the task retries (the retry takes only the jobs still ACCEPTED). Jobs left ACCEPTED
    after the last retry are the sweeper's."""
    outcome = services.job_relay_batch_run(job_ids)
    logger.info("job relay batch of %d: %s", len(job_ids), outcome)
    return outcome


@shared_task(**RELAY_TASK_OPTIONS)
def job_relay_drain(self) -> dict:
    """The group commit of single-job submissions (see services.job_relay_drain_run): claim up to
    JOB_RELAY_DRAIN_BATCH waiting ACCEPTED jobs (SKIP LOCKED: several drains may run at once), sbatch
    them a few at a time, one bulk write, again until none is left. Published by submits through the
    coalescing outbox (a burst causes about one run) and by the sweeper. A worker's drain waits a
    moment for the next job of a burst before it ends; an eager one (tests) does not."""
    linger = 0.0 if self.request.is_eager else services.RELAY_DRAIN_LINGER_SECONDS
    outcome = services.job_relay_drain_run(linger=linger)
    logger.info("job relay drain: %s", outcome)
    return outcome


@shared_task(**RELAY_TASK_OPTIONS)
def job_cancel_relay(self, job_id: str) -> str:
    """Pass a requested cancel on to Slurm (scancel; repeating it is harmless)."""
    outcome = services.job_cancel_relay_run(job_id)
    logger.info("job cancel %s: %s", job_id, outcome)
    return outcome


@shared_task(**RELAY_TASK_OPTIONS)
def job_array_task_cancel_relay(self, job_id: str, index: int) -> str:
    """Pass a requested cancel of one array task on to the scheduler (on Kubernetes its log kept first)."""
    outcome = services.job_array_task_cancel_relay_run(job_id, index)
    logger.info("job cancel %s task %s: %s", job_id, index, outcome)
    return outcome


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60)
def jobs_sync_task(cluster: str | None = None) -> dict:
    """One sync cycle of one cluster (one squeue, at most one sacct; one task per cluster,
    portal/project/celery.py). A cycle of that cluster already running elsewhere makes this one a no-op, so
    overlapping beats do not double the work or the events."""
    from django.core.cache import cache

    lock = "jobs-sync-lock" if not cluster else f"jobs-sync-lock:{cluster}"
    if not cache.add(lock, "1", timeout=60):
        return {"skipped": "another sync is running"}
    try:
        return services.jobs_sync(cluster=cluster) if cluster else services.jobs_sync()
    finally:
        cache.delete(lock)


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60)
def jobs_sweep_task() -> dict:
    """Re-enqueue relays of jobs stuck in ACCEPTED (one drain) and cancels (of jobs, of array tasks) not yet passed on to Slurm."""
    return services.jobs_sweep()


@shared_task(bind=True, ignore_result=True, max_retries=3, default_retry_delay=60, soft_time_limit=50, time_limit=60)
def job_end_notify(self, job_ids: list[str]) -> int:
    """Email opted-in submitters that their jobs ended (one task per sync cycle; the sweeper's repeats).
    Each notice is claimed before it is sent (services.job_end_notify_send), so a repeat or a
    redelivery sends nothing twice; SMTP unreachable hands the unsent back and retries."""
    try:
        return services.job_end_notify_send(job_ids=job_ids)
    except OSError as exc:  # SMTP unreachable
        raise self.retry(exc=exc) from exc


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60)
def job_end_notify_sweep_task() -> int:
    """Periodic (portal/project/celery.py, job-end-notify-sweep): re-enqueue job-end e-mails whose task was lost."""
    return len(services.job_end_notify_sweep())


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=120, time_limit=180)
def budget_holds_sweep_task() -> dict:
    """Periodic (portal/project/celery.py, budget-hold-sweep): release budget holds whose final usage never came."""
    return services.budget_holds_sweep()


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60)
def gpu_usage_sync_task() -> dict:
    """Periodic (portal/project/celery.py, gpu-usage-sync): one Prometheus range query for every job's GPUs
    (services.gpu_usage_sync). Overlapping beats: the second is a no-op."""
    from django.core.cache import cache

    if not cache.add("gpu-usage-sync-lock", "1", timeout=60):
        return {"skipped": "another sync is running"}
    try:
        return services.gpu_usage_sync()
    finally:
        cache.delete("gpu-usage-sync-lock")


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60)
def gpu_idle_alerts_sweep_task() -> dict:
    """Periodic (portal/project/celery.py, gpu-idle-alert-sweep): the alerts the recorded GPU rows call
    for, raised even if the sync that should have raised them died; lost deliveries enqueued again."""
    return services.gpu_idle_alerts_sweep()


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=900, time_limit=960)
def retention_task() -> dict:
    """Periodic (portal/project/celery.py, retention): what is kept how long (services.retention_apply)."""
    from django.core.cache import cache

    if not cache.add("retention-lock", "1", timeout=960):
        return {"skipped": "another run is going"}
    try:
        return services.retention_apply()
    finally:
        cache.delete("retention-lock")


@shared_task(bind=True, ignore_result=True, max_retries=6, retry_backoff=30, soft_time_limit=50, time_limit=60)
def job_gpu_idle_alert_deliver(self, job_id: str) -> dict:
    """E-mail and webhook of one idle-GPU alert, each sent once (services.gpu_idle_alert_deliver)."""
    try:
        return services.gpu_idle_alert_deliver(job_id=job_id)
    except OSError as exc:  # SMTP or the webhook unreachable
        raise self.retry(exc=exc) from exc
