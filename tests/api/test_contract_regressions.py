"""What schemathesis found against the contract, fixed where it was wrong, one test each."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_decision_note_must_be_a_string_not_a_number(world, api_client_for):
    """``{"note": 0}`` was accepted as "0" while the schema says string."""
    from accounting.models import Booking
    from django.utils import timezone
    import datetime as dt

    start = timezone.now() + dt.timedelta(days=2)
    booking = Booking.objects.create(team=world.vision, gpu_type="a100", gpus=4, start=start, end=start + dt.timedelta(hours=1))
    response = api_client_for("admin").post(f"/api/v1/bookings/{booking.pk}/approve/", {"note": 0}, format="json")
    assert response.status_code == 400 and response.json()["errors"] == {"note": ["Not a valid string."]}
    booking.refresh_from_db()
    assert booking.status == "requested"


def test_rejecting_a_quota_requires_a_comment_as_the_schema_says(world, api_client_for):
    from accounting import services

    quota = services.quota_request(team=world.vision, user=world.bob, gpu_hours=10, justification="x")
    response = api_client_for("admin").post(f"/api/v1/quotas/{quota.pk}/reject/", {}, format="json")
    assert response.status_code == 400 and "comment" in response.json()["errors"]
    response = api_client_for("admin").post(f"/api/v1/quotas/{quota.pk}/reject/", {"comment": 7}, format="json")
    assert response.status_code == 400 and response.json()["errors"] == {"comment": ["Not a valid string."]}
    assert api_client_for("admin").post(f"/api/v1/quotas/{quota.pk}/reject/", {"comment": "no"}, format="json").status_code == 200


def test_bodies_are_json_only(world, api_client_for):
    """The schema documents JSON bodies; form and multipart bodies answer 415, not a half-parsed 400."""
    response = api_client_for("member").post("/api/v1/jobs/quote/", {"gpus": "1"})  # multipart
    assert response.status_code == 415 and set(response.json()) == {"detail", "errors"}
    assert api_client_for("member").post("/api/v1/jobs/quote/", {"gpus": 1}, format="json").status_code != 415


def test_an_unknown_format_answers_the_documented_json_404(world, api_client_for):
    response = api_client_for("finance").get("/api/v1/reports/cost/?format=xml")
    assert response.status_code == 404 and response.json() == {"detail": "Not found.", "errors": {}}


def test_cost_report_errors_asked_for_as_csv_by_accept_header_are_json(world, api_client_for):
    response = api_client_for("member").get("/api/v1/reports/cost/", HTTP_ACCEPT="text/csv")
    assert response.status_code == 403 and response["Content-Type"].startswith("application/json"), response.content


@pytest.mark.parametrize("since", ["0280-11-09T19:04:31.51+19:44", "2026-01-01T00:00:00-23:59"])
def test_a_since_with_an_offset_postgresql_refuses_is_taken_to_utc(world, inventory_small, relays, api_client_for, since):
    """Found by the fuzzer: ``?since=…+19:44`` reached PostgreSQL as it was (offsets past ±15:59 are
    refused there): a 500. The filter takes the date-time to UTC first."""
    from urllib.parse import quote

    from jobs.services import job_submit
    from tests.support import job_payload

    job_submit(user=world.alice, team=world.vision, **{k: v for k, v in job_payload().items() if k != "team"})
    response = api_client_for("member").get(f"/api/v1/jobs/?since={quote(since)}")
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == 1  # both are before the job (2026-01-01T23:59Z, year 280)
    assert len(api_client_for("member").get(f"/api/v1/jobs/?since={quote('2999-01-01T00:00:00+19:00')}").json()["results"]) == 0


def test_a_since_that_does_not_exist_in_utc_is_a_400(world, api_client_for):
    response = api_client_for("member").get("/api/v1/jobs/?since=0001-01-01T00:00:00%2B05:00")
    assert response.status_code == 400 and "since" in response.json()["errors"]


@pytest.mark.parametrize("field", ["gpus", "nodes", "cpus_per_gpu", "memory_gb", "time_limit_minutes"])
def test_a_number_too_large_for_its_column_is_a_400_naming_the_field(world, api_client_for, field):
    """``POST /api/v1/job-templates/`` with ``cpus_per_gpu: 1121647922087`` was a 500 (PostgreSQL:
    integer out of range); a number the column cannot hold is the client's error."""
    from jobs.models import JobTemplate

    body = {"scope": "personal", "name": "big", "script": "#!/bin/bash\nsrun true\n", field: 2**31}
    response = api_client_for("member").post("/api/v1/job-templates/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"][field] == [f"Must be at most {2**31 - 1}."]
    assert not JobTemplate.objects.filter(name="big").exists()


@pytest.mark.parametrize("path", ["/api/v1/bookings/", "/api/v1/jobs/", "/api/v1/quotas/"])
def test_a_nul_byte_in_a_query_parameter_is_a_400_naming_it(world, api_client_for, path):
    """``?status=Y…%00…`` reached PostgreSQL, which cannot hold NUL in text: a 500."""
    response = api_client_for("manager").get(f"{path}?team=vision&status=a%00b")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"status": ["Must not contain NUL (0x00) bytes."]}
    assert api_client_for("manager").get(f"{path}?team=vision&status=approved").status_code == 200


def test_a_page_with_a_nul_byte_in_its_query_is_a_400(world, client):
    client.force_login(world.alice)
    assert client.get("/jobs/?state=%00").status_code == 400
    assert client.get("/jobs/").status_code == 200
