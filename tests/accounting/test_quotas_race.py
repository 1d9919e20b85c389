"""The budget check under concurrency: 50 parallel submissions (threads, each its own database
connection, transactional database) against a budget that fits exactly 10 — exactly 10 accepted, for
every shape of job (throttled arrays and jobs that will run into their time limit among them)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.utils import timezone

from accounting.models import BudgetTotal
from accounting.selectors import billing_date
from jobs.models import Job
from jobs.services import job_submit
from portal.exceptions import Conflict
from portal.models import NodeInfo, PartitionInfo
from tests.factories import QuotaFactory

N = 50
FITS = 10


# Each shape is 1 GPU-h as Slurm can charge it at most, whatever form the request takes (fields, an
# array of the script, a %N-throttled array, --exclusive taking the whole 4-GPU node, GPUs per task),
# its time limit plus the 60 s a job may run past it (the cluster's overrun: OverTimeLimit 0, the
# 30 s time-limit check, KillWait 30) — the figure a job that hits its limit is charged at most.
SHAPES = {
    "fields": ({"gpu_type": "a100", "gpus": 2, "time_limit_minutes": 29}, "true"),
    "array": ({}, "#!/bin/bash\n#SBATCH --array=0-3%1 --gres=gpu:a100:1 --time=14\ntrue\n"),
    "throttled-array": ({}, "#!/bin/bash\n#SBATCH --array=0-5%2 --gres=gpu:a100:1 --time=9\nsleep 3000\n"),
    "exclusive": ({}, "#!/bin/bash\n#SBATCH --exclusive\n#SBATCH --gres=gpu:a100:1 -t 14\ntrue\n"),
    "gpus-per-task": ({}, "#!/bin/bash\n#SBATCH -n 2 --gpus-per-task=a100:1 --time=29\ntrue\n"),
    "time-limit": ({}, "#!/bin/bash\n#SBATCH --gres=gpu:a100:4 --time=14\nsleep 100000  # runs into its limit\n"),
}


MIXED = "mixed"  # every shape in one race: submission n is shape n mod 6


@pytest.mark.parametrize("shape", [*sorted(SHAPES), MIXED])
@pytest.mark.django_db(transaction=True)
def test_fifty_parallel_submissions_against_a_budget_for_ten_accept_exactly_ten(world, monkeypatch, capsys, settings, shape):
    settings.SLURM_OVERRUN_SECONDS_UNREAD = 60  # Slurm's defaults: what a job may run past its limit
    from jobs import tasks

    monkeypatch.setattr(tasks.job_relay_drain, "delay", lambda: None)
    now = timezone.now()
    PartitionInfo.objects.create(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320,
                                 node_names=["a100-01"], seen_at=now)  # fmt: skip
    NodeInfo.objects.create(name="a100-01", state="IDLE", partitions=["gpu"], gpu_type="a100", gpus_total=4,
                            cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
    today = billing_date(now)
    # each job: at most 1 GPU-h (GPUs × (time limit + 60 s) × tasks); the budget: 10 GPU-h
    QuotaFactory(team=world.vision, gpu_hours=FITS, period_start=today - dt.timedelta(days=1),
                 period_end=today + dt.timedelta(days=2))  # fmt: skip
    barrier = threading.Barrier(N)

    def submit(n):
        fields, script = SHAPES[sorted(SHAPES)[n % len(SHAPES)] if shape == MIXED else shape]
        try:
            barrier.wait()
            try:
                job_submit(user=world.alice, team=world.vision, name=f"race-{n}", script=script, partition="gpu", **fields)
                return "accepted"
            except Conflict as exc:
                assert "GPU-h left for vision" in exc.message
                return "refused"
        finally:
            connection.close()

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=N) as pool:
        results = list(pool.map(submit, range(N)))
    seconds = time.monotonic() - started
    assert results.count("accepted") == FITS
    assert results.count("refused") == N - FITS
    assert Job.objects.count() == FITS
    assert set(Job.objects.values_list("estimated_gpu_hours", flat=True)) == {1}
    assert BudgetTotal.objects.get(team=world.vision, gpu_type="").held_gpu_hours == FITS  # held: exactly the budget
    admitted = sorted(sorted(SHAPES)[int(name.split("-")[1]) % len(SHAPES)] for name in Job.objects.values_list("name", flat=True))
    with capsys.disabled():
        print(f"\n[quota race, {shape}] {N} parallel submissions: {results.count('accepted')} accepted, "
              f"{results.count('refused')} refused in {seconds:.2f} s" + (f"; admitted: {', '.join(admitted)}" if shape == MIXED else ""))
