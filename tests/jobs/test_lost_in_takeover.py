"""Issue 42 item 3 (the site test's finding 1): a Slurm controller killed just after it answered a
submission, before saving its state, leaves the portal with an id its backup never knew: the job is
in neither the controller's queue nor (as started) its accounting. The jobs sync sends such a job again
once JOB_LOST_AFTER_SECONDS have passed since the id was learnt, looking for its tag first; the real
cluster is the oracle (one job with the tag in the queue, the lost id nowhere)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_relay_drain_run, job_submit, jobs_sync
from portal.slurm import get_gateway
from tests.support import slurm_cancel_tagged

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

NEVER_GIVEN = 60_123_457  # below MaxJobId (67 043 328), far above what the test cluster has given


def _lost(cluster, *, known_seconds_ago: int, slurm_id: int = NEVER_GIVEN) -> Job:
    """A job as the portal holds it after such a takeover: relayed once, PENDING under an id the
    controller no longer has (it never had this one: the same view from the portal)."""
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, name="lost", script="#!/bin/bash\nsleep 30\n",
                        partition="debug", gpus=1, time_limit_minutes=2)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(
        state=JobState.PENDING, slurm_job_id=slurm_id, slurm_cluster=job.cluster.name, relay_attempts=1,
        submitted_at=timezone.now() - dt.timedelta(seconds=known_seconds_ago),
    )  # fmt: skip
    return Job.objects.get(pk=job.pk)


def _tagged(job) -> list[int]:
    return [entry.job_id for entry in get_gateway().queue() if entry.comment == job.slurm_tag]


def test_a_job_the_controller_lost_is_sent_again_once_and_found_by_its_tag_after(slurm_target, cluster, settings):
    settings.JOB_LOST_AFTER_SECONDS = 60
    fresh = _lost(cluster, known_seconds_ago=5, slurm_id=NEVER_GIVEN + 1)  # learnt moments ago: maybe not in the queue read yet
    job = _lost(cluster, known_seconds_ago=600)
    try:
        stats = jobs_sync()
        assert stats["resent"] == 1
        job.refresh_from_db()
        assert (job.state, job.slurm_job_id) == (JobState.ACCEPTED, None)
        assert "Slurm lost job 60123457" in job.events.order_by("-at").first().reason
        assert Job.objects.get(pk=fresh.pk).slurm_job_id == NEVER_GIVEN + 1  # left for a later cycle

        job_relay_drain_run(limit=10)
        job.refresh_from_db()
        assert job.state == JobState.PENDING and job.slurm_job_id not in (None, NEVER_GIVEN)
        assert _tagged(job) == [job.slurm_job_id]  # one job in Slurm with its tag

        # the next cycles find it in the queue: nothing sent again, and no second submission
        assert jobs_sync().get("resent", 0) == 0
        Job.objects.filter(pk=job.pk).update(state=JobState.ACCEPTED, slurm_job_id=None, relay_attempts=2)
        job_relay_drain_run(limit=10)  # a relay repeated after an interruption adopts it by its tag
        assert Job.objects.get(pk=job.pk).slurm_job_id == _tagged(job)[0] and len(_tagged(job)) == 1
    finally:
        slurm_cancel_tagged([job, fresh])
