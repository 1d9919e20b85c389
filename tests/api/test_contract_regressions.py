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
