"""Job-end e-mails, exactly once: the upgrade marks the jobs that ended before it (their notice went
out with the old task), so the sweeper sends them nothing; two runs at once for the same jobs (the
sync's task and a sweep's repeat) send each notice once."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from decimal import Decimal

import pytest
from django.core import mail
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("jobs", "0006_booking_fk_budget_holds")]


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_marks_jobs_that_ended_before_it_and_the_sweeper_sends_them_nothing():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    now = timezone.now()
    team = old.get_model("portal", "Team").objects.create(name="Vision", slug="vision", slurm_account="vision")
    user = old.get_model("auth", "User").objects.create(username="alice", email="alice@example.org")
    Job = old.get_model("jobs", "Job")

    def job(state, **fields):
        return Job.objects.create(
            id=uuid.uuid4(), team_id=team.pk, submitter_id=user.pk, name="j", script="true", partition="gpu",
            gpus=1, time_limit_minutes=60, workdir="/tmp", state=state, estimated_gpu_hours=Decimal(1), **fields,
        )  # fmt: skip

    ended = job("COMPLETED", slurm_job_id=9101, ended_at=now - dt.timedelta(hours=1))
    running = job("RUNNING", slurm_job_id=9102)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from jobs.models import Job as NewJob
    from jobs.services import job_end_notify_sweep
    from portal.models import Profile

    Profile.objects.update_or_create(user_id=user.pk, defaults={"notify_job_end": True})
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
    start, sent = threading.Barrier(2), []

    def run():
        try:
            start.wait()
            sent.append(job_end_notify_send(job_ids=ids))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(sent) == 20 and len(sent) == 2
    assert sorted(m.subject for m in mail.outbox) == sorted(f"[gpuportal] j{i}: COMPLETED" for i in range(20))
    assert not Job.objects.filter(end_notified_at__isnull=True).exists()
