"""Celery tasks of accounting. The schedule lives in portal/celery.py (usage-ingest, every 60 s).
Both tasks are safe to run twice: ingestion upserts by (cluster, job_id, submit_time) and writes only
what changed; re-pricing rebuilds slices from the records."""

from __future__ import annotations

import datetime as dt
import logging

from celery import shared_task

from portal.slurm import SlurmError

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=80)
def usage_ingest_task() -> dict | None:
    """Read new accounting from slurmdbd (one sacct per window) and record usage. A Slurm failure is
    recorded in SyncStatus(kind="usage") and retried by the next beat, a minute later."""
    from accounting.services import usage_ingest

    try:
        result = usage_ingest()
    except SlurmError as exc:
        logger.warning("usage ingest: Slurm error: %s", exc)
        return None
    return {"read": result.read, "written": result.written, "slices": result.slices, "seconds": result.seconds}


@shared_task(
    acks_late=True,
    ignore_result=True,
    autoretry_for=(Exception,),
    retry_backoff=5,
    max_retries=5,
    soft_time_limit=600,
    time_limit=660,
)
def usage_reprice_task(gpu_type: str, since: str) -> int:
    """Rebuild the cost of usage of ``gpu_type`` from ``since`` (ISO date) after a rate was added."""
    from accounting.services import usage_reprice

    return usage_reprice(gpu_type=gpu_type, since=dt.date.fromisoformat(since))
