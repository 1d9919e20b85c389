"""The relay (exactly once), the cancel rules and the sweeper, against an in-memory gateway."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services import job_cancel, job_cancel_relay_run, job_relay_run, job_submit, jobs_sweep
from portal.exceptions import ApplicationError, Conflict
from portal.slurm import JobRequest, SlurmUnavailable
from tests.fakes import FakeGateway, queue_entry

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake(use_gateway, settings):
    gateway = use_gateway(FakeGateway())
    settings.SLURM_SUBMIT_AS_USER = False  # no Unix accounts needed for the fake
    return gateway


@pytest.fixture
def job(world, inventory, relays):
    job, _ = job_submit(
        user=world.alice, team=world.vision, name="j", script="true", partition="gpu", gpu_type="a100", gpus=1,
        nodes=1, cpus_per_gpu=1, memory_gb=None, time_limit_minutes=30,
    )  # fmt: skip
    return job


def test_relay_submits_once_and_records_the_slurm_id(job, fake):
    assert job_relay_run(job.pk) == "submitted"
    assert job_relay_run(job.pk) == "not-claimed"  # a second run (redelivery) does nothing
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id, job.relay_attempts) == (JobState.PENDING, 1001, 1)
    assert job.submitted_at is not None
    assert fake.calls["submit"] == 1 and fake.calls["find_by_comments"] == 0
    submission = fake.submitted[0]
    command_line = dict(submission.command_line)
    assert submission.request == JobRequest.from_json(job.request)  # the stored request, unchanged
    assert command_line["comment"] == f"gpuportal:{job.pk}" and command_line["account"] == "vision"
    assert command_line["output"] == f"{job.workdir}/slurm-%j.out" and "error" not in command_line  # sbatch's default, in the user's directory
    assert list(job.events.values_list("state", flat=True)) == [JobState.ACCEPTED, JobState.PENDING]


def test_relay_after_a_crash_between_sbatch_and_the_write_adopts_the_tagged_job(job, fake):
    # The crashed run: claimed (attempt 1), sbatch succeeded, died before recording; its lease expired.
    fake.queue_entries.append(queue_entry(4242, "PENDING", job.slurm_tag))
    Job.objects.filter(pk=job.pk).update(relay_attempts=1, relay_started_at=timezone.now() - dt.timedelta(hours=1))
    assert job_relay_run(job.pk) == "adopted"
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id) == (JobState.PENDING, 4242)
    assert fake.calls["submit"] == 0


def test_relay_does_not_take_over_a_live_claim(job, fake):
    Job.objects.filter(pk=job.pk).update(relay_attempts=1, relay_started_at=timezone.now())
    assert job_relay_run(job.pk) == "not-claimed"
    assert fake.calls["submit"] == 0


def test_relay_when_slurm_is_down_releases_the_claim_for_the_retry(job, fake):
    fake.unavailable = True
    with pytest.raises(SlurmUnavailable):
        job_relay_run(job.pk)
    job.refresh_from_db()
    assert (job.state, job.relay_started_at, job.relay_attempts) == (JobState.ACCEPTED, None, 1)
    assert "unavailable" in job.last_relay_error
    fake.unavailable = False
    assert job_relay_run(job.pk) == "submitted"  # second attempt looks for the tag first
    assert fake.calls["find_by_comments"] == 1 and fake.calls["submit"] == 2  # 1 failed + 1 real


def test_relay_rejected_by_slurm_is_submit_failed_with_slurms_words(job, fake, monkeypatch):
    from portal.slurm import SlurmRejected

    def reject(spec):
        raise SlurmRejected("sbatch: error: Invalid account or account/partition combination specified")

    monkeypatch.setattr(fake, "submit", reject)
    assert job_relay_run(job.pk) == "submit-failed"
    job.refresh_from_db()
    assert job.state == JobState.SUBMIT_FAILED and "Invalid account" in job.state_reason
    assert job_relay_run(job.pk) == "not-claimed"  # terminal: never left


def test_relay_without_unix_account_is_submit_failed(job, fake, settings):
    settings.SLURM_SUBMIT_AS_USER = True
    from portal.models import Profile

    Profile.objects.filter(user=job.submitter).update(unix_username="nosuchuser-xyz")
    assert job_relay_run(job.pk) == "submit-failed"
    job.refresh_from_db()
    assert "nosuchuser-xyz" in job.state_reason and fake.calls["submit"] == 0


def test_cancel_of_a_job_never_relayed_does_not_touch_slurm(job, fake, relays):
    job = job_cancel(user=job.submitter, job=job)
    assert job.state == JobState.CANCELLED and job.ended_at is not None
    assert relays["cancel"] == [] and sum(fake.calls.values()) == 0
    assert job_relay_run(job.pk) == "not-claimed"  # a late relay finds nothing to send


def test_cancel_while_the_relay_holds_the_claim_is_passed_on_after_submit(job, fake, relays, monkeypatch):
    cancels = []

    def submit_while_cancelled(spec, submit=fake.submit):
        """The cancel arrives while the relay's sbatch runs: the cancel relay leaves the job to it."""
        cancelled = job_cancel(user=job.submitter, job=Job.objects.get(pk=job.pk))
        assert cancelled.state == JobState.ACCEPTED and cancelled.cancel_requested_at is not None
        cancels.append(job_cancel_relay_run(job.pk))
        return submit(spec)

    monkeypatch.setattr(fake, "submit", submit_while_cancelled)
    assert job_relay_run(job.pk) == "submitted"
    # the relay recorded the id, then saw the cancel request and passed it on
    assert cancels == ["not-claimed"] and relays["cancel"] == [str(job.pk)]
    assert job_cancel_relay_run(job.pk) == "sent"
    assert fake.cancelled == [Job.objects.get(pk=job.pk).slurm_job_id]


