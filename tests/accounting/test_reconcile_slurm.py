"""Against the real local cluster (scripts/cluster up): run jobs of every kind, ingest, and compare
with Slurm's own figures.

What this can prove depends on the clock: slurmdbd rolls usage up hourly, so sreport knows finished
hours only. The test therefore checks
  1. the jobs it just ran, against an independent sacct read (ElapsedRaw × AllocTRES gres/gpu per job),
  2. ``reconcile_usage`` (portal vs sreport) over every finished hour of the month so far — jobs that
     ran before the current hour (earlier test runs, the demo) are really compared there; the jobs of
     this run are compared by sreport only in a run started after the next roll-up."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import uuid
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from accounting.models import UsageRecord
from accounting.selectors import billing_date, month_start
from accounting.services import usage_ingest
from portal.slurm import JobSpec, get_gateway
from tests.support import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

ACCOUNT = "acctrecon"
UNIX_USER = "acctrecon1"


def _slurm_env():
    return {**os.environ, **({"SLURM_CONF": settings.SLURM_CONF} if settings.SLURM_CONF else {})}


@pytest.fixture
def cluster(slurm_target):
    """The cluster of ``slurm_target`` (cli on 22.05 and 25.11, pyslurm on 25.11)."""
    try:
        get_gateway().ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"local Slurm cluster not running (scripts/cluster up): {exc}")
    from portal.unix import unix_user_ensure

    uid, gid = unix_user_ensure(UNIX_USER)
    gateway = get_gateway()
    gateway.account_add(ACCOUNT, description="accounting reconciliation test")
    gateway.user_add(UNIX_USER, ACCOUNT, default=True)
    return gateway, uid, gid


def _sacct_gpu_seconds(job_ids: list[int]) -> dict[int, int]:
    """Independent of the gateway's parse: sacct's ElapsedRaw × gres/gpu of AllocTRES per job."""
    sacct = os.path.join(settings.SLURM_BIN_DIR, "sacct") if settings.SLURM_BIN_DIR else "sacct"
    out = subprocess.run(
        [sacct, "-X", "-n", "-P", "-j", ",".join(map(str, job_ids)), "-o", "JobIDRaw,ElapsedRaw,AllocTRES,State"],
        capture_output=True, text=True, env=_slurm_env(), check=True, timeout=30,
    ).stdout  # fmt: skip
    result = {}
    for line in out.splitlines():
        job, elapsed, tres, state = line.split("|")
        gpus = 0
        for item in tres.split(","):
            if item.startswith("gres/gpu="):
                gpus = int(item.split("=")[1])
        result[int(job)] = gpus * int(elapsed)
    return result


def test_ingest_matches_sacct_and_sreport(cluster, world):
    gateway, uid, gid = cluster
    began = timezone.now()
    spec = dict(account=ACCOUNT, partition="gpu", gpu_type="a100", time_limit_minutes=5, uid=uid, gid=gid, workdir="/tmp")
    jobs = {
        "completed": gateway.submit(JobSpec(script="#!/bin/bash\nsleep 4\n", comment=f"gpuportal:{uuid.uuid4()}", **spec)),
        "failed": gateway.submit(JobSpec(script="#!/bin/bash\nsleep 2\nexit 3\n", gpus=2, **spec)),
        "cancelled": gateway.submit(JobSpec(script="#!/bin/bash\nsleep 300\n", **spec)),
        "multinode": gateway.submit(JobSpec(script="#!/bin/bash\nsleep 3\n", nodes=2, gpus=2, **spec)),
        "direct": gateway.submit(JobSpec(script="#!/bin/bash\nsleep 2\n", name="not-from-portal", **spec)),
    }

    def ran_three_seconds(job_id):  # by Slurm's own start time: the cancelled job has usage to account
        entry = next((e for e in gateway.queue() if e.job_id == job_id and e.state == "RUNNING"), None)
        return entry is not None and entry.start_time is not None and timezone.now() - entry.start_time >= dt.timedelta(seconds=3)

    wait_for(lambda: ran_three_seconds(jobs["cancelled"]), timeout=60, interval=0.5)
    gateway.cancel(jobs["cancelled"])

    def all_ended():
        records = {r.job_id: r for r in gateway.accounting(began - dt.timedelta(minutes=1), timezone.now())}
        done = [records.get(j) for j in jobs.values()]
        return all(r is not None and r.end_time is not None and r.partition for r in done) and records

    records = wait_for(all_ended, timeout=120, interval=0.5)
    assert records[jobs["failed"]].state == "FAILED" and records[jobs["cancelled"]].state == "CANCELLED"

    # ingest the whole month so far (every job on the cluster, portal or not)
    usage_ingest(since=dt.datetime.combine(month_start(billing_date(began)), dt.time(), tzinfo=dt.timezone.utc))
    rows = {r.job_id: r for r in UsageRecord.objects.filter(job_id__in=jobs.values(), account=ACCOUNT)}
    assert set(rows) == set(jobs.values())
    assert rows[jobs["completed"]].portal_job_uuid is not None and rows[jobs["direct"]].portal_job_uuid is None
    assert rows[jobs["multinode"]].num_nodes == 2 and rows[jobs["multinode"]].gpus == 2

    # 1. this run's jobs against sacct's own figures
    expected = _sacct_gpu_seconds(list(jobs.values()))
    assert {j: rows[j].gpu_seconds for j in jobs.values()} == expected
    assert all(v > 0 for v in expected.values())
    assert sum(s.gpu_seconds for r in rows.values() for s in r.slices.all()) == sum(expected.values())

    # 2. the portal against sreport over every hour slurmdbd has rolled up this month
    try:
        call_command("reconcile_usage", "--month", f"{began:%Y-%m}")
    except SystemExit as exc:  # differences → exit status 1
        pytest.fail(f"reconcile_usage found differences (exit {exc.code})")
    assert Decimal(0) <= Decimal(rows[jobs["completed"]].gpu_hours)
