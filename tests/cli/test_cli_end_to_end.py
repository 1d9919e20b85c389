"""The CLI as a user runs it: a subprocess against a live portal (pytest-django's live_server),
a real Celery worker relaying to the local Slurm cluster, and a sync loop standing in for beat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.choices import JobState
from jobs.models import Job

ROOT = Path(__file__).resolve().parents[2]

SBATCH_SCRIPT = """#!/bin/bash
#SBATCH --gres=gpu:a100:1
#SBATCH --time=5
echo CUDA=$CUDA_VISIBLE_DEVICES
"""




def run_cli(args: list[str], *, env: dict[str, str], timeout: float = 180, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuportal_cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def alices_directory():
    """A directory of alice's own, where she runs `gpuportal submit` (the job starts there, as under
    sbatch: a directory its user cannot write would fail the job as it would fail sbatch's)."""
    import pwd
    import shutil

    user = pwd.getpwnam("alice")
    path = Path(user.pw_dir) / f"gpuportal-cli-e2e-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slurm
@pytest.mark.celery
def test_cli_submits_an_sbatch_script_and_waits_until_completed(cluster, real_worker, jobs_sync_loop, live_server, tmp_path,
                                                                alices_directory):  # fmt: skip
    from portal.services import api_token_create

    world = cluster
    _, key = api_token_create(user=world.alice, name="cli e2e")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")

    login = run_cli(["login", "--url", live_server.url, "--token", key], env=env, timeout=60)
    assert login.returncode == 0, login.stderr
    assert "vision" in login.stdout

    script = tmp_path / "cuda.sh"
    script.write_text(SBATCH_SCRIPT)
    try:
        submit = run_cli(["submit", str(script), "--team", "vision", "--wait", "--poll-interval", "1", "--json"], env=env,
                         timeout=120, cwd=alices_directory)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        stuck = Job.objects.values("state", "slurm_job_id", "relay_attempts", "last_relay_error", "state_reason").first()
        pytest.fail(f"gpuportal submit --wait did not return within 120 s; job: {stuck}; output: {exc.stdout!r}")

    assert submit.returncode == 0, f"stdout:\n{submit.stdout}\nstderr:\n{submit.stderr}"
    job = Job.objects.get()
    assert job.state == JobState.COMPLETED
    assert (job.gpu_type, job.gpus, job.time_limit_minutes, job.name) == ("a100", 1, 5, "cuda.sh")
    assert job.slurm_job_id is not None and job.exit_code == 0
    assert job.idempotency_key  # the CLI sent a generated key
    assert job.workdir == str(alices_directory)  # where she ran it, as sbatch would
    assert "COMPLETED" in submit.stdout
    final = json.loads(submit.stdout[submit.stdout.index("{"):])
    assert final["state"] == "COMPLETED"

    logs = run_cli(["logs", str(job.pk)], env=env, timeout=60)
    assert logs.returncode == 0, logs.stderr
    assert "CUDA=" in logs.stdout

    status = run_cli(["status"], env=env, timeout=60)
    assert status.returncode == 0 and str(job.pk)[:8] in status.stdout and "COMPLETED" in status.stdout

    cancel = run_cli(["cancel", str(job.pk)], env=env, timeout=60)
    assert cancel.returncode == 65 and "already ended" in cancel.stderr
