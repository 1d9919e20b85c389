"""The upgrade: jobs 0005 builds accounting's budget holds from the jobs live at migration time (and
the ones that ran but whose final usage was not ingested), keeps Job.booking's values as a foreign
key, and the first submission after it finds the team's budget as it was."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("jobs", "0004_array_tasks"), ("accounting", "0003_bookings")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_builds_holds_for_live_and_unaccounted_jobs_and_keeps_bookings():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    now = timezone.now()
    team = old.get_model("portal", "Team").objects.create(name="Vision", slug="vision", slurm_account="vision")
    user = old.get_model("auth", "User").objects.create(username="alice")
    booking = old.get_model("accounting", "Booking").objects.create(
        team_id=team.pk, gpu_type="a100", gpus=4, start=now, end=now + dt.timedelta(hours=2), status="approved",
        reservation_name="gpuportal-test", approved_at=now,
    )  # fmt: skip
    old.get_model("accounting", "UsageRecord").objects.create(
        cluster="c", job_id=1, submit_time=now, start_time=now, state="RUNNING", account="vision", unix_user="alice",
        portal_job_uuid=None, gpu_hours=Decimal(3), known_until=now, first_seen_at=now,
    )  # fmt: skip
    Job = old.get_model("jobs", "Job")

    def job(state, **fields):
        return Job.objects.create(
            id=uuid.uuid4(), team_id=team.pk, submitter_id=user.pk, name="j", script="true", partition="gpu",
            gpu_type="a100", gpus=2, time_limit_minutes=60, workdir="/tmp", state=state, estimated_gpu_hours=Decimal(8),
            **fields,
        )  # fmt: skip

    pending = job("PENDING")
    running = job("RUNNING", started_at=now)
    unaccounted = job("COMPLETED", started_at=now, ended_at=now)
    accounted = job("COMPLETED", started_at=now, ended_at=now, accounted_at=now)
    never_ran = job("CANCELLED", ended_at=now)
    booked = job("PENDING", booking_id=booking.pk)
    dangling = job("COMPLETED", ended_at=now, accounted_at=now, booking_id=uuid.uuid4())
    old.get_model("accounting", "UsageRecord").objects.filter(job_id=1).update(portal_job_uuid=running.pk)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from accounting.models import BudgetHold
    from jobs.models import Job as NewJob

    holds = {h.job_uuid: h for h in BudgetHold.objects.all()}
    assert holds[pending.pk].held_gpu_hours == 8 and holds[pending.pk].released_at is None
    assert holds[running.pk].held_gpu_hours == 5  # 8 estimated − 3 ingested so far
    assert holds[unaccounted.pk].held_gpu_hours == 8 and holds[unaccounted.pk].released_at is None
    assert accounted.pk not in holds and never_ran.pk not in holds
    # bookings carry the charge (BOOKING_CHARGE_MODE=reserved): named, nothing held
    assert (holds[booked.pk].booking_id, holds[booked.pk].held_gpu_hours) == (booking.pk, 0)
    assert NewJob.objects.get(pk=booked.pk).booking_id == booking.pk
    assert NewJob.objects.get(pk=dangling.pk).booking_id is None  # its booking did not exist
    assert set(holds) == {pending.pk, running.pk, unaccounted.pk, booked.pk}
