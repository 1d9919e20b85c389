"""Jobs a Slurm controller forgot while they ran (issue 42, the site test's "started then forgotten"):
killed before its state save, the primary's backup took over without them; their node killed them;
slurmdbd has their start and never an end (a runaway). The jobs sync ends such a job once it has been
missing from the queue for JOB_LOST_AFTER_SECONDS, records its usage as Slurm's runaway fix does (its
end at its start), once, through the ingestion, and has Slurm fix the runaway. Fake gateway here; the
real clusters: tests/jobs/test_forgotten_running_slurm.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import pytest
from django.utils import timezone

from accounting.models import BudgetHold, UsageRecord
from accounting.services import usage_records_upsert
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_relay_drain_run, job_submit, jobs_sync
from tests.fakes import FakeGateway, accounting_record, queue_entry

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake(use_gateway):
    return use_gateway(FakeGateway.like_local_cluster())


def _running(world, fake, name: str) -> Job:
    """A job submitted, relayed and seen RUNNING by the sync (its hold knows its Slurm id)."""
    job, _ = job_submit(user=world.alice, team=world.vision, name=name, script="#!/bin/bash\nsleep 600\n",
                        partition="debug", gpus=2, time_limit_minutes=30)  # fmt: skip
    job_relay_drain_run(limit=10)
    job.refresh_from_db()
    started = job.submitted_at + dt.timedelta(seconds=1)
    fake.queue_entries = [e if e.job_id != job.slurm_job_id else dataclasses.replace(e, state="RUNNING", start_time=started)
                          for e in fake.queue_entries]  # fmt: skip
    jobs_sync()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def _runaway(job: Job):
    """Its accounting record as slurmdbd keeps it: started, no end, RUNNING, no comment yet; sacct's
    Elapsed runs on ("until now")."""
    started = job.started_at
    return dataclasses.replace(
        accounting_record(job.slurm_job_id, "RUNNING", "", submitted=job.submitted_at),
        start_time=started, end_time=None, elapsed_seconds=600,  # read ten minutes on
        alloc_tres={"gres/gpu": 2, "gres/gpu:a100": 2},
    )  # fmt: skip


def test_a_running_job_the_controller_forgot_is_ended_charged_once_as_slurm_fixes_it(world, inventory, fake, settings):
    settings.JOB_LOST_AFTER_SECONDS = 60
    forgotten = _running(world, fake, "forgotten")
    still = _running(world, fake, "still-running")
    fake.queue_entries = [e for e in fake.queue_entries if e.job_id == still.slurm_job_id]  # the takeover's queue
    # the new controller gave the id again (its state was older): sacct -D -j has both records
    again = accounting_record(forgotten.slurm_job_id, "CANCELLED", f"gpuportal:{uuid.uuid4()}", submitted=timezone.now())
    fake.records = [again, _runaway(forgotten)]

    # the ingestion reads the runaway meanwhile: provisional, "so far"
    usage_records_upsert(records=fake.records[1:])
    assert UsageRecord.objects.get(job_id=forgotten.slurm_job_id).provisional

    stats = jobs_sync()  # first miss: marked, not ended
    forgotten.refresh_from_db()
    assert (stats["forgotten_seen"], stats["forgotten_ended"], forgotten.state) == (1, 0, JobState.RUNNING)
    assert forgotten.gone_from_queue_at is not None and fake.calls["runaway_jobs_fix"] == 0

    Job.objects.filter(pk=forgotten.pk).update(gone_from_queue_at=timezone.now() - dt.timedelta(seconds=61))
    stats = jobs_sync()
    forgotten.refresh_from_db()
    assert (stats["forgotten_ended"], stats["runaway_fixed"]) == (1, 1)
    assert forgotten.state == JobState.FAILED and "forgot job" in forgotten.state_reason
    assert forgotten.ended_at == forgotten.started_at  # where Slurm's fix puts its end
    assert Job.objects.get(pk=still.pk).state == JobState.RUNNING  # in the queue: untouched

    row = UsageRecord.objects.get(job_id=forgotten.slurm_job_id, submit_time=forgotten.submitted_at)
    assert (row.provisional, row.state, row.end_time, row.gpu_seconds) == (False, "COMPLETED", forgotten.started_at, 0)
    assert row.portal_job_uuid == forgotten.pk
    assert BudgetHold.objects.get(job_uuid=forgotten.pk).released_at is not None

    # later readings: the runaway still running (no fix), or fixed by sacctmgr — nothing changes
    usage_records_upsert(records=[_runaway(forgotten)])
    assert usage_records_upsert(records=fake.records[1:]).written == 0  # the fake's fix: COMPLETED at its start
    assert UsageRecord.objects.filter(job_id=forgotten.slurm_job_id).count() == 1
    row.refresh_from_db()
    assert (row.provisional, row.gpu_seconds, row.portal_job_uuid) == (False, 0, forgotten.pk)

    assert jobs_sync().get("forgotten_ended", 0) == 0  # ended once
    assert fake.calls["runaway_jobs_fix"] == 1


def test_a_job_back_in_the_queue_is_unmarked_and_one_that_ended_normally_is_not_forgotten(world, inventory, fake, settings):
    settings.JOB_LOST_AFTER_SECONDS = 60
    back = _running(world, fake, "back")
    ended = _running(world, fake, "ended")
    entries = list(fake.queue_entries)
    fake.queue_entries = []
    fake.records = [_runaway(back), accounting_record(ended.slurm_job_id, "COMPLETED", ended.slurm_tag)]
    jobs_sync()
    assert Job.objects.get(pk=back.pk).gone_from_queue_at is not None
    assert Job.objects.get(pk=ended.pk).state == JobState.COMPLETED
    fake.queue_entries = [e for e in entries if e.job_id == back.slurm_job_id]
    jobs_sync()
    back.refresh_from_db()
    assert (back.state, back.gone_from_queue_at) == (JobState.RUNNING, None)


def test_without_the_operator_level_the_portal_closes_the_usage_alone(world, inventory, fake, settings, monkeypatch):
    from portal.slurm import SlurmRejected

    def denied():
        raise SlurmRejected("sacctmgr: Access/permission denied")

    settings.JOB_LOST_AFTER_SECONDS = 60
    job = _running(world, fake, "forgotten")
    fake.queue_entries, fake.records = [], [_runaway(job)]
    monkeypatch.setattr(fake, "runaway_jobs_fix", denied)
    jobs_sync()
    Job.objects.filter(pk=job.pk).update(gone_from_queue_at=timezone.now() - dt.timedelta(seconds=61))
    stats = jobs_sync()
    assert stats["forgotten_ended"] == 1 and "denied" in stats["runaway_fix_error"]
    from portal.models import SyncStatus

    assert "denied" in SyncStatus.objects.get(kind="jobs").data["runaway_fix_error"]  # what an operator sees
    # sacct keeps it RUNNING, its Elapsed growing: the ingestion never charges it so
    later = dataclasses.replace(_runaway(job), elapsed_seconds=7200)
    usage_records_upsert(records=[later])
    row = UsageRecord.objects.get(job_id=job.slurm_job_id)
    assert (row.provisional, row.gpu_seconds) == (False, 0)


def test_a_started_job_accounting_never_saw_start_is_ended_and_its_hold_released(world, inventory, fake, settings):
    """The controller died before its start reached slurmdbd: accounting holds it PENDING with no end
    (or nothing). The portal saw it run: not sent again (it may have run), ended, nothing to charge."""
    settings.JOB_LOST_AFTER_SECONDS = 60
    job = _running(world, fake, "forgotten")
    fake.queue_entries = []
    fake.records = [dataclasses.replace(accounting_record(job.slurm_job_id, "PENDING", "", submitted=job.submitted_at),
                                        start_time=job.started_at, end_time=None)]  # fmt: skip
    stats = jobs_sync()
    assert stats["resent"] == 0
    Job.objects.filter(pk=job.pk).update(gone_from_queue_at=timezone.now() - dt.timedelta(seconds=61))
    stats = jobs_sync()
    job.refresh_from_db()
    assert (stats["forgotten_ended"], job.state, job.slurm_job_id) == (1, JobState.FAILED, job.slurm_job_id)
    assert BudgetHold.objects.get(job_uuid=job.pk).released_at is not None
    assert "runaway_fixed" not in stats and fake.calls["runaway_jobs_fix"] == 0
