"""Celery tasks of the portal app: mirror teams to Slurm associations, read the cluster inventory.
Tasks take ids, fetch, call a service and are safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task

from portal.models import Team
from portal.slurm import SlurmUnavailable

logger = logging.getLogger(__name__)


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(SlurmUnavailable,),
    retry_backoff=2,
    retry_backoff_max=300,
    max_retries=20,
)
def team_mirror_to_slurm(self, team_id: int) -> list[str]:
    from portal.services import team_mirror

    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        return []
    actions = team_mirror(team=team)
    for action in actions:
        logger.info("slurm association: %s (fixed)", action.describe())
    return [a.describe() for a in actions]


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=120, time_limit=180)
def team_mirror_sweep_task() -> list[str] | None:
    """Periodic (portal/project/celery.py, team-mirror-sweep): mirror every team, for the mirrors the broker
    lost. A Slurm failure waits for the next beat."""
    from portal.services import team_mirror_sweep

    try:
        actions = team_mirror_sweep()
    except SlurmUnavailable as exc:
        logger.warning("team mirror sweep: Slurm unavailable: %s", exc)
        return None
    for action in actions:
        logger.info("slurm association: %s (fixed by the sweep)", action.describe())
    return [a.describe() for a in actions]


@shared_task(acks_late=True, ignore_result=True)
def cluster_sync_task(cluster: str | None = None) -> dict | None:
    """Periodic (portal/project/celery.py, one entry per cluster): one cluster's inventory. A cluster that
    does not answer is recorded as failing (its SyncStatus) and waits for the next beat."""
    from portal.services import cluster_sync

    try:
        return cluster_sync(cluster=cluster)
    except SlurmUnavailable as exc:
        logger.warning("cluster sync %s: Slurm unavailable: %s", cluster or "(default)", exc)
        return None
