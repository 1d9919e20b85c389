"""The job's submit directory (jobs/workdirs.py): the user's default from JOB_DEFAULT_WORKDIR, the
field, what the relay sends (SLURM_SUBMIT_DIR = the directory sbatch runs in), and the default
directory created as the user, refused when another user made it first (issue 28 item 3, issue 30
finding 2). Real directories and real Unix users of this host (``unix_users``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import services
from jobs.models import Job
from jobs.workdirs import default_submit_dir, submit_dir_ensure
from portal.slurm import SlurmRejected

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\n#SBATCH -p gpu -t 5 --gres=gpu:1\n#SBATCH -o logs/%x-%j.out -D run1\ntrue\n"


def _submit(client, **fields):
    response = client.post("/api/v1/jobs/", {"team": "vision", "script": SCRIPT, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return Job.objects.get(pk=response.json()["id"])


def test_the_default_is_the_users_template_and_relative_paths_follow_it(api_client_for, inventory, relays, settings):
    settings.JOB_DEFAULT_WORKDIR = "/scratch/{team}/{user}/gpuportal/{job}"
    job = _submit(api_client_for("member"))
    assert job.submit_dir == f"/scratch/vision/alice/gpuportal/{job.pk}"
    assert job.workdir == f"{job.submit_dir}/run1" and job.output_pattern == f"{job.submit_dir}/run1/logs/%x-%j.out"
    assert api_client_for("member").get(f"/api/v1/jobs/{job.pk}/").json()["submit_dir"] == job.submit_dir


def test_the_home_placeholder_is_the_users_home(world, settings, unix_users):
    settings.JOB_DEFAULT_WORKDIR = "{home}/jobs"
    assert default_submit_dir(user=world.alice, team=world.vision, job_id="x") == os.path.expanduser("~alice") + "/jobs"


def test_a_submit_dir_field_is_where_it_is_submitted_from(api_client_for, inventory, relays):
    job = _submit(api_client_for("member"), submit_dir="/home/alice/project/")
    assert (job.submit_dir, job.workdir) == ("/home/alice/project", "/home/alice/project/run1")
    response = api_client_for("member").post("/api/v1/jobs/", {"team": "vision", "script": SCRIPT, "submit_dir": "rel"},
                                             format="json")  # fmt: skip
    assert response.status_code == 400 and "submit_dir" in response.json()["errors"]


def test_the_relay_creates_the_default_directory_as_the_user_and_sends_it(api_client_for, inventory, relays, settings,
                                                                          unix_users, _test_homes):  # fmt: skip
    settings.JOB_DEFAULT_WORKDIR = os.path.join(_test_homes, "{user}", "gpuportal", "{job}")
    job = _submit(api_client_for("member"))
    spec = services._submission_for(Job.objects.select_related("team", "submitter__profile").get(pk=job.pk))
    info = os.lstat(job.submit_dir)
    assert info.st_uid == unix_users["alice"][0] and oct(info.st_mode & 0o777) == "0o700"
    assert (spec.request.submit_dir, spec.request.workdir) == (job.submit_dir, f"{job.submit_dir}/run1")


def test_a_default_directory_another_user_made_first_is_refused(world, unix_users, _test_homes, settings):
    settings.JOB_DEFAULT_WORKDIR = os.path.join(_test_homes, "{user}-trap")
    path = default_submit_dir(user=world.alice, team=world.vision, job_id="x")
    os.mkdir(path)
    os.chown(path, *unix_users["carol"])  # carol pre-created alice's default directory
    with pytest.raises(SlurmRejected, match="belongs to uid"):
        submit_dir_ensure(path, username="alice", ids=unix_users["alice"], default=True)
    os.rmdir(path)
    os.symlink("/etc", path)  # or planted a symlink there
    with pytest.raises(SlurmRejected, match="not a directory"):
        submit_dir_ensure(path, username="alice", ids=unix_users["alice"], default=True)
    os.unlink(path)


def test_a_missing_directory_that_is_not_the_default_is_not_created(unix_users, _test_homes):
    path = os.path.join(_test_homes, "nobody-made-this")
    with pytest.raises(SlurmRejected, match="does not exist"):
        submit_dir_ensure(path, username="alice", ids=unix_users["alice"], default=False)
    assert not os.path.exists(path)


def test_a_default_the_user_cannot_create_is_refused_with_the_reason(unix_users):
    with pytest.raises(SlurmRejected, match="cannot be created as alice"):
        submit_dir_ensure("/root/not-alices", username="alice", ids=unix_users["alice"], default=True)
    assert not os.path.exists("/root/not-alices")


@pytest.mark.parametrize("value", ["relative/{user}", "/x/{nope}", "/x/{0}"])
def test_a_bad_template_stops_start_up_naming_the_variable(value):
    env = {**os.environ, "JOB_DEFAULT_WORKDIR": value, "DJANGO_SETTINGS_MODULE": "portal.project.settings"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                            text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.returncode != 0 and "JOB_DEFAULT_WORKDIR" in result.stderr, result.stderr[-500:]
