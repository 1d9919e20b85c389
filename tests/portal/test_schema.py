"""The OpenAPI schema documents every status an operation can answer (portal/schema.py): one shared
``Error`` component, derived from each view, JSON errors even where the success answer is CSV."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method.upper(), operation


def test_every_error_response_is_the_shared_error_component_as_json(schema):
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["detail", "errors"]
    assert error["properties"]["detail"]["type"] == "string" and error["properties"]["errors"]["type"] == "object"
    seen = 0
    for path, method, operation in operations(schema):
        for code, response in operation["responses"].items():
            if int(code) >= 400:
                assert response["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}, (
                    method, path, code)  # fmt: skip
                assert response["description"], (method, path, code)
                seen += 1
    assert seen > 100


def test_the_statuses_follow_what_each_operation_is(schema):
    for path, method, operation in operations(schema):
        codes = set(operation["responses"])
        label = f"{method} {path}"
        assert {"401", "404"} <= codes, label  # token auth everywhere; unknown ids and ?format= answer 404
        assert any(c.startswith("2") for c in codes), label
        if "requestBody" in operation:
            assert {"400", "415"} <= codes, label
            assert set(operation["requestBody"]["content"]) == {"application/json"}, label
        if method != "GET":
            assert {"400", "403", "409"} <= codes, label
        else:
            assert "409" not in codes and "415" not in codes, label
        assert ("429" in codes) == (label == "POST /api/v1/jobs/"), label  # the submit throttle


def test_reads_that_refuse_by_role_say_so(schema):
    cost = schema["paths"]["/api/v1/reports/cost/"]["get"]["responses"]
    assert "403" in cost
    assert "403" not in schema["paths"]["/api/v1/teams/"]["get"]["responses"]


def test_csv_and_the_one_or_array_submit_are_documented_as_answered(schema):
    cost = schema["paths"]["/api/v1/reports/cost/"]["get"]["responses"]["200"]["content"]
    assert cost["text/csv"]["schema"] == {"type": "string"}
    assert cost["application/json"]["schema"]["$ref"].endswith("/CostReport")
    submit = schema["paths"]["/api/v1/jobs/"]["post"]
    for code in ("200", "201"):
        ref = submit["responses"][code]["content"]["application/json"]["schema"]["$ref"]
        one_of = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["oneOf"]
        assert one_of[0] == {"$ref": "#/components/schemas/JobSummaryOutput"}
        assert one_of[1] == {"type": "array", "items": {"$ref": "#/components/schemas/JobSummaryOutput"}}
    [key] = [p for p in submit["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["in"] == "header" and key["schema"]["pattern"]


def test_optional_query_parameters_allow_an_empty_value(schema):
    jobs = {p["name"]: p for p in schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]}
    assert jobs["since"]["allowEmptyValue"] and jobs["cursor"]["allowEmptyValue"]
    assert jobs["mine"]["schema"]["enum"] == ["false", "true"]
    assert not any("allowEmptyValue" in p for p in jobs.values() if p["in"] == "path")
