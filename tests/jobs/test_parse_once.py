"""Issue 29: a request reads a script's #SBATCH directives once (jobs.spec_fields.parse_script is
the one caller of the parser in jobs), and the parse travels with the job to the relay, which hands
it to the gateway: the worker does not read the script again."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
from django.urls import reverse

from gpuportal_sbatch import directives as sbatch_directives
from jobs.models import Job
from portal.slurm import request as slurm_request
from tests.support import job_payload

pytestmark = pytest.mark.django_db

SCRIPT = "#SBATCH --job-name=p1\n#SBATCH --gres=gpu:a100:1\n#SBATCH -t 10\n#SBATCH -o out-%j.txt\nsrun true\n"  # no shebang


@pytest.fixture
def parses():
    """The parser's calls made by jobs (its one call site)."""
    with mock.patch("jobs.spec_fields.parse_directives", wraps=sbatch_directives.parse_directives) as parser:
        yield parser


def test_an_api_post_reads_the_script_once(api_client_for, inventory, relays, parses):
    response = api_client_for("member").post("/api/v1/jobs/", job_payload(script=SCRIPT, gpus=None, gpu_type=""), format="json")
    assert response.status_code == 201, response.json()
    assert parses.call_count == 1


def test_an_api_quote_reads_the_script_once(api_client_for, inventory, parses):
    response = api_client_for("member").post("/api/v1/jobs/quote/", {"script": SCRIPT}, format="json")
    assert response.status_code == 200, response.json()
    assert parses.call_count == 1


def test_a_form_post_reads_the_script_once(client_for, inventory, relays, parses):
    response = client_for("member").post(reverse("jobs:new"), {"team": "vision", "idempotency_key": "k-once", "script": SCRIPT,
                                                               "time_limit_minutes": "20"})  # fmt: skip
    assert response.status_code == 302
    assert parses.call_count == 1
    assert Job.objects.get().time_limit_minutes == 20


def test_a_refused_form_post_reads_the_script_once_for_the_errors_and_the_estimate(client_for, inventory, relays, parses):
    response = client_for("member").post(reverse("jobs:new"), {"team": "vision", "idempotency_key": "k-no", "script": SCRIPT,
                                                               "gpus": "99"})  # fmt: skip
    assert response.status_code == 400 and "gpus" in response.context["form"].errors
    assert response.context["quote"]["directives"]  # the estimate's directive table, from the same parse
    assert parses.call_count == 1


def test_the_live_estimate_and_read_script_read_it_once(client_for, inventory, parses):
    client = client_for("member")
    response = client.post(reverse("jobs:quote"), {"script": SCRIPT})
    assert response.status_code == 200 and "quote" in response.context["quote"]
    assert parses.call_count == 1
    response = client.post(reverse("jobs:new"), {"team": "vision", "read_script": "1", "script": SCRIPT})
    assert response.status_code == 200 and response.context["form"].initial["time_limit_minutes"] == "0:10:00"
    assert parses.call_count == 2


def test_the_relay_hands_the_stored_parse_to_the_gateway(api_client_for, inventory, relays, unix_users):
    """The job stores the parse (lines of the script as stored: the portal's shebang first); the
    gateway builds from it exactly what it builds from reading the script, without reading it."""
    from jobs.services import _spec_for

    response = api_client_for("member").post("/api/v1/jobs/", job_payload(script=SCRIPT + "#SBATCH --late\n"), format="json")
    job = Job.objects.select_related("team", "submitter__profile", "cluster").get(pk=response.json()["id"])
    assert job.script.startswith("#!") and job.script_directives[0] == ["job-name", "p1", 2, "--job-name=p1"]
    spec = _spec_for(job, ensure_dirs=False)
    assert spec.directives is not None
    with mock.patch.object(slurm_request, "parse_directives", wraps=sbatch_directives.parse_directives) as parser:
        built = (slurm_request.spec_script(spec), slurm_request.spec_request(spec), slurm_request.spec_job_name(spec))
    assert parser.call_count == 0
    assert built == tuple(f(dataclasses.replace(spec, directives=None)) for f in
                          (slurm_request.spec_script, slurm_request.spec_request, slurm_request.spec_job_name))  # fmt: skip
    assert "#SBATCH --job-name=p1" not in built[0]  # the overridden directive is commented out, on its own line
