"""Property-based fuzzing of the REST API from its own OpenAPI schema (schemathesis), as an
authenticated member (token auth), through the WSGI application: no request may answer 5xx, and
every 4xx answers the JSON error shape ``{"detail": str, "errors": {...}}``.

Nothing reaches Slurm: relays and cancels are recorded instead of run (``relays``). Bounded to
MAX_EXAMPLES per operation so the run takes about a minute."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from portal.services import api_token_create

MAX_EXAMPLES = 25

pytestmark = pytest.mark.django_db


def _load_schema():
    from portal.project.wsgi import application

    return schemathesis.openapi.from_wsgi("/api/schema/", application)


# Loaded at collection (schemathesis' lazy ``from_fixture`` does not work with pytest 9: it sets
# the removed ``Node._nodeid``); generating the schema needs no database.
full_schema = _load_schema()

schema = full_schema


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """Requests go through the real WSGI handler. Like Django's test client, keep the test's
    database connection across requests (the handler closes it at request end, which would close it
    inside the test's transaction)."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def token(world, inventory_small, relays):
    from jobs.models import JobTemplate

    JobTemplate.objects.create(scope="team", team=world.vision, created_by=world.alice, name="fuzz", script="true")
    _, key = api_token_create(user=world.alice, name="fuzz")
    return key


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_never_answers_5xx_and_errors_have_the_json_shape(case, token):
    response = case.call(headers={"Authorization": f"Token {token}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path} → {response.status_code}: {response.text[:500]}"
    if 400 <= response.status_code < 500:
        try:
            body = response.json()
        except ValueError:
            pytest.fail(f"{case.method} {case.formatted_path} → {response.status_code}, not JSON: {response.text[:300]!r}")
        assert isinstance(body, dict) and set(body) == {"detail", "errors"}, body
        assert isinstance(body["detail"], str) and isinstance(body["errors"], dict), body


def test_cost_report_errors_in_csv_format_keep_the_json_error_shape(world, api_client_for):
    """Found by the fuzzer: ``?format=csv`` rendered the 403 and 400 bodies with the CSV renderer.
    The exception handler now renders every error as JSON."""
    response = api_client_for("member").get("/api/v1/reports/cost/?format=csv")
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/json")
    assert set(response.json()) == {"detail", "errors"}
    bad = api_client_for("finance").get("/api/v1/reports/cost/?format=csv&start=2026-02-30")
    assert bad.status_code == 400 and "start" in bad.json()["errors"]
