"""The relay's lease (issue 42, the site test's finding 6: a job in flight on a host that dies waited
for a fixed 120 s lease). The lease is now short (jobs.services.relay.RELAY_LEASE_SECONDS, 30 s) and
renewed by the relay while it works (every RELAY_LEASE_RENEW_SECONDS), and no sbatch starts that could
outlive it as last renewed. Against a real worker (tests/faults/conftest.py) and the real cluster, with
sbatch slowed to 1.5 s a call so that a relay takes longer than its lease:

- the worker SIGKILLed mid-relay: its jobs are taken again once the production lease (30 s) has run
  out — not 120 s — and each reaches Slurm exactly once (counted by tag in the queue and accounting);
- a live relay working longer than its lease keeps its jobs: another relay trying all along claims
  none of them, and each reaches Slurm exactly once."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import JobState
from jobs.models import Job
from tests.faults.conftest import FAULT_SLURM_TIMEOUT, assert_each_job_in_slurm_exactly_once, recover, submit_tiny
from tests.support import slurm_tags

pytestmark = [pytest.mark.faults, pytest.mark.slurm, pytest.mark.celery]

SBATCH_SECONDS = 1.5


def _slow_sbatch_dir(tmp_path: Path) -> Path:
    """A SLURM_BIN_DIR whose sbatch waits SBATCH_SECONDS, then runs Slurm's own (what a loaded
    controller looks like to the relay); every other command is Slurm's own."""
    from django.conf import settings

    directory = tmp_path / "slow-slurm-bin"
    directory.mkdir()
    real = Path(settings.SLURM_BIN_DIR) if settings.SLURM_BIN_DIR else None
    for name in ("squeue", "sacct", "scontrol", "scancel", "sacctmgr", "sinfo", "sreport", "sbatch"):
        path = real / name if real else Path(shutil.which(name) or "")
        if name == "sbatch":
            (directory / name).write_text(f'#!/bin/bash\nsleep {SBATCH_SECONDS}\nexec {path} "$@"\n')
            os.chmod(directory / name, 0o755)
        elif path.name:
            (directory / name).symlink_to(path)
    return directory


def _worker_with(faults, *, lease: int, bin_dir: Path) -> None:
    faults.worker.stop()
    faults.worker.extra_env = {"GPUPORTAL_TEST_RELAY_LEASE_SECONDS": str(lease), "SLURM_BIN_DIR": str(bin_dir)}


def test_a_relay_killed_mid_batch_frees_its_jobs_after_the_short_lease_each_reaches_slurm_once(
    faults, cluster, monkeypatch, tmp_path, settings
):
    settings.SLURM_TIMEOUT = FAULT_SLURM_TIMEOUT  # this process's lease is the worker's
    lease = services.RELAY_LEASE_SECONDS  # the production lease, not the fault tests' shorter one
    monkeypatch.setattr(services.relay, "RELAY_LEASE_SECONDS", lease)
    _worker_with(faults, lease=lease, bin_dir=_slow_sbatch_dir(tmp_path))
    ids = [submit_tiny(cluster, f"lease-kill-{i}").pk for i in range(24)]
    tags = {job.slurm_tag for job in Job.objects.filter(pk__in=ids)}
    faults.worker.start(wait=False)
    started = time.monotonic()
    while not (tags & slurm_tags()):  # the relay is between its sbatch calls and its one write
        assert time.monotonic() - started < 90, "the relay sent nothing to Slurm within 90 s"
        time.sleep(0.1)
    faults.worker.kill()
    killed, killed_at = time.monotonic(), timezone.now()
    held = Job.objects.filter(pk__in=ids, state=JobState.ACCEPTED, relay_token__isnull=False).count()
    renewed_at = max(Job.objects.filter(pk__in=ids, relay_token__isnull=False).values_list("relay_started_at", flat=True))
    free_after = (renewed_at + timezone.timedelta(seconds=lease) - killed_at).total_seconds()
    figures = recover(ids, timeout=150, sweep_every=2, worker=faults.worker)
    result = assert_each_job_in_slurm_exactly_once(ids, faults.since)
    recovered = time.monotonic() - killed
    print(f"\n[faults] relay lease {lease} s, SIGKILL mid-relay: held_by_the_dead_relay={held}, "
          f"recovered_after_kill_s={recovered:.1f}, lease_ran_out_after_kill_s={free_after:.1f}, "
          f"sweeps={figures['sweeps']}, relay_attempts={result['relay_attempts']}")  # fmt: skip
    assert held > 0, "the kill missed the relay"
    assert recovered < lease + 30, "the dead relay's jobs waited longer than the lease and a sweep or two"
    assert max(result["relay_attempts"]) >= 2  # taken again (after the lease), looked up by tag first


def test_a_live_relay_longer_than_its_lease_keeps_its_jobs_by_renewing_it(faults, cluster, monkeypatch, tmp_path, settings):
    settings.SLURM_TIMEOUT = FAULT_SLURM_TIMEOUT  # this process's lease is the worker's
    lease = 16  # the shortest the fault worker's SLURM_TIMEOUT (4 s) allows: 4 + 2 x 5 + 2
    monkeypatch.setattr(services.relay, "RELAY_LEASE_SECONDS", lease)
    _worker_with(faults, lease=lease, bin_dir=_slow_sbatch_dir(tmp_path))
    n = 60  # 60 x 1.5 s / 4 threads: ~23 s of sbatch, longer than the lease
    ids = [submit_tiny(cluster, f"lease-live-{i}").pk for i in range(n)]
    faults.worker.start(wait=False)
    started = time.monotonic()
    while Job.objects.filter(pk__in=ids, relay_token__isnull=True, state=JobState.ACCEPTED).exists():
        assert time.monotonic() - started < 60, "the worker's relay did not claim the jobs"
        time.sleep(0.1)
    stolen = 0
    while Job.objects.filter(pk__in=ids, state=JobState.ACCEPTED).exists():  # another relay tries all along
        token, claimed = services._claim(ids)
        if claimed:  # would be a second relay holding them: hand them back so the worker's may go on
            stolen += len(claimed)
            Job.objects.filter(relay_token=token).update(relay_token=None, relay_started_at=None)
        assert time.monotonic() - started < 120, "the relay did not finish"
        time.sleep(0.5)
    took = time.monotonic() - started
    result = assert_each_job_in_slurm_exactly_once(ids, faults.since)
    print(f"\n[faults] relay lease {lease} s renewed: {n} jobs relayed in {took:.1f} s by one relay, claims "
          f"taken by another meanwhile={stolen}, relay_attempts={result['relay_attempts']}")  # fmt: skip
    assert took > lease, "the relay should outlast its lease for this test to say anything"
    assert stolen == 0 and result["relay_attempts"] == {1: n}