def test_cancel_of_a_claimed_job_that_never_reached_slurm_cancels_in_the_portal(job, fake, relays):
    Job.objects.filter(pk=job.pk).update(relay_attempts=1, relay_started_at=timezone.now() - dt.timedelta(hours=1))
    job.refresh_from_db()
    job_cancel(user=job.submitter, job=job)
    assert job_cancel_relay_run(job.pk) == "cancelled"  # looked for the tag, found nothing
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and fake.calls["find_by_comments"] == 1 and fake.calls["submit"] == 0


def test_cancel_of_a_job_in_slurm_requests_scancel(job, fake, relays, django_capture_on_commit_callbacks):
    job_relay_run(job.pk)
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        job = job_cancel(user=job.submitter, job=job)
    assert job.state == JobState.PENDING and job.cancel_requested
    assert relays["cancel"] == [str(job.pk)]
    assert job_cancel_relay_run(job.pk) == "sent"
    assert fake.cancelled == [job.slurm_job_id]


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.SUBMIT_FAILED])
def test_cancel_of_a_finished_job_is_409(job, fake, state):
    Job.objects.filter(pk=job.pk).update(state=state)
    with pytest.raises(Conflict) as exc:
        job_cancel(user=job.submitter, job=job)
    assert exc.value.status_code == 409 and exc.value.message == f"Job already ended ({state})."
    job.refresh_from_db()
    assert job.state == state


def test_only_submitter_managers_and_admins_may_cancel(world, inventory, relays, fake):
    job, _ = job_submit(
        user=world.bob, team=world.vision, name="bobs", script="true", partition="gpu", gpus=1, time_limit_minutes=5,
    )  # fmt: skip
    with pytest.raises(ApplicationError) as exc:
        job_cancel(user=world.alice, job=job)  # a member, not the submitter
    assert exc.value.status_code == 403
    assert job_cancel(user=world.admin, job=job).state == JobState.CANCELLED


def test_sweeper_reenqueues_stale_accepted_jobs_and_unsent_cancels(job, relays, settings):
    settings.JOB_ACCEPTED_SWEEP_SECONDS = 30
    old = timezone.now() - dt.timedelta(minutes=5)
    Job.objects.filter(pk=job.pk).update(created_at=old)
    fresh, _ = job_submit(
        user=job.submitter, team=job.team, name="fresh", script="true", partition="gpu", gpus=1, time_limit_minutes=5,
    )  # fmt: skip
    cancelling, _ = job_submit(
        user=job.submitter, team=job.team, name="c", script="true", partition="gpu", gpus=1, time_limit_minutes=5,
    )  # fmt: skip
    Job.objects.filter(pk=cancelling.pk).update(
        state=JobState.RUNNING, slurm_job_id=55, created_at=old, cancel_requested_at=old
    )
    relays["drain"].clear()
    assert jobs_sweep() == {"relays": 1, "cancels": 1, "task_cancels": 0}  # one stale job (not the fresh one): one drain
    assert relays["drain"] == [None] and relays["relay"] == [] and relays["cancel"] == [str(cancelling.pk)]
    relays["drain"].clear()
    Job.objects.filter(pk=job.pk).update(state=JobState.PENDING, slurm_job_id=56)
    assert jobs_sweep() == {"relays": 0, "cancels": 1, "task_cancels": 0}  # nothing stale: no drain
    assert relays["drain"] == []


def test_the_sweepers_task_cancel_read_is_the_partial_index_of_owed_cancels(job, relays, settings):
    """A year holds millions of array tasks; the sweep (every minute) reads the few whose cancel is
    owed through jobarraytask_cancel_owed: its own SQL, EXPLAINed with sequential scans off (a
    wording the index's condition does not imply would scan the table)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.models import JobArrayTask

    settings.JOB_ACCEPTED_SWEEP_SECONDS = 30
    old = timezone.now() - dt.timedelta(minutes=5)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, slurm_job_id=57, array="0-3", array_tasks=4)
    JobArrayTask.objects.create(job=job, index=1, cancel_requested_at=old)
    JobArrayTask.objects.create(job=job, index=2, cancel_requested_at=old, state=JobState.CANCELLED)  # done: not owed
    with CaptureQueriesContext(connection) as queries:
        assert jobs_sweep()["task_cancels"] == 1
    (sql,) = [q["sql"] for q in queries.captured_queries if 'FROM "jobs_jobarraytask"' in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobarraytask_cancel_owed" in plan, plan


def test_terminal_state_is_not_overwritten_by_a_stale_sync_plan(job):
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    changed = services._apply_plan({job.pk: {"state": JobState.RUNNING}}, timezone.now())
    job.refresh_from_db()
    assert changed == 0 and job.state == JobState.CANCELLED
    assert not JobEvent.objects.filter(job=job, state=JobState.RUNNING).exists()
