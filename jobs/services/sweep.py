"""The sweeper: re-enqueue relays and cancels that got stuck."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.choices import LIVE_STATES, JobState
from jobs.models import Job
from jobs.services.relay import _lease_free


def jobs_sweep() -> dict:
    """Re-enqueue work that got stuck: relays of jobs ACCEPTED for longer than
    JOB_ACCEPTED_SWEEP_SECONDS (the relay's claim and find-by-tag make a repeat harmless), and
    cancels requested but not yet passed on to Slurm. Two queries, then one enqueue per job."""
    from jobs.tasks import job_cancel_relay, job_relay

    now = timezone.now()
    cutoff = now - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS)
    relay_ids = list(
        Job.objects.filter(_lease_free(), state=JobState.ACCEPTED, created_at__lt=cutoff, cancel_requested_at__isnull=True)
        .values_list("pk", flat=True)[:1000]
    )
    cancel_ids = list(
        Job.objects.filter(state__in=LIVE_STATES, cancel_requested_at__lt=cutoff)
        .filter(Q(cancel_sent_at__isnull=True) | Q(cancel_sent_at__lt=cutoff))
        .values_list("pk", flat=True)[:1000]
    )
    for job_id in relay_ids:
        job_relay.delay(str(job_id))
    for job_id in cancel_ids:
        job_cancel_relay.delay(str(job_id))
    return {"relays": len(relay_ids), "cancels": len(cancel_ids)}
