"""The API means what its schema says: the answers of the operations that show money, GPU-hours and
GPU figures — jobs (list, detail of a job and of an array job, its GPU report), the quote, team
usage, the cost report, bookings, quotas and a team's budget — validated field by field against the
schema drf-spectacular generates, with jobs that ran, were accounted and priced, and GPU samples present
(tests.support.jobs_that_ran). And every money and GPU-hours property of the schema is declared
the one way: a decimal string (portal.fields.DecimalStringField)."""

from __future__ import annotations

import datetime as dt
import re

import jsonschema
import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from tests.support import jobs_that_ran

pytestmark = pytest.mark.django_db

DECIMAL_STRING = {"type": "string", "format": "decimal"}
# property names that are money or GPU-hours wherever they appear
MONEY_OR_HOURS = re.compile(r"(^|_)(gpu_hours|cost|price_per_gpu_hour)$|^(budget|used|held|booked|remaining)$")


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def json_schema(node):
    """An OpenAPI 3.0 schema as JSON Schema: ``nullable: true`` becomes "or null"."""
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: json_schema(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def validate(schema: dict, method: str, template: str, status: int, body) -> None:
    """The body against the schema of (method, template)'s answer ``status`` as JSON; every error
    (not only the first), each with where it is."""
    response = schema["paths"][template][method.lower()]["responses"][str(status)]
    document = {"allOf": [response["content"]["application/json"]["schema"]], "components": schema["components"]}
    validator = jsonschema.Draft4Validator(json_schema(document), format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" + "".join(f"; {c.message}" for c in e.context)
              for e in validator.iter_errors(body)]  # fmt: skip
    assert not errors, f"{method} {template}:\n" + "\n".join(errors)


def decimal_strings(body, name: str) -> list:
    """Every value of a property ``name`` anywhere in the body."""
    found = []
    if isinstance(body, dict):
        for key, value in body.items():
            if key == name:
                found.append(value)
            found += decimal_strings(value, name)
    elif isinstance(body, list):
        for item in body:
            found += decimal_strings(item, name)
    return found


@pytest.fixture
def ran(world, inventory_small, relays):
    return jobs_that_ran(world)


def test_the_answers_with_usage_cost_and_gpu_data_are_what_the_schema_says(schema, ran, world, api_client_for):
    job, array, booking = ran["job"], ran["array"], ran["booking"]
    today = timezone.localdate()
    span = f"start={today - dt.timedelta(days=1)}&end={today}"
    quote = {"partition": "gpu", "gpu_type": "a100", "gpus": 3, "time_limit_minutes": 7, "script": "#!/bin/bash\ntrue\n"}
    calls = [
        ("member", "GET", "/api/v1/jobs/", "/api/v1/jobs/", None),
        ("member", "GET", "/api/v1/jobs/{job_id}/", f"/api/v1/jobs/{job.pk}/", None),
        ("member", "GET", "/api/v1/jobs/{job_id}/", f"/api/v1/jobs/{array.pk}/", None),
        ("member", "POST", "/api/v1/jobs/quote/", "/api/v1/jobs/quote/", quote),
        ("manager", "GET", "/api/v1/teams/{slug}/usage/", f"/api/v1/teams/vision/usage/?{span}", None),
        ("finance", "GET", "/api/v1/reports/cost/", f"/api/v1/reports/cost/?{span}&group_by=user", None),
        ("admin", "GET", "/api/v1/reports/cost/", f"/api/v1/reports/cost/?{span}&group_by=gpu_type", None),
        ("member", "GET", "/api/v1/bookings/", "/api/v1/bookings/", None),
        ("member", "GET", "/api/v1/bookings/{booking_id}/", f"/api/v1/bookings/{booking.pk}/", None),
        ("member", "GET", "/api/v1/quotas/", "/api/v1/quotas/", None),
        ("member", "GET", "/api/v1/teams/{slug}/budget/", "/api/v1/teams/vision/budget/", None),
    ]
    answers = {}
    for role, method, template, url, body in calls:
        client = api_client_for(role)
        response = client.get(url) if method == "GET" else client.post(url, body, format="json")
        assert response.status_code == 200, (url, response.content[:500])
        validate(schema, method, template, 200, response.json())
        answers[url] = response.json()

    # the data was there to be validated: usage, cost, per-task figures, GPU samples, budget, booking
    listed = {j["id"]: j for j in answers["/api/v1/jobs/"]["results"]}
    assert (listed[str(job.pk)]["gpu_seconds"], listed[str(job.pk)]["gpu_hours"], listed[str(job.pk)]["cost"]) == (
        2468, "0.69", "1.61")  # 2 × 1234 GPU-s at 2.3457 / GPU-h: 1.6081…  # fmt: skip
    detail = answers[f"/api/v1/jobs/{array.pk}/"]
    assert [(t["gpu_seconds"], t["gpu_hours"], t["cost"]) for t in detail["tasks"]] == [(1001, "0.28", "0.65"),
                                                                                        (1234, "0.34", "0.80")]  # fmt: skip
    gpus = answers[f"/api/v1/jobs/{job.pk}/"]["gpu_usage"]["gpus"]
    assert [(g["gpu"], g["busy_gpu_hours"]) for g in gpus] == [("0", "0.29"), ("1", "0.04")]  # 87.3 %, 12.9 % of 20 min
    assert answers["/api/v1/jobs/quote/"]["gpu_hours"] == "0.35"  # 3 GPUs × 7 min (no overrun here)
    assert answers["/api/v1/teams/vision/budget/"]["booked"] == "0.33"  # 20 minutes of 1 GPU
    assert answers["/api/v1/bookings/"]["results"][0]["gpu_hours"] == "0.33"
    usage = answers[f"/api/v1/teams/vision/usage/?{span}"]
    assert usage["months"][-1]["gpu_hours"] == "1.31" and usage["users"], usage  # 2468 + 2235 GPU-s
    costs = decimal_strings(answers, "cost")
    assert costs and all(isinstance(value, str) for value in costs if value is not None), costs


def test_every_money_and_gpu_hours_property_is_a_decimal_string(schema):
    """Declared the one way on every endpoint (portal.fields.DecimalStringField), answers and bodies."""
    seen = []
    for name, component in schema["components"]["schemas"].items():
        for prop, declared in component.get("properties", {}).items():
            if MONEY_OR_HOURS.search(prop):
                assert {key: declared.get(key) for key in DECIMAL_STRING} == DECIMAL_STRING, (name, prop, declared)
                assert declared.get("pattern"), (name, prop, declared)
                seen.append(f"{name}.{prop}")
    assert {"JobSummaryOutput.gpu_hours", "JobSummaryOutput.cost", "JobArrayTaskOutput.cost", "JobQuoteOutput.cost",
            "CostReportRow.idle_cost", "BudgetRowOutput.remaining", "TeamBudgetOutput.booked", "BookingOutput.gpu_hours",
            "QuotaOutput.gpu_hours", "JobGpuOutput.busy_gpu_hours"} <= set(seen), seen  # fmt: skip
