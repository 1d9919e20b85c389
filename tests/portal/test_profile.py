"""The profile page: a user's own time zone and job-end email opt-in."""

from __future__ import annotations

import pytest

from portal.models import Profile

pytestmark = pytest.mark.django_db


def test_profile_saves_time_zone_and_job_end_emails_and_pages_use_the_zone(world, client_for):
    client = client_for("member")
    response = client.post("/account/profile/", {"time_zone": "Asia/Shanghai", "notify_job_end": "on"})
    assert response.status_code == 302 and response["Location"] == "/account/profile/"
    profile = Profile.objects.get(user=world.alice)
    assert (profile.time_zone, profile.notify_job_end) == ("Asia/Shanghai", True)
    page = client.get("/account/profile/")
    assert page.context["request"].user == world.alice
    assert 'value="Asia/Shanghai"' in page.content.decode()
    from django.utils import timezone

    assert str(timezone.get_current_timezone()) == "Asia/Shanghai"  # the middleware activated it


def test_an_unknown_time_zone_is_refused_beside_the_field_and_nothing_is_saved(world, client_for):
    response = client_for("member").post("/account/profile/", {"time_zone": "Mars/Olympus", "notify_job_end": "on"})
    assert response.status_code == 400
    assert "Unknown time zone &#x27;Mars/Olympus&#x27;" in response.content.decode()
    assert 'value="Mars/Olympus"' in response.content.decode()  # the input is kept
    profile = Profile.objects.get(user=world.alice)
    assert (profile.time_zone, profile.notify_job_end) == ("", False)
