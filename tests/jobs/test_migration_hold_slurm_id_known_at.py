"""The upgrade: jobs 0018 gives the budget holds that already know their job's Slurm id the time the
portal learnt it (the job's submitted_at), which the usage ingestion's record matcher needs
(portal.slurm.tags.record_is_job); holds without a Slurm id are left alone."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("jobs", "0017_job_list_keyset_indexes"), ("accounting", "0012_budgethold_slurm_id_known_at")]


@pytest.mark.django_db(transaction=True)
def test_holds_with_a_slurm_id_learn_when_the_portal_learnt_it():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    submitted = timezone.now() - dt.timedelta(hours=2)
    team = old.get_model("portal", "Team").objects.create(name="Vision", slug="vision", slurm_account="vision")
    user = old.get_model("auth", "User").objects.create(username="alice")
    Job = old.get_model("jobs", "Job")
    Hold = old.get_model("accounting", "BudgetHold")

    def job(**fields):
        row = Job.objects.create(
            id=uuid.uuid4(), team_id=team.pk, submitter_id=user.pk, name="j", script="true", partition="gpu", gpus=1,
            time_limit_minutes=60, workdir="/tmp", estimated_gpu_hours=Decimal(1), **fields,
        )  # fmt: skip
        Hold.objects.create(job_uuid=row.pk, team_id=team.pk, estimated_gpu_hours=Decimal(1), held_gpu_hours=Decimal(1),
                            created_at=submitted - dt.timedelta(seconds=1),
                            slurm_cluster="gpuportal" if row.slurm_job_id else "", slurm_job_id=row.slurm_job_id)  # fmt: skip
        return row

    running = job(state="RUNNING", slurm_job_id=41, submitted_at=submitted)
    waiting = job(state="ACCEPTED")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from accounting.models import BudgetHold

    assert BudgetHold.objects.get(pk=running.pk).slurm_id_known_at == submitted
    assert BudgetHold.objects.get(pk=waiting.pk).slurm_id_known_at is None
