"""Job names, scripts, environment values and paths never reach a shell on the portal's side: the
gateway runs sbatch with an argv list and the script on stdin; environment values go in sbatch's
export file (NUL-separated, never the script, argv or sbatch's own environment) and only the job
sees them — as literal strings. Proven on the real cluster."""

from __future__ import annotations

import os
import uuid

import pytest
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import jobs_sync
from tests.faults.conftest import cancel_live_jobs_of_this_test
from tests.support import job_payload, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def test_shell_metacharacters_in_environment_and_paths_arrive_literally_and_run_nothing(
    cluster, django_capture_on_commit_callbacks
):
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    hostile = {
        "SUBST": f"$(touch {marker}-subst)",
        "BACKTICK": f"`touch {marker}-tick`",
        "QUOTE": f"'; touch {marker}-quote; echo '",
        "CHAIN": f"x && touch {marker}-chain; touch {marker}-semi | cat",
        "NEWLINE": f"a\ntouch {marker}-newline",
    }
    script = "#!/bin/bash\n" + "".join(f"printf '%s=<%s>\\n' {name} \"${name}\"\n" for name in sorted(hostile))
    client = APIClient()
    client.force_authenticate(user=cluster.alice)
    try:
        with django_capture_on_commit_callbacks(execute=True):  # the relay runs (eagerly): real sbatch
            response = client.post(
                "/api/v1/jobs/",
                job_payload(name="env-literal", script=script, partition="debug", gpu_type="", gpus=1,
                            time_limit_minutes=1, memory_gb=None, environment=hostile),
                format="json",
            )  # fmt: skip
        assert response.status_code == 201, response.json()
        job_id = response.json()["id"]

        def finished():
            jobs_sync()
            return Job.objects.get(pk=job_id).state in (JobState.COMPLETED, JobState.FAILED)

        wait_for(finished, timeout=60, interval=0.5)
        job = Job.objects.get(pk=job_id)
        assert job.state == JobState.COMPLETED, (job.state, job.state_reason)
        output = wait_for(lambda: client.get(f"/api/v1/jobs/{job_id}/output/").json()["data"], timeout=20)
        for name, value in hostile.items():
            assert f"{name}=<{value}>" in output, (name, output)
        created = [p for p in os.listdir("/tmp") if p.startswith(os.path.basename(marker))]
        assert created == []
    finally:
        cancel_live_jobs_of_this_test()


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "x;touch /tmp/pwned"},
        {"name": "$(id)"},
        {"name": "a b"},
        {"name": "x\nY"},
        {"environment": {"A;B": "1"}},
        {"environment": {"$(id)": "1"}},
        {"workdir": "relative/$(id)"},
        {"workdir": "/tmp/%x"},
        {"partition": "debug --uid=0"},
        {"gpu_type": "a100 --uid=0"},
    ],
)
def test_metacharacters_in_names_and_options_are_refused_before_slurm(cluster, overrides, django_capture_on_commit_callbacks):
    client = APIClient()
    client.force_authenticate(user=cluster.alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/api/v1/jobs/", job_payload(**overrides), format="json")
    assert response.status_code == 400, response.json()
    assert set(response.json()) == {"detail", "errors"}
    assert Job.objects.count() == 0


def test_a_workdir_with_metacharacters_is_an_argv_value_not_a_command(cluster, django_capture_on_commit_callbacks):
    """An absolute path may contain '$(…)'; it reaches sbatch as one --chdir= argument."""
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    workdir = f"/tmp/gp-{uuid.uuid4().hex[:8]}-$(touch {marker})"
    client = APIClient()
    client.force_authenticate(user=cluster.alice)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(
                "/api/v1/jobs/",
                job_payload(name="odd-dir", script="#!/bin/bash\ntrue\n", partition="debug", gpu_type="", gpus=1,
                            time_limit_minutes=1, memory_gb=None, workdir=workdir),
                format="json",
            )  # fmt: skip
        assert response.status_code == 201
        job = Job.objects.get(pk=response.json()["id"])
        assert job.slurm_job_id is not None or job.state == JobState.SUBMIT_FAILED
        wait_for(lambda: jobs_sync() is not None and not os.path.exists(marker), timeout=5)
        assert not os.path.exists(marker)
    finally:
        cancel_live_jobs_of_this_test()
