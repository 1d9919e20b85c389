"""A Python client generated from the schema (openapi-python-client, offline) works against the live
portal and the real local cluster: it submits a job, reads its state and output, and gets typed
``Error`` objects back for a 400 and a 409 — what the README's API section shows."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.choices import JobState
from jobs.services import jobs_sync
from tests.support import job_payload, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

GENERATOR = Path(sys.executable).with_name("openapi-python-client")


@pytest.fixture(scope="module")
def gpuportal_client(tmp_path_factory):
    """The package ``gpuportal_client`` generated from the portal's schema (no network needed)."""
    from drf_spectacular.generators import SchemaGenerator

    root = tmp_path_factory.mktemp("generated")
    schema = root / "openapi.json"
    schema.write_text(json.dumps(SchemaGenerator().get_schema(request=None, public=True)))
    config = root / "config.yaml"
    config.write_text("post_hooks: []\npackage_name_override: gpuportal_client\n")
    result = subprocess.run(
        [str(GENERATOR), "generate", "--path", str(schema), "--output-path", str(root / "gpuportal_client"),
         "--meta", "none", "--config", str(config)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("gpuportal_client")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "gpuportal_client" or m.startswith("gpuportal_client.")]:
            del sys.modules[name]


@pytest.fixture
def api(gpuportal_client, cluster, live_server):
    """The generated client with alice's token. Closed at the end: a kept-alive connection would keep
    the live server's request thread, and its database connection, open past the test."""
    from portal.services import api_token_create

    _, key = api_token_create(user=cluster.alice, name="generated client")
    with gpuportal_client.AuthenticatedClient(base_url=live_server.url, token=key, prefix="Token") as client:
        yield client


def test_a_generated_client_submits_reads_state_and_output_and_gets_typed_errors(api):
    from gpuportal_client.api.v1 import v1_jobs_cancel_create, v1_jobs_create, v1_jobs_output_retrieve, v1_jobs_retrieve
    from gpuportal_client.models import Error, JobSubmitInputRequest

    body = job_payload(name="generated-client", script="#!/bin/bash\necho hello from the generated client\n", gpus=1,
                       time_limit_minutes=5)  # fmt: skip
    submitted = v1_jobs_create.sync_detailed(client=api, body=JobSubmitInputRequest.from_dict(body))
    assert submitted.status_code == 201, submitted.content
    job = submitted.parsed
    assert job.state == "ACCEPTED" and job.team == "vision" and job.gpus == 1

    def completed():
        jobs_sync()
        return v1_jobs_retrieve.sync(client=api, job_id=job.id).state == JobState.COMPLETED

    wait_for(completed, timeout=90, interval=0.5)
    detail = v1_jobs_retrieve.sync(client=api, job_id=job.id)
    assert detail.exit_code == 0 and detail.slurm_job_id and [e.state for e in detail.events][0] == "ACCEPTED"
    output = wait_for(lambda: v1_jobs_output_retrieve.sync(client=api, job_id=job.id).data, timeout=15)
    assert "hello from the generated client" in output

    # a 400 (a business rule: no such team) and a 409 (cancelling a job that ended): typed errors
    refused = v1_jobs_create.sync_detailed(client=api, body=JobSubmitInputRequest.from_dict({**body, "team": "nope"}))
    assert refused.status_code == 400 and isinstance(refused.parsed, Error)
    assert refused.parsed.detail == "No such team." and refused.parsed.errors["team"] == ["No such team."]
    ended = v1_jobs_cancel_create.sync_detailed(client=api, job_id=job.id)
    assert ended.status_code == 409 and isinstance(ended.parsed, Error)
    assert ended.parsed.detail.startswith("Job already ended") and "state" in ended.parsed.errors
