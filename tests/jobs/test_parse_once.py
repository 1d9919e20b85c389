"""Issues 29 and 38: a submission reads a script's #SBATCH directives once (jobs.spec_fields.parse_script
is the one caller of the parser in jobs) and builds the one request once per job (the directives and
the fields merged, portal.slurm.request.job_request); the request is stored with the job and the
relay hands it to the gateway unchanged: the worker neither reads the script nor merges again."""

from __future__ import annotations

from unittest import mock

import pytest
from django.urls import reverse

from gpuportal_sbatch import directives as sbatch_directives
from jobs.models import Job
from portal.slurm import JobRequest
from portal.slurm import request as slurm_request
from tests.support import job_payload

pytestmark = pytest.mark.django_db

SCRIPT = "#SBATCH --job-name=p1\n#SBATCH --gres=gpu:a100:1\n#SBATCH -t 10\n#SBATCH -o out-%j.txt\nsrun true\n"  # no shebang


@pytest.fixture
def builds():
    """The request builder's calls (portal.slurm.request.job_request, jobs.spec's one call site)."""
    with mock.patch("jobs.spec.job_request", wraps=slurm_request.job_request) as builder:
        yield builder


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


def test_the_request_is_built_and_merged_once_per_submission(api_client_for, client_for, inventory, relays, builds, parses):
    """The one request (portal.slurm.request.job_request): built once for each job of a submission,
    by jobs.spec, single, batch or form, its directives and command line merged once (the GPUs given
    as a total are first read against the script's node count: one more merge, of the fields alone)."""
    client = api_client_for("member")
    with mock.patch("portal.slurm.request.apply_overrides", wraps=sbatch_directives.apply_overrides) as merges:
        response = client.post("/api/v1/jobs/", job_payload(script=SCRIPT, gpus=None, gpu_type=""), format="json")
        assert response.status_code == 201, response.json()
        assert (parses.call_count, builds.call_count, merges.call_count) == (1, 1, 1)
        body = [job_payload(script=SCRIPT, gpus=None, gpu_type="") for _ in range(3)]  # a batch
        response = client.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.json()
        assert (builds.call_count, merges.call_count) == (1 + 3, 1 + 3)
        response = client_for("member").post(reverse("jobs:new"), {"team": "vision", "idempotency_key": "k-merge", "script": SCRIPT,
                                                                   "time_limit_minutes": "20"})  # fmt: skip
        assert response.status_code == 302
        assert (builds.call_count, merges.call_count) == (1 + 3 + 1, 1 + 3 + 1)


def test_the_relay_hands_the_stored_request_to_the_gateway_unchanged(api_client_for, inventory, relays, use_gateway, settings):
    """The relay reads the job's stored request and passes it on as it is: no parse of the script, no
    merge of the options, no second build; the gateway gets exactly what the submission built."""
    from jobs.services import job_relay_run
    from tests.fakes import FakeGateway

    settings.SLURM_SUBMIT_AS_USER = False  # no Unix accounts needed for the fake
    fake = use_gateway(FakeGateway())
    response = api_client_for("member").post("/api/v1/jobs/", job_payload(script=SCRIPT + "#SBATCH --late\n"), format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job.script.startswith("#!")  # the portal's shebang first: the script's lines as stored
    assert {"option": "output", "value": "out-%j.txt", "line": 5} in job.directives
    with mock.patch("gpuportal_sbatch.directives.parse_directives", side_effect=AssertionError("parsed")), \
         mock.patch("portal.slurm.request.parse_directives", side_effect=AssertionError("parsed")), \
         mock.patch("portal.slurm.request.apply_overrides", side_effect=AssertionError("merged")), \
         mock.patch("portal.slurm.request.job_request", side_effect=AssertionError("built")):  # fmt: skip
        assert job_relay_run(job.pk) == "submitted"
    (submission,) = fake.submitted
    assert submission.request == JobRequest.from_json(job.request)
    assert submission.request.script.splitlines()[1] == "# [gpuportal: replaced] SBATCH --job-name=p1"
    assert ("job-name", job.name) in submission.request.command_line  # the field that replaced it
