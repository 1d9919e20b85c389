"""Jobs a Slurm controller forgot while they ran, for real (issue 42; the fake-gateway cases:
tests/jobs/test_forgotten_running.py). A job runs; its controller is SIGKILLed and comes back with the
job state it had saved before the job was submitted — what a backup controller loads when the primary
died before its asynchronous state save (make test-site: "Vestigial state files for JobId=…"). The
controller then has the node kill the job ("Orphan StepId=….batch"), slurmdbd keeps its start without
an end (a runaway), and the id is free to be given again. The jobs sync must end the job, charge it
once as Slurm's runaway fix does, and have Slurm fix the runaway: sacct is the oracle.

Restoring an older job_state makes the controller forget every job submitted since the copy (a few
seconds here): other tests' jobs on the same cluster in that window become runaways too, as in a real
takeover."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from accounting.models import UsageRecord
from accounting.services import usage_ingest, usage_reconcile
from jobs.choices import IN_SLURM_STATES, JobState, state_from_slurm
from jobs.models import Job
from jobs.services import job_relay_drain_run, job_submit, jobs_sync
from portal.slurm import get_gateway
from tests.conftest import ROOT
from tests.support import slurm_cancel_tagged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db, pytest.mark.runaway_fix]


@pytest.fixture(autouse=True)
def _rollups_redone(slurm_target, settings):
    """The runaway fix sets slurmdbd's roll-ups back (to the week's start) and slurmdbd redoes them only at its
    next hourly roll-up: until then sreport is not what the reconciliation tests of these shared clusters
    compare with, and a next run within the hour (the post-stop CI right after a session's) failed 9 of them.
    Redone now with `sacctmgr -i rollup` (the hourly roll-up's own call, from where the fix set it back)."""
    yield
    sacctmgr = os.path.join(settings.SLURM_BIN_DIR or "/usr/bin", "sacctmgr")
    done = subprocess.run([sacctmgr, "-i", "rollup"], env={**os.environ, "SLURM_CONF": settings.SLURM_CONF},
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr


def _cluster_dir() -> Path:
    return Path(django_settings.SLURM_CONF).resolve().parents[1]


def _state_dir(cluster_dir: Path) -> Path:
    for line in (cluster_dir / "etc" / "slurm.conf").read_text().splitlines():
        if line.strip().startswith("StateSaveLocation="):
            return Path(line.split("=", 1)[1].strip())
    return cluster_dir / "state"


def _controller_restarted_with(saved: Path, cluster_dir: Path, release: str) -> None:
    """SIGKILL slurmctld, put the saved job state back, start it (scripts/cluster ctld-start)."""
    pid = int((cluster_dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=30, what="slurmctld to die")
    for name in ("job_state", "job_state.old"):
        if (saved / name).exists():
            shutil.copy2(saved / name, _state_dir(cluster_dir) / name)
    argv = [str(ROOT / "scripts" / "cluster"), "ctld-start", *(["--slurm", release] if release != "22.05" else [])]
    for _ in range(2):  # a pid file naming the dead controller for a moment more: the first start may wait in vain
        if subprocess.run(argv, capture_output=True, text=True, timeout=120).returncode == 0:
            return
        time.sleep(1)
    pytest.fail("slurmctld did not come back")


def _live(entry) -> bool:
    """A queue entry the portal reads as a job still in Slurm (jobs.choices: its rule for Slurm's states)."""
    return state_from_slurm(entry.state) in IN_SLURM_STATES


def _others_brought_back_cancelled(live_before: set[int]) -> None:
    """The copied state is what slurmctld had saved, and it saves at most every few seconds: a job another
    test ended or cancelled in the seconds before the copy is live again in it (a held job of
    tests/slurm/test_request_cluster_options.py, cancelled in that test, stayed in the 22.05 queue after
    two CI runs). A real takeover brings such a job back too; the suite cancels it, as it is no test's
    job any more: every job live now that was not live before the controller's SIGKILL."""
    gateway = get_gateway()
    for entry in gateway.queue():
        if _live(entry) and entry.job_id not in live_before:
            gateway.cancel(entry.job_id)


def _sacct(job: Job) -> dict:
    """The job's own record (sacct -D: the id may have been given again), by its submit time."""
    from portal.slurm.cli import CliGateway  # the oracle is sacct itself, whatever the backend under test

    cli = CliGateway(cluster=django_settings.SLURM_CLUSTER, timeout=30, slurm_conf=django_settings.SLURM_CONF,
                     bin_dir=django_settings.SLURM_BIN_DIR)  # fmt: skip
    start = job.submitted_at - dt.timedelta(minutes=5)
    records = [r for r in cli.accounting(start, timezone.now(), job_ids={job.slurm_job_id})
               if r.submit_time is not None and abs((r.submit_time - job.submitted_at).total_seconds()) <= 5]  # fmt: skip
    assert len(records) == 1, records
    return records[0]


def test_a_running_job_the_controller_forgot_is_ended_charged_once_and_its_runaway_fixed(slurm_target, cluster, settings, tmp_path):
    settings.JOB_LOST_AFTER_SECONDS = 60
    cluster_dir = _cluster_dir()
    release = "25.11" if "25" in cluster_dir.name else "22.05"
    for name in ("job_state", "job_state.old"):  # the state a backup would load: saved before the job existed
        if (_state_dir(cluster_dir) / name).exists():
            shutil.copy2(_state_dir(cluster_dir) / name, tmp_path / name)
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, name="forgotten", script="#!/bin/bash\nsleep 297\n",
                        partition="debug", gpus=1, time_limit_minutes=5)  # fmt: skip
    try:
        job_relay_drain_run(limit=10)
        job.refresh_from_db()
        assert job.slurm_job_id is not None

        def running():
            jobs_sync()
            job.refresh_from_db()
            return job.state == JobState.RUNNING and _sacct(job).state == "RUNNING"

        wait_for(running, timeout=60, interval=0.5, what="the job running, in the portal and in slurmdbd")
        live_before = {e.job_id for e in get_gateway().queue() if _live(e)}
        _controller_restarted_with(tmp_path, cluster_dir, release)
        _others_brought_back_cancelled(live_before)

        wait_for(lambda: job.slurm_job_id not in {e.job_id for e in get_gateway().queue() if e.comment == job.slurm_tag},
                 timeout=30, what="the controller to have forgotten the job")  # fmt: skip
        runaway = _sacct(job)
        assert (runaway.state, runaway.end_time) == ("RUNNING", None)  # slurmdbd: started, never ended

        assert jobs_sync()["forgotten_seen"] == 1
        job.refresh_from_db()
        assert job.state == JobState.RUNNING and job.gone_from_queue_at is not None
        Job.objects.filter(pk=job.pk).update(gone_from_queue_at=timezone.now() - dt.timedelta(seconds=61))
        stats = jobs_sync()
        assert stats["forgotten_ended"] == 1 and stats["runaway_fixed"] >= 1, stats

        fixed = _sacct(job)  # the oracle after Slurm's fix: COMPLETED, ended at its start
        assert fixed.state == "COMPLETED" and fixed.end_time == fixed.start_time == runaway.start_time
        assert fixed.elapsed_seconds == 0
        job.refresh_from_db()
        assert (job.state, job.ended_at, job.started_at) == (JobState.FAILED, fixed.end_time, fixed.start_time)

        # charged once, as sacct says, through the ingestion: another ingestion of the window changes nothing
        def charged():
            return [(r.job_id, r.submit_time, r.state, r.provisional, r.gpu_seconds, r.gpu_hours)
                    for r in UsageRecord.objects.filter(job_id=job.slurm_job_id, submit_time=fixed.submit_time)]  # fmt: skip

        closed = charged()
        assert [row[:5] for row in closed] == [(job.slurm_job_id, fixed.submit_time, "COMPLETED", False, fixed.gpus * fixed.elapsed_seconds)]
        usage_ingest(since=job.submitted_at - dt.timedelta(minutes=1))
        assert charged() == closed
        assert list(UsageRecord.objects.filter(job_id=job.slurm_job_id, submit_time=fixed.submit_time)
                    .values_list("portal_job_uuid", flat=True)) == [job.pk]  # fmt: skip
        assert jobs_sync().get("forgotten_ended", 0) == 0

        # slurmdbd rolls the fixed hours up again at its next roll-up: until then the reconciliation
        # compares nothing with sreport (which still counts the runaway as running) and says why
        [reconciled] = usage_reconcile(month=timezone.localdate().replace(day=1), clusters=[django_settings.SLURM_CLUSTER])
        assert "runaway jobs were fixed" in reconciled.stale and reconciled.end == reconciled.start
        assert reconciled.differences == []
    finally:
        slurm_cancel_tagged([job])
