"""The Celery app. Every periodic schedule of the portal lives here, in one place."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")

app = Celery("gpuportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _beat_schedule() -> dict:
    from django.conf import settings

    from portal.slurm import configured_clusters

    sync = settings.JOB_SYNC_INTERVAL_SECONDS
    schedule = {
        "jobs-sweep-accepted": {"task": "jobs.tasks.jobs_sweep_task", "schedule": 15.0},
        # quota period roll-over (Slurm usage reset + new limits) and limit drift repair
        "quota-rollover": {"task": "accounting.tasks.quota_rollover_task", "schedule": 300.0},
        "booking-cleanup": {"task": "accounting.tasks.booking_cleanup_task", "schedule": 60.0},
        # the sweepers of the outbox (portal/outbox.py) for work that has no other one
        "team-mirror-sweep": {"task": "portal.tasks.team_mirror_sweep_task", "schedule": 300.0},
        "budget-alert-sweep": {"task": "accounting.tasks.budget_alert_sweep_task", "schedule": 300.0},
        "budget-alert-webhook-sweep": {
            "task": "accounting.tasks.budget_alert_webhook_sweep_task",
            "schedule": float(settings.BUDGET_ALERT_WEBHOOK_SWEEP_SECONDS),
        },
        "usage-reprice-sweep": {
            "task": "accounting.tasks.usage_reprice_sweep_task", "schedule": float(settings.USAGE_REPRICE_SWEEP_SECONDS),
        },
        "job-end-notify-sweep": {
            "task": "jobs.tasks.job_end_notify_sweep_task", "schedule": float(settings.JOB_END_NOTIFY_SWEEP_SECONDS),
        },
        # what the GPUs did: one Prometheus range query for every job's GPUs (off without PROMETHEUS_URL)
        "gpu-usage-sync": {"task": "jobs.tasks.gpu_usage_sync_task", "schedule": float(settings.GPU_USAGE_SYNC_SECONDS)},
        # the idle-GPU alerts' sweeper: raised from the recorded rows, lost deliveries re-sent
        "gpu-idle-alert-sweep": {
            "task": "jobs.tasks.gpu_idle_alerts_sweep_task", "schedule": float(settings.GPU_IDLE_ALERT_SWEEP_SECONDS),
        },
        # what is kept how long (RETENTION_* settings, README "Retention")
        "retention": {"task": "jobs.tasks.retention_task", "schedule": float(settings.RETENTION_SWEEP_SECONDS)},
        # closed months' totals for reports and invoices (accounting.services.usage_rollup)
        "usage-rollup": {"task": "accounting.tasks.usage_rollup_task", "schedule": float(settings.USAGE_ROLLUP_SECONDS)},
        # the running budget totals' used figures against the usage slices (accounting.services.budget)
        "budget-totals-check": {
            "task": "accounting.tasks.budget_totals_check_task", "schedule": float(settings.BUDGET_TOTALS_CHECK_SECONDS),
        },
        # not an outbox: holds whose job's final usage never came (BUDGET_HOLD_RELEASE_AFTER_HOURS)
        "budget-hold-sweep": {"task": "jobs.tasks.budget_holds_sweep_task", "schedule": float(settings.BUDGET_HOLD_SWEEP_SECONDS)},
    }  # fmt: skip
    # The periodic Slurm reads run per cluster, each its own task (a cluster down fails only its own):
    # the default cluster keeps the names of a one-cluster portal, another's get "@NAME".
    for index, config in enumerate(configured_clusters()):
        suffix = "" if index == 0 else f"@{config.name}"
        per_cluster = {"kwargs": {"cluster": config.name}}
        schedule[f"cluster-sync{suffix}"] = {"task": "portal.tasks.cluster_sync_task", "schedule": 30.0, **per_cluster}
        schedule[f"jobs-sync{suffix}"] = {"task": "jobs.tasks.jobs_sync_task", "schedule": sync, **per_cluster}
        # a Kubernetes cluster's usage is read from its Jobs and pods (accounting.services.ingestion)
        schedule[f"usage-ingest{suffix}"] = {"task": "accounting.tasks.usage_ingest_task", "schedule": 60.0, **per_cluster}
        if config.is_kubernetes:  # no sreport there
            continue
        schedule[f"accounting-rollup{suffix}"] = {
            "task": "accounting.tasks.rollup_check_task", "schedule": float(settings.ACCOUNTING_ROLLUP_CHECK_SECONDS),
            **per_cluster,
        }  # fmt: skip
    return schedule


@app.on_after_configure.connect
def _setup_periodic(sender, **kwargs) -> None:
    sender.conf.beat_schedule = _beat_schedule()
