"""Issue 30 against the real local cluster: what a member's script can make Slurm do. Every case
submits through the API with the relay run at once (or a relay that crashed after sbatch, for the
sync's adoption), then asks Slurm itself (``scontrol show job -o``) what it holds.

- #PBS and #BSUB lines (sbatch translates them unless ``--ignore-pbs``) change nothing: not the
  time limit, the nice value, a hold, nor an exclusive allocation (every slurm_target);
- a job the sync adopts by its tag is read back only from files its Unix user owns;
- ``--mail-type=NONE`` (which pyslurm refuses) reaches Slurm on every backend; an unknown type is a 400;
- a ``--begin`` within JOB_BEGIN_MAX_DAYS reaches Slurm deferred; beyond it, a 400.
The cases that need issue 28 (output in the submitter's own directory, the environment passed
without editing the script) are the ``test_issue28_*`` functions at the end."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from jobs.choices import TERMINAL_STATES, JobState
from jobs.models import Job
from jobs.services import job_submit, jobs_sync
from portal.slurm import get_gateway
from portal.slurm.cli import _clean_env
from tests.support import job_payload, relay_crashed_after_sbatch, slurm_cancel_tagged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def scontrol_job(slurm_id: int) -> dict[str, str]:
    """Slurm's own record of a job (``scontrol show job -o``) as {field: value}."""
    scontrol = str(Path(settings.SLURM_BIN_DIR) / "scontrol") if settings.SLURM_BIN_DIR else "scontrol"
    done = subprocess.run([scontrol, "show", "job", "-o", str(slurm_id)], capture_output=True, text=True,
                          env=_clean_env(settings.SLURM_CONF), check=True, timeout=30)  # fmt: skip
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", done.stdout.splitlines()[0]))


def submit(user, django_capture_on_commit_callbacks, **overrides):
    """POST /api/v1/jobs/ with the relay run at once; the response and (on 201) the stored job."""
    with django_capture_on_commit_callbacks(execute=True):
        response = api(user).post("/api/v1/jobs/", job_payload(**overrides), format="json")
    job = Job.objects.get(pk=response.json()["id"]) if response.status_code == 201 else None
    return response, job


@pytest.fixture
def submitted():
    """Jobs a test submitted: cancelled in Slurm afterwards, whatever happened."""
    jobs: list[Job] = []
    yield jobs
    slurm_cancel_tagged(jobs)


# ---------------------------------------------------------------- finding 1: other directive prefixes

FOREIGN_DIRECTIVES = {
    # PBS: walltime 50 min over the script's --time=2, nice -1000 (root submits: allowed), a user hold
    "pbs": "#PBS -l walltime=0:50:00\n#PBS -p -1000\n#PBS -h\n",
    # LSF: -W minutes, -x exclusive (the whole node's GPUs, billed as one)
    "bsub": "#BSUB -W 50\n#BSUB -x\n",
}


@pytest.mark.parametrize("prefix", sorted(FOREIGN_DIRECTIVES))
def test_pbs_and_bsub_directives_change_nothing_in_slurm(slurm_target, cluster, django_capture_on_commit_callbacks,
                                                         submitted, prefix):  # fmt: skip
    script = "#!/bin/bash\n#SBATCH --time=2\n" + FOREIGN_DIRECTIVES[prefix] + "sleep 120\n"
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, script=script, gpus=1,
                           time_limit_minutes=None, environment={})  # fmt: skip
    assert response.status_code == 201, response.json()
    submitted.append(job)
    job.refresh_from_db()
    assert job.time_limit_minutes == 2 and job.gpus == 1 and job.slurm_job_id, (job.state, job.state_reason)
    record = scontrol_job(job.slurm_job_id)
    assert record["TimeLimit"] == "00:02:00", record
    assert record["Nice"] == "0" and record["Reason"] != "JobHeldUser" and record["Priority"] != "0", record
    assert "gres/gpu=4" not in record.get("ReqTRES", "") and record.get("OverSubscribe") != "NO", record


# ---------------------------------------------------------------- finding 3: the owner check for adopted jobs


@pytest.fixture
def roots_file():
    """A file root owns in alice's home (alice can name it as her output; Slurm, as alice, cannot write it)."""
    home = Path(pwd.getpwnam("alice").pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    path = home / f"root-secret-{os.getpid()}.txt"
    path.write_text("root's secret\n")
    os.chown(path, 0, 0)
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)


def test_a_job_adopted_by_the_sync_reads_only_its_users_files(cluster, roots_file, submitted):
    alice_uid = pwd.getpwnam("alice").pw_uid
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, name="adopted", partition="debug", gpu_type="a100", gpus=1,
                     nodes=1, cpus_per_gpu=1, memory_gb=1, time_limit_minutes=2, workdir="/tmp", environment={},
                     script=f"#!/bin/bash\n#SBATCH --output={roots_file}\necho hello\n")  # fmt: skip
    submitted.append(job)
    slurm_id = relay_crashed_after_sbatch(job)  # in Slurm; the row knows neither its id nor its Unix user

    def adopted_and_ended():
        jobs_sync()
        row = Job.objects.get(pk=job.pk)
        return row if row.slurm_job_id == slurm_id and row.state in TERMINAL_STATES else None

    row = wait_for(adopted_and_ended, timeout=90, interval=0.5, what="the sync to adopt the job and see it end")
    assert row.unix_uid == alice_uid  # Slurm's UserId, recorded at adoption
    output = api(cluster.alice).get(f"/api/v1/jobs/{job.pk}/output/").json()
    assert "root's secret" not in output["data"] and "does not belong" in output["message"], output
    # the same rule without the recorded uid (a row adopted before it was recorded): the submitter's account
    Job.objects.filter(pk=job.pk).update(unix_uid=None)
    output = api(cluster.alice).get(f"/api/v1/jobs/{job.pk}/output/").json()
    assert "root's secret" not in output["data"] and "does not belong" in output["message"], output
    assert roots_file.read_text() == "root's secret\n"  # and Slurm, as alice, did not write it


