"""Job-end e-mails, exactly once: the upgrade marks the jobs that ended before it (their notice went
out with the old task), so the sweeper sends them nothing; two runs at once for the same jobs (the
sync's task and a sweep's repeat) send each notice once."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.core import mail
from django.core.management import call_command
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("jobs", "0006_booking_fk_budget_holds")]


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_marks_jobs_that_ended_before_it_and_the_sweeper_sends_them_nothing():
    call_command("migrate", *BEFORE[0], verbosity=0)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    Job = old.get_model("jobs", "Job")
    owner = {
        "team_id": old.get_model("portal", "Team").objects.create(name="Vision", slug="vision", slurm_account="vision").pk,
        "submitter_id": old.get_model("auth", "User").objects.create(username="alice", email="alice@example.org").pk,
    }
    now = timezone.now()

    def job(state, **fields):
        return Job.objects.create(id=uuid.uuid4(), name="j", script="true", partition="gpu", gpus=1, time_limit_minutes=60,
                                  workdir="/tmp", state=state, estimated_gpu_hours=Decimal(1), **owner, **fields)  # fmt: skip

    ended = job("COMPLETED", slurm_job_id=9101, ended_at=now - dt.timedelta(hours=1))
    running = job("RUNNING", slurm_job_id=9102)

    call_command("migrate", verbosity=0)

    from jobs.models import Job as NewJob
    from jobs.services import job_end_notify_sweep
    from portal.models import Profile

    Profile.objects.update_or_create(user_id=owner["submitter_id"], defaults={"notify_job_end": True})
    assert NewJob.objects.get(pk=ended.pk).end_notified_at == ended.ended_at
    assert NewJob.objects.get(pk=running.pk).end_notified_at is None
    assert job_end_notify_sweep() == [] and mail.outbox == []


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_send_each_notice_once(world):
    from jobs.choices import JobState
    from jobs.models import Job
    from jobs.services import job_end_notify_send
    from portal.models import Profile
    from tests.security.test_url_matrix import make_job

    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    ended = timezone.now() - dt.timedelta(minutes=10)
    ids = [str(make_job(world.vision, world.alice, state=JobState.COMPLETED, slurm_job_id=9200 + i, name=f"j{i}",
                        ended_at=ended).pk) for i in range(20)]  # fmt: skip
    start = threading.Barrier(2)

    def run(_):
        try:
            start.wait()
            return job_end_notify_send(job_ids=ids)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=2) as pool:
        sent = list(pool.map(run, range(2)))
    assert sum(sent) == 20 and len(sent) == 2
    assert sorted(m.subject for m in mail.outbox) == sorted(f"[gpuportal] j{i}: COMPLETED" for i in range(20))
    assert not Job.objects.filter(end_notified_at__isnull=True).exists()
