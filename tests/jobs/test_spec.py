"""The effective request (jobs.spec): a script's #SBATCH lines, the fields as overrides, the
estimate of what Slurm allocates, refusals before Slurm naming the directive's line, and the
command line the relay builds (never two options Slurm holds mutually exclusive)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from jobs import services
from jobs.models import Job
from jobs.selectors import job_output_path
from portal.slurm.cli import sbatch_argv


from tests.support import job_overrides

URL = "/api/v1/jobs/"
pytestmark = pytest.mark.django_db

DDP = "#!/bin/bash\n#SBATCH --gres=gpu:a100:2\n#SBATCH --cpus-per-task=4\n#SBATCH --time=00:05:00\ntorchrun train.py\n"


def post(api_client_for, **body):
    return api_client_for("member").post(URL, {"team": "vision", **body}, format="json")


def test_team_and_script_alone_are_enough(api_client_for, inventory, relays, unix_users):
    response = post(api_client_for, script=DDP)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.name, job.partition, job.gpu_type, job.gpus, job.cpus_per_task, job.time_limit_minutes) == ("sbatch", "gpu", "a100", 2, 4, 5)
    # 2 GPUs × 5 min = 600 GPU-s exactly (six places, rounded up; the API shows 0.17)
    assert (job.estimated_gpu_seconds, job.estimated_gpu_hours) == (600, Decimal("0.166667"))
    assert response.json()["estimated_gpu_hours"] == "0.17"
    # the relay's command line: no --cpus-per-gpu next to the script's --cpus-per-task
    argv = sbatch_argv(services._submission_for(job))
    assert not any(a.startswith("--cpus-per-gpu") for a in argv)
    assert ("cpus-per-task", "4") in services._submission_for(job).options


def test_a_field_replaces_the_scripts_mutually_exclusive_directive(api_client_for, inventory, relays, unix_users):
    response = post(api_client_for, script=DDP, cpus_per_gpu=3)
    assert response.status_code == 201, response.json()
    spec = services._submission_for(Job.objects.get(pk=response.json()["id"]))
    assert "--cpus-per-gpu=3" in sbatch_argv(spec)
    script = spec.request.script
    assert "#SBATCH --cpus-per-task=4" not in script and "# [gpuportal: replaced] SBATCH --cpus-per-task=4" in script
    options = dict(spec.options)
    assert "cpus-per-task" not in options and options["cpus-per-gpu"] == "3" and options["gres"] == "gpu:a100:2"


@pytest.mark.parametrize(
    ("body", "gpus", "tasks", "hours"),
    [
        ({"gpus": 1, "script": "#!/bin/bash\n#SBATCH --array=0-5\n#SBATCH -t 10\ntrue\n"}, 1, 6, "1.00"),
        ({"script": "#!/bin/bash\n#SBATCH --array=0-9%2 --gres=gpu:1 -t 6\ntrue\n"}, 1, 10, "1.00"),  # throttle holds all
        ({"script": "#!/bin/bash\n#SBATCH --exclusive\n#SBATCH --gres=gpu:a100:1 -t 15\ntrue\n"}, 4, 1, "1.00"),
        ({"script": "#!/bin/bash\n#SBATCH -n 3 --gpus-per-task=1 -t 20\ntrue\n"}, 3, 1, "1.00"),
        ({"script": "#!/bin/bash\n#SBATCH -N 2 --gpus-per-node=2 -t 15\ntrue\n"}, 4, 1, "1.00"),
        ({"script": "#!/bin/bash\n#SBATCH -G 3 -t 20\ntrue\n", "gpus": 2}, 2, 1, "0.67"),  # the field wins
    ],
)
def test_the_estimate_is_what_slurm_allocates(api_client_for, inventory, relays, body, gpus, tasks, hours):
    response = post(api_client_for, **body)
    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["gpus"], data["array_tasks"], data["estimated_gpu_hours"]) == (gpus, tasks, hours)
    quote = api_client_for("member").post("/api/v1/jobs/quote/", {k: v for k, v in body.items()}, format="json")
    assert quote.status_code == 200 and quote.json()["gpu_hours"] == hours  # the same figure


@pytest.mark.parametrize(
    ("script", "field", "words"),
    [
        ("#SBATCH --gres=gpu:1\n#SBATCH --account=nlp\n", "script", "line 3: #SBATCH --account=nlp: jobs of this team run in Slurm account 'vision'"),
        ("#SBATCH --gres=gpu:1\n#SBATCH --gpu-count=2\n", "script", "line 3: unrecognized option '--gpu-count'"),
        ("#SBATCH --gres=gpu:1 --uid=0\n", "script", "the portal does not accept --uid"),
        ("#SBATCH --gres=gpu:1 --export=ALL\n", "script", "--export"),
        ("#SBATCH --gres=gpu:a100:5\n", "script", "line 2: #SBATCH --gres=gpu:a100:5: at most 4 a100"),
        ("#SBATCH --gres=gpu:v100:1\n", "script", "no v100 GPUs in partition gpu"),
        ("#SBATCH -p debug\n#SBATCH --gres=gpu:1 -t 2:00:00\n", "script", "line 3: #SBATCH -t 2:00:00: at most 60 minutes"),
        ("#SBATCH -p nosuch --gres=gpu:1\n", "script", "No such partition"),
        ("#SBATCH -N 3 --gres=gpu:a100:1\n", "script", "has 2 node(s) with a100"),
        ("#SBATCH --gres=gpu:1 -c 64\n", "script", "64 CPUs per node requested"),
        ("#SBATCH --gres=gpu:1 --mem=300G\n", "script", "at most 250 GB per node"),
        ("#SBATCH --gres=gpu:1 --array=0-1001\n", "script", "MaxArraySize (1001"),
        ("#SBATCH --gres=gpu:1 --time=UNLIMITED\n", "script", "requested time limit is invalid"),
        ("#SBATCH -t 5\n", "gpus", "Ask for GPUs"),
    ],
)
def test_refusals_before_slurm_name_the_directive_and_line(api_client_for, inventory, relays, script, field, words):
    response = post(api_client_for, script="#!/bin/bash\n" + script + "true\n")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert set(body) == {"detail", "errors"}
    assert any(words in message for message in body["errors"][field]), body
    assert Job.objects.count() == 0 and relays["drain"] == []


def test_gpus_that_cannot_be_spread_over_the_nodes_are_refused_naming_the_field(api_client_for, inventory, relays):
    response = post(api_client_for, script="#!/bin/bash\ntrue\n", gpus=3, nodes=2)
    assert response.status_code == 400 and "spread evenly over 2 nodes" in response.json()["errors"]["gpus"][0], response.json()
    assert not Job.objects.exists()


def test_the_teams_own_account_in_the_script_is_accepted(api_client_for, inventory, relays):
    response = post(api_client_for, script="#!/bin/bash\n#SBATCH -A vision --gres=gpu:1\ntrue\n")
    assert response.status_code == 201, response.json()


def test_output_files_where_the_script_put_them(api_client_for, inventory, relays, settings, unix_users):
    response = post(api_client_for, script="#!/bin/bash\n#SBATCH --gres=gpu:1 -J train -D /scratch/r1\n#SBATCH -o logs/%x-%j.out\ntrue\n")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    Job.objects.filter(pk=job.pk).update(slurm_job_id=4242)
    job.refresh_from_db()
    assert job_output_path(job, "stdout") == "/scratch/r1/logs/train-4242.out"
    assert job_output_path(job, "stderr") == "/scratch/r1/logs/train-4242.out"  # no --error: stderr goes there too
    array = post(api_client_for, script="#!/bin/bash\n#SBATCH --gres=gpu:1 -a 3-5 -o /o/%A_%a.%u.out -e /o/%A_%4a.err\ntrue\n")
    job = Job.objects.get(pk=array.json()["id"])
    Job.objects.filter(pk=job.pk).update(slurm_job_id=77)
    job.refresh_from_db()
    assert job_output_path(job, "stdout") == "/o/77_3.alice.out"
    assert job_output_path(job, "stderr", array_index=5) == "/o/77_0005.err"
    plain = post(api_client_for, script="#!/bin/bash\n#SBATCH --gres=gpu:1 -a 0-1\ntrue\n")
    job = Job.objects.get(pk=plain.json()["id"])
    spec = services._submission_for(job, ensure_dirs=False)
    assert ("output", f"{job.workdir}/slurm-%A_%a.out") in spec.options  # sbatch's default name, in the job's directory
    assert not any(option == "error" for option, _ in spec.options)  # stderr in the same file, as sbatch


def test_job_detail_shows_what_each_directive_became(api_client_for, inventory, relays):
    response = post(api_client_for, script=DDP, time_limit_minutes=9)
    detail = api_client_for("member").get(reverse("api-job-detail", args=[response.json()["id"]])).json()
    directives = {(d["option"], d["value"], d["line"]) for d in detail["directives"]}
    assert {("gres", "gpu:a100:2", 2), ("cpus-per-task", "4", 3), ("time", "9", 0)} <= directives
    assert not any(d["option"] == "time" and d["line"] == 4 for d in detail["directives"])  # replaced


def test_the_form_shows_what_each_directive_became_and_the_estimate_follows(client_for, inventory):
    script = "#!/bin/bash\n#SBATCH --array=0-3%2 --gres=gpu:a100:1\n#SBATCH -t 30 --open-mode=append\ntrue\n"
    response = client_for("member").post(reverse("jobs:quote"), {"script": script, "partition": ""}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert "4 array tasks, at most 2 at once" in body and "time limit 30 min" in body and "passed to Slurm unchanged" in body
    assert "at most 2.00 GPU-hours" in body  # 4 tasks × 1 GPU × 30 min
    bad = client_for("member").post(reverse("jobs:quote"), {"script": "#SBATCH --gres=gpu:1\n#SBATCH --bogus\n"}).content.decode()
    assert "line 2: unrecognized option &#x27;--bogus&#x27;" in bad


def test_a_script_only_form_submission_is_accepted(client_for, inventory, relays, settings):
    response = client_for("member").post(reverse("jobs:new"), {"team": "vision", "script": DDP, "idempotency_key": "k1"})
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert (job.gpus, job.cpus_per_task, job.cpus_per_gpu, job_overrides(job)[0]) == (2, 4, None, ["chdir", job.submit_dir])
    assert job.submit_dir == settings.JOB_DEFAULT_WORKDIR.format(user="alice")  # the user's default directory
    page = client_for("member").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "What Slurm gets" in page and "script line 3" in page
