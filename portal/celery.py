"""The Celery app. Every periodic schedule of the portal lives here, in one place."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpuportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _beat_schedule() -> dict:
    from django.conf import settings

    sync = settings.JOB_SYNC_INTERVAL_SECONDS
    return {
        "cluster-sync": {"task": "portal.tasks.cluster_sync_task", "schedule": 30.0},
        "jobs-sync": {"task": "jobs.tasks.jobs_sync_task", "schedule": sync},
        "jobs-sweep-accepted": {"task": "jobs.tasks.jobs_sweep_task", "schedule": 15.0},
        "usage-ingest": {"task": "accounting.tasks.usage_ingest_task", "schedule": 60.0},
        # quota period roll-over (Slurm usage reset + new limits) and limit drift repair
        "quota-rollover": {"task": "accounting.tasks.quota_rollover_task", "schedule": 300.0},
        "booking-cleanup": {"task": "accounting.tasks.booking_cleanup_task", "schedule": 60.0},
        # the sweepers of the outbox (portal/outbox.py) for work that has no other one
        "team-mirror-sweep": {"task": "portal.tasks.team_mirror_sweep_task", "schedule": 300.0},
        "budget-alert-sweep": {"task": "accounting.tasks.budget_alert_sweep_task", "schedule": 300.0},
    }


@app.on_after_configure.connect
def _setup_periodic(sender, **kwargs) -> None:
    sender.conf.beat_schedule = _beat_schedule()
