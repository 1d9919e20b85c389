"""What sbatch refuses before it sends a job is a 400 naming the line (issue 28, item 7): never a
201 followed by SUBMIT_FAILED. The same scripts are in tests/jobs/sbatch_corpus/ (r24), where
tests/jobs/test_sbatch_oracle.py proves sbatch itself refuses them."""

from __future__ import annotations

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db

HEAD = "#!/bin/bash\n#SBATCH -p gpu -t 5\n"


@pytest.mark.parametrize(
    ("directives", "line", "words"),
    [
        ("#SBATCH --gpus-per-task=1\n", 3, "--gpus-per-task used without either --gpus or -n/--ntasks is not allowed"),
        ("#SBATCH --tres-per-task=gres/gpu:1\n", 3, "--tres-per-task used without either --gpus or -n/--ntasks"),
        ("#SBATCH -N 1 --gres=gpu:1\n#SBATCH --distribution=arbitrary\n", 4, "--nodes is incompatible with --distribution=arbitrary"),
        ("#SBATCH -n 1 --gres=gpu:1 --tres-per-task=mem:1G\n", 3, "Invalid TRES for --tres-per-task: mem"),
    ],
)
def test_sbatchs_refusals_before_submission_are_400_naming_the_line(api_client_for, inventory, relays, directives, line, words):
    response = api_client_for("member").post("/api/v1/jobs/", {"team": "vision", "script": HEAD + directives + "srun true\n"},
                                             format="json")  # fmt: skip
    assert response.status_code == 400, response.json()
    message = " ".join(response.json()["errors"]["script"])
    assert f"line {line}" in message and words in message, message
    assert Job.objects.count() == 0 and relays["drain"] == []


@pytest.mark.parametrize(
    "directives",
    ["#SBATCH --gpus-per-task=1 -n 2\n", "#SBATCH --gpus-per-task=1 -N 1\n",
     "#SBATCH --ntasks-per-node=2 --gpus-per-task=1\n"],  # fmt: skip
)
def test_gpus_per_task_with_a_task_count_is_accepted(api_client_for, inventory, relays, directives):
    response = api_client_for("member").post("/api/v1/jobs/", {"team": "vision", "script": HEAD + directives + "srun true\n"},
                                             format="json")  # fmt: skip
    assert response.status_code == 201, response.json()


def test_a_field_giving_the_task_count_makes_gpus_per_task_acceptable(api_client_for, inventory, relays):
    body = {"team": "vision", "script": HEAD + "#SBATCH --gpus-per-task=1\nsrun true\n", "ntasks": 2}
    response = api_client_for("member").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