# ---------------------------------------------------------------- finding 9: --mail-type as Slurm reads it


def test_mail_type_none_reaches_slurm_on_every_backend(slurm_target, cluster, django_capture_on_commit_callbacks, submitted):
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, gpus=1, environment={},
                           script="#!/bin/bash\n#SBATCH --mail-type=NONE\nsleep 60\n")  # fmt: skip
    assert response.status_code == 201, response.json()
    submitted.append(job)
    job.refresh_from_db()
    assert job.state != JobState.SUBMIT_FAILED and job.slurm_job_id, job.state_reason
    assert scontrol_job(job.slurm_job_id).get("MailType") in ("NONE", "(null)", None)


@pytest.mark.parametrize("value", ["NONE,BOGUS", "never", "END;FAIL", ""])
def test_a_mail_type_slurm_refuses_is_a_400_naming_the_line(cluster, django_capture_on_commit_callbacks, submitted, value):
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, gpus=1,
                           script=f"#!/bin/bash\n#SBATCH --mail-type={value}\necho hi\n")  # fmt: skip
    submitted.extend([job] if job else [])
    assert response.status_code == 400 and job is None
    assert any("line 2" in message and "mail-type" in message for message in response.json()["errors"]["script"])


# ---------------------------------------------------------------- finding 7: --begin


def test_a_begin_within_the_bound_reaches_slurm_deferred(slurm_target, cluster, django_capture_on_commit_callbacks, submitted):
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, gpus=1, environment={},
                           script="#!/bin/bash\n#SBATCH --begin=now+2days\necho later\n")  # fmt: skip
    assert response.status_code == 201, response.json()
    submitted.append(job)
    job.refresh_from_db()
    record = scontrol_job(job.slurm_job_id)
    assert record["JobState"] == "PENDING" and record["Reason"] == "BeginTime", record


@pytest.mark.parametrize("begin", ["2099-01-01", "now+8days", "now+400weeks", "uts4102444800", "0101"])
def test_a_far_or_unreadable_begin_is_a_400_and_never_reaches_slurm(cluster, django_capture_on_commit_callbacks, submitted,
                                                                    begin):  # fmt: skip
    before = {e.comment for e in get_gateway().queue()}
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, gpus=1,
                           script=f"#!/bin/bash\n#SBATCH --begin={begin}\necho later\n")  # fmt: skip
    submitted.extend([job] if job else [])  # (cancelled afterwards, should it have been accepted)
    assert response.status_code == 400 and job is None and Job.objects.count() == 0
    assert any("--begin" in message for message in response.json()["errors"]["script"])
    assert {e.comment for e in get_gateway().queue()} - before == set()


# ---------------------------------------------------------------- cases that need the issue-28 branch


def test_issue28_the_default_output_is_created_in_the_submitters_own_directory(cluster, django_capture_on_commit_callbacks, submitted):
    """Issue 30, finding 2 (done by issue 28): not /tmp, where another user can pre-create the file."""
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, gpus=1, environment={},
                           script="#!/bin/bash\necho mine\n")  # fmt: skip
    assert response.status_code == 201, response.json()
    submitted.append(job)
    job.refresh_from_db()
    record = scontrol_job(job.slurm_job_id)
    home = pwd.getpwnam("alice").pw_dir
    assert record["StdOut"].startswith(home + "/") and not record["StdOut"].startswith("/tmp/"), record


def test_issue28_the_environment_reaches_a_python_script_unedited(cluster, django_capture_on_commit_callbacks, submitted):
    """Issue 30, finding 8 (done by issue 28): variables reach the job without export lines in its script."""
    script = "#!/usr/bin/env python3\nimport os\nprint('EPOCHS=' + os.environ.get('EPOCHS', '?'))\n"
    response, job = submit(cluster.alice, django_capture_on_commit_callbacks, gpus=1, environment={"EPOCHS": "3"},
                           script=script)  # fmt: skip
    assert response.status_code == 201, response.json()
    submitted.append(job)

    def ended():
        jobs_sync()
        return Job.objects.filter(pk=job.pk, state__in=TERMINAL_STATES).first()

    row = wait_for(ended, timeout=90, interval=0.5, what="the python job to end")
    assert row.state == JobState.COMPLETED and row.exit_code == 0, row.state_reason
    output = wait_for(lambda: api(cluster.alice).get(f"/api/v1/jobs/{job.pk}/output/").json()["data"], timeout=20)
    assert "EPOCHS=3" in output
