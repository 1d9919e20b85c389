"""Job-end emails: when a sync cycle moves jobs to a terminal state, submitters who opted in get one
email per job; others get none."""

from __future__ import annotations

import pytest
from django.core import mail
from django.utils import timezone

from jobs.choices import JobState
from jobs.services import _apply_plan
from portal.models import Profile
from tests.security.test_url_matrix import make_job

pytestmark = pytest.mark.django_db


def test_sync_sends_one_email_per_ended_job_to_submitters_who_opted_in(world, django_capture_on_commit_callbacks):
    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    mine = make_job(world.vision, world.alice, state=JobState.RUNNING, slurm_job_id=4242, name="train-a")
    bobs = make_job(world.vision, world.bob, state=JobState.RUNNING, slurm_job_id=4243, name="train-b")
    still = make_job(world.vision, world.alice, state=JobState.PENDING, slurm_job_id=4244, name="waiting")
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        _apply_plan(
            {
                mine.pk: {"state": JobState.FAILED, "exit_code": 3, "exit_signal": 9, "ended_at": now},
                bobs.pk: {"state": JobState.COMPLETED, "exit_code": 0, "ended_at": now},
                still.pk: {"state": JobState.RUNNING, "started_at": now},
            },
            now,
        )
    assert [m.to for m in mail.outbox] == [[world.alice.email]]
    message = mail.outbox[0]
    assert message.subject == "[gpuportal] train-a: FAILED"
    assert "Slurm job 4242" in message.body and "exit code 3, signal 9 (SIGKILL)" in message.body
    assert f"/jobs/{mine.pk}/" in message.body


def test_no_email_when_nothing_ended(world, django_capture_on_commit_callbacks):
    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    job = make_job(world.vision, world.alice, state=JobState.PENDING, slurm_job_id=4250)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        _apply_plan({job.pk: {"state": JobState.RUNNING, "started_at": now}}, now)
    assert mail.outbox == []
