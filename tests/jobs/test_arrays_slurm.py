"""Array jobs end to end on the local cluster: one portal job with N tasks; the sync follows the
tasks from its one queue snapshot (rows 123_4 and 123_[5-9]) and one accounting read; each task's
state, exit code and output (%A/%a patterns); cancel cancels the whole array; usage per task is
ingested and summed on the parent."""

from __future__ import annotations

import re
import shutil
import tempfile
from decimal import ROUND_UP, Decimal
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.choices import TERMINAL_STATES, JobState
from jobs.models import Job, JobArrayTask
from jobs.services import (
    job_array_task_cancel_relay_run,
    job_cancel,
    job_cancel_relay_run,
    job_relay_run,
    job_submit,
    jobs_sync,
)
from tests.support import slurm_command, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

ARRAY = """#!/bin/bash
#SBATCH --array=0-3%2
#SBATCH --gres=gpu:1 --time=5
#SBATCH -J arr -o %x-%A_%a.out
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID"
exit $(( SLURM_ARRAY_TASK_ID == 3 ? 3 : 0 ))
"""


def sync_until(predicate, timeout=90.0):
    def step():
        jobs_sync()
        return predicate()

    return wait_for(step, timeout=timeout, interval=0.3)


@pytest.fixture
def shared_dir():
    """A directory the job's user (alice) can write to (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="gpuportal-array-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_array_job_runs_its_tasks_and_the_portal_follows_each(cluster, relays, shared_dir):
    tmp_path = shared_dir
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, script=ARRAY, workdir=str(tmp_path))
    # the hold: 4 tasks × 1 GPU × (5 min + what the cluster lets a task overrun: OverTimeLimit, the
    # controller's 30 s time-limit check, KillWait), the configuration read from `scontrol show config`
    config = slurm_command("scontrol", "show", "config").stdout
    kill_wait = int(re.search(r"^KillWait\s*=\s*(\d+) sec", config, re.MULTILINE).group(1))
    over_time = int(re.search(r"^OverTimeLimit\s*=\s*(\d+) min", config, re.MULTILINE).group(1))
    per_task = 5 * 60 + over_time * 60 + 30 + kill_wait
    assert (job.array_tasks, job.gpus, job.estimated_gpu_seconds) == (4, 1, 4 * 1 * per_task)
    assert job.estimated_gpu_hours == (Decimal(4 * per_task) / 3600).quantize(Decimal("0.000001"), ROUND_UP)
    assert job_relay_run(job.pk) == "submitted"
    job.refresh_from_db()
    sync_until(lambda: Job.objects.get(pk=job.pk).state in TERMINAL_STATES)
    job.refresh_from_db()
    tasks = {t.index: t for t in JobArrayTask.objects.filter(job=job)}
    assert sorted(tasks) == [0, 1, 2, 3]
    assert {t.state for t in tasks.values()} == {JobState.COMPLETED, JobState.FAILED}
    assert (tasks[3].state, tasks[3].exit_code, tasks[0].exit_code) == (JobState.FAILED, 3, 0)
    assert job.state == JobState.FAILED and job.exit_code == 3  # one task failed: the array failed
    assert all(t.slurm_job_id for t in tasks.values()) and len({t.slurm_job_id for t in tasks.values()}) == 4

    client = APIClient()
    client.force_authenticate(cluster.alice)
    detail = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["task_counts"] == {"COMPLETED": 3, "FAILED": 1}
    assert [(t["index"], t["state"], t["exit_code"]) for t in detail["tasks"]][3] == (3, "FAILED", 3)
    out = client.get(f"/api/v1/jobs/{job.pk}/output/?task=2").json()
    assert out["data"] == f"task 2 of {job.slurm_job_id}\n", out
    assert (tmp_path / f"arr-{job.slurm_job_id}_2.out").exists()

    # usage: one record per task, like any job, all on the parent
    from accounting.models import UsageRecord
    from accounting.services import usage_ingest

    def ingested():
        usage_ingest(since=job.created_at - timezone.timedelta(minutes=5))
        return UsageRecord.objects.filter(portal_job_uuid=job.pk).count() == 4

    wait_for(ingested, timeout=60, interval=1)
    records = UsageRecord.objects.filter(portal_job_uuid=job.pk)
    assert {r.job_id for r in records} == {t.slurm_job_id for t in tasks.values()}
    assert sum(r.gpus for r in records) == 4


def test_cancel_cancels_the_whole_array(cluster, relays):
    script = "#!/bin/bash\n#SBATCH --array=0-9%1 --gres=gpu:1 -t 5\nsleep 120\n"
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, script=script)
    assert job_relay_run(job.pk) == "submitted"
    sync_until(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING)
    job_cancel(user=cluster.alice, job=Job.objects.get(pk=job.pk))
    assert job_cancel_relay_run(job.pk) == "sent"
    sync_until(lambda: Job.objects.get(pk=job.pk).state == JobState.CANCELLED)
    job.refresh_from_db()
    assert JobArrayTask.objects.filter(job=job).exclude(state=JobState.CANCELLED).count() == 0


def test_one_task_is_cancelled_by_index_through_the_api(cluster, relays):
    script = "#!/bin/bash\n#SBATCH --array=0-1 --gres=gpu:1 -t 5\nsleep 120\n"
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, script=script)
    assert job_relay_run(job.pk) == "submitted"
    client = APIClient()
    client.force_authenticate(cluster.alice)
    assert client.post(f"/api/v1/jobs/{job.pk}/cancel/?task=7").status_code == 400  # not in 0-1
    assert client.post(f"/api/v1/jobs/{job.pk}/cancel/?task=1").status_code == 202
    assert job_array_task_cancel_relay_run(job.pk, 1) == "sent"  # what the job_array_task_cancel_relay task does
    sync_until(lambda: JobArrayTask.objects.filter(job=job, index=1, state=JobState.CANCELLED).exists())
    assert Job.objects.get(pk=job.pk).state not in TERMINAL_STATES  # task 0 goes on
    assert client.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202
    assert job_cancel_relay_run(job.pk) == "sent"  # what the cancel relay task does
    sync_until(lambda: Job.objects.get(pk=job.pk).state == JobState.CANCELLED)
