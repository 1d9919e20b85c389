"""The bench account on the shared Slurm cluster: its live jobs, cancelling them all (drain), its
GPU cap while a benchmark runs, and leaving the cluster as it was found (no bench job, no cap, no
output files)."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from environment import BENCH_TEAM, BENCH_WORKDIR

# Slurm's final job states: a bench job in one of these holds nothing on the cluster.
_DONE = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE",
})  # fmt: skip


def gateway():
    from portal.slurm import get_gateway

    return get_gateway()


def bench_live_jobs() -> list[int]:
    """Slurm ids of the bench account's jobs the controller still holds alive (one squeue)."""
    return [e.job_id for e in gateway().queue() if e.account == BENCH_TEAM and e.state not in _DONE]


def drain_cluster(*, timeout: float = 120.0) -> int:
    """Cancel every live job of the bench account (scancel through the gateway, 4 at a time) and
    wait until the controller holds none. Returns how many were cancelled."""
    from portal.slurm import SlurmError

    cancelled = 0
    deadline = time.monotonic() + timeout
    while True:
        ids = bench_live_jobs()
        if not ids:
            return cancelled
        if time.monotonic() > deadline:
            print(f"  ! {len(ids)} bench jobs still alive in Slurm after {timeout:.0f} s", file=sys.stderr)
            return cancelled

        def cancel(job_id: int) -> None:
            try:
                gateway().cancel(job_id)
            except SlurmError as exc:
                print(f"  ! scancel {job_id}: {exc}", file=sys.stderr)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(cancel, ids))
        cancelled += len(ids)
        time.sleep(0.5)  # polling the controller until it holds none, not synchronising


def gpu_limit_set(gpus: int | None) -> None:
    """Cap the bench user's association in the bench account at ``gpus`` GPUs running at once
    (GrpTRES), or lift the cap (None), so that benchmark jobs never hold the whole shared cluster.
    The user's association, not the account's: the portal's own workers mirror the team's quota onto
    the account's association (accounting.services.slurm_limits, periodic), which would lift a cap
    set there in the middle of a run (it did: 352 of 1000 jobs ran under a "0 GPUs" cap)."""
    import subprocess

    from django.conf import settings

    from environment import BENCH_USER
    from portal.slurm.cli import _clean_env

    sacctmgr = os.path.join(settings.SLURM_BIN_DIR, "sacctmgr") if settings.SLURM_BIN_DIR else "sacctmgr"
    value = "-1" if gpus is None else str(int(gpus))
    argv = [sacctmgr, "-i", "modify", "user", "where", f"name={BENCH_USER}", f"account={BENCH_TEAM}",
            f"cluster={settings.SLURM_CLUSTER}", "set", f"GrpTRES=gres/gpu={value}"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          env=_clean_env(settings.SLURM_CONF, settings.SLURM_LIB_DIR))  # fmt: skip
    if proc.returncode and "Nothing modified" not in proc.stdout + proc.stderr:
        raise RuntimeError(f"sacctmgr could not set the bench cap: {proc.stderr.strip() or proc.stdout.strip()}")


def clean_workdir() -> None:
    """Remove the output files bench jobs left in BENCH_WORKDIR."""
    if os.path.isdir(BENCH_WORKDIR):
        for name in os.listdir(BENCH_WORKDIR):
            if name.startswith("gpuportal-"):
                try:
                    os.unlink(os.path.join(BENCH_WORKDIR, name))
                except OSError:
                    pass


def leave_cluster() -> None:
    """After a benchmark that submitted: no bench job left alive, the bench account uncapped, the
    jobs' output files removed."""
    drain_cluster()
    gpu_limit_set(None)
    clean_workdir()
