"""The OpenAPI contract holds: ``schemathesis run --checks all`` — every phase (examples, coverage,
fuzzing, stateful) over every operation — against the live portal, as member, manager, admin and
finance, with a fixed seed. Exactly what an API client runs against the demo, in the test suite.

No check may fail, with one allowance that the schema itself states: a schema-valid request that a
business rule refuses (``positive_data_acceptance``, ST202) is accepted only with a 400, only for an
operation whose description says so (an operation description that names "answers 400").

The portal answers from pytest-django's live server (its own thread, the test database). Nothing
reaches Slurm or the broker: every Celery task's enqueue is recorded instead (``recorded_tasks``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

# fuzz: minutes of generated requests per role (make test runs it; make test-fast does not)
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fuzz]

ROLES = ("member", "manager", "admin", "finance")
SEED = 19
MAX_EXAMPLES = 10
SCHEMATHESIS = [sys.executable, "-m", "schemathesis.cli"]


@pytest.fixture
def recorded_tasks(monkeypatch):
    """Every task enqueue recorded, none sent (the relay to Slurm, reservations, mirrors, alerts)."""
    from celery.app.task import Task

    calls: list[tuple[str, tuple]] = []
    monkeypatch.setattr(Task, "apply_async", lambda self, args=None, kwargs=None, **options: calls.append((self.name, args)))
    return calls


@pytest.fixture
def contract_world(world, inventory_small, recorded_tasks):
    """Something of every kind for the operations to find: a job, a template, a booking, quotas; and
    jobs that ran, accounted, priced and sampled (tests.support.jobs_that_ran), so that every money,
    GPU-hours and GPU figure answers a value, not null, for the response checks to hold it to the schema."""
    from django.utils import timezone

    from accounting.models import Booking
    from jobs.models import JobTemplate
    from jobs.services import job_submit
    from tests.support import job_payload, jobs_that_ran

    body = job_payload()
    del body["team"]
    job_submit(user=world.alice, team=world.vision, **body)
    JobTemplate.objects.create(scope="team", team=world.vision, created_by=world.alice, name="contract", script="true")
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
    Booking.objects.create(team=world.vision, gpu_type="a100", gpus=4, start=start, end=start + dt.timedelta(hours=4),
                           created_by=world.bob)  # fmt: skip
    jobs_that_ran(world)
    return world


def _allowances(schema: dict) -> list[dict]:
    """Per-operation config: positive data may answer 400 where the description says it does."""
    operations = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            if "answers 400" in operation.get("description", ""):
                statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
                operations.append({"include-path": path, "include-method": method.upper(),
                                   "checks": {"positive_data_acceptance": {"expected-statuses": statuses}}})  # fmt: skip
    return operations


def _toml(operations: list[dict]) -> str:
    lines = []
    for op in operations:
        lines += ["[[operations]]", f'include-path = "{op["include-path"]}"', f'include-method = "{op["include-method"]}"',
                  "[operations.checks.positive_data_acceptance]",
                  "expected-statuses = " + json.dumps(op["checks"]["positive_data_acceptance"]["expected-statuses"]), ""]  # fmt: skip
    return "\n".join(lines)


@pytest.mark.parametrize("role", ROLES)
def test_schemathesis_all_checks_pass_as_each_role(role, contract_world, live_server, tmp_path):
    from portal.services import api_token_create

    _, key = api_token_create(user=contract_world.user_for(role), name="contract")
    schema_url = f"{live_server.url}/api/schema/?format=json"
    schema = requests.get(schema_url, headers={"Authorization": f"Token {key}"}, timeout=30).json()
    config = tmp_path / "schemathesis.toml"
    config.write_text(_toml(_allowances(schema)))
    result = subprocess.run(
        [*SCHEMATHESIS, "--no-color", "--config-file", str(config), "run", schema_url, "--checks", "all", "--seed", str(SEED),
         "--max-examples", str(MAX_EXAMPLES), "--workers", "1", "-H", f"Authorization: Token {key}",
         "--suppress-health-check", "all"],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path,  # its cache
    )  # fmt: skip
    (tmp_path / "schemathesis.txt").write_text(result.stdout + result.stderr)
    if os.environ.get("GPUPORTAL_CONTRACT_OUT"):  # keep the whole output (debugging)
        Path(os.environ["GPUPORTAL_CONTRACT_OUT"], f"schemathesis-{role}.txt").write_text(result.stdout + result.stderr)
    summary = result.stdout[-6000:]
    assert result.returncode == 0, f"schemathesis as {role}:\n{summary}\n{result.stderr[-2000:]}"
    operations = sum(len(methods) for methods in schema["paths"].values())
    assert re.search(r"Tested:\s+(\d+)", summary).group(1) == str(operations), summary  # every operation
    generated, passed = re.search(r"(\d+) generated, (\d+) passed", summary).groups()
    assert generated == passed and int(generated) >= 40 * operations, summary  # error paths reached: ~60 per operation
