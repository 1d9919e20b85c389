"""Issue 16: the submit path's per-change copies (portal/snapshots.py) of the quotas in force, the
bookings that hold capacity and the submitter's team and role — each read once per change, and every
change seen at the next submission: by the service that makes it, by a plain save (signals), and
never from a transaction that rolled back.

Transactional: a change commits as in production (inside a test's transaction every read of a
changed snapshot goes to the database, which would hide the copies)."""

from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone

from accounting.selectors.budgets import _booked_hours_bulk, quotas_effective
from accounting.services import quota_cancel
from portal.models import Role
from portal.roles import team_with_role
from portal.services import membership_remove, membership_set, team_set_active
from tests.factories import BookingFactory, QuotaFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_cache(settings):
    """A cache of this test's own: other test runs on the machine flush the shared Redis cache database."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "snap-submit"}}


@pytest.fixture(autouse=True)
def no_tasks(monkeypatch):
    """The services' after-commit tasks (Slurm limits, the team mirror) are not what this tests."""
    monkeypatch.setattr("portal.outbox.publish", lambda task, *args: True)


def _a100_quota(world):
    return next(q for (team_id, kind), q in quotas_effective(team=world.vision).items() if kind == "a100")


def test_the_quotas_are_read_once_and_a_revoked_one_is_gone_at_the_next_read(world, django_assert_num_queries):
    quota = QuotaFactory(team=world.vision, gpu_type="a100", gpu_hours=50)
    assert _a100_quota(world).pk == quota.pk  # read into the copy
    with django_assert_num_queries(0):
        assert _a100_quota(world).gpu_hours == 50
    quota_cancel(quota=quota, user=world.admin)  # the service: a queryset update, then commit
    assert (world.vision.pk, "a100") not in quotas_effective(team=world.vision)
    newer = QuotaFactory(team=world.vision, gpu_type="a100", gpu_hours=70)  # a plain save: the signal
    assert _a100_quota(world).pk == newer.pk


def test_each_caller_gets_its_own_quota_and_team_never_the_copys_rows(world, django_assert_num_queries):
    quotas_effective(team=world.vision)  # read into the copy
    key = (world.vision.pk, "")
    with django_assert_num_queries(0):
        first, second = quotas_effective(team=world.vision)[key], quotas_effective(team=world.vision)[key]
    assert first.pk == second.pk and first is not second and first.team is not second.team
    first.gpu_hours, first.team.slug = 1, "changed"
    again = quotas_effective(team=world.vision)[key]
    assert again.gpu_hours == 1_000_000 and again.team.slug == "vision"


def test_a_quota_of_a_transaction_that_rolled_back_never_enters_the_copy(world):
    assert (world.vision.pk, "h100") not in quotas_effective(team=world.vision)
    with pytest.raises(RuntimeError), transaction.atomic():
        QuotaFactory(team=world.vision, gpu_type="h100", gpu_hours=5)
        # its own transaction sees it (from the database) …
        assert (world.vision.pk, "h100") in quotas_effective(team=world.vision)
        raise RuntimeError("roll back")
    # … and nobody else, now or later
    assert (world.vision.pk, "h100") not in quotas_effective(team=world.vision)
    assert (world.vision.pk, "h100") not in quotas_effective(team=world.vision)


def test_a_past_day_is_read_from_the_database(world, django_assert_num_queries):
    quotas_effective(team=world.vision)  # the copy covers today on
    with django_assert_num_queries(1):
        quotas_effective(team=world.vision, at=timezone.now() - dt.timedelta(days=3))


def test_the_team_and_role_are_read_once_and_every_membership_change_is_seen(world, django_assert_num_queries):
    assert team_with_role(world.alice, "vision").viewer_role == Role.MEMBER
    with django_assert_num_queries(0):
        team = team_with_role(world.alice, "vision")
        assert team.viewer_role == Role.MEMBER and team.slurm_account == "vision"
    assert team is not team_with_role(world.alice, "vision")  # a Team of each caller's own
    membership_set(team=world.vision, user=world.alice, role=Role.MANAGER)
    assert team_with_role(world.alice, "vision").viewer_role == Role.MANAGER
    membership_remove(team=world.vision, user=world.alice)
    assert team_with_role(world.alice, "vision").viewer_role is None
    team_set_active(team=world.vision, active=False)  # a queryset update in the service
    assert team_with_role(world.bob, "vision").active is False
    assert team_with_role(world.alice, "nosuch") is None


def test_a_booking_counts_from_its_approval_and_stops_at_its_cancellation(world):
    now = timezone.now()
    start, end = now - dt.timedelta(days=1), now + dt.timedelta(days=1)
    assert _booked_hours_bulk(start, end, [world.vision]).get((world.vision.pk, "a100"), 0) == 0
    booking = BookingFactory(team=world.vision, gpus=2, start=now - dt.timedelta(hours=1), end=now + dt.timedelta(hours=1))
    assert _booked_hours_bulk(start, end, [world.vision])[(world.vision.pk, "a100")] == 4
    booking.status, booking.cancelled_at = "cancelled", now  # held for its first hour only
    booking.save(update_fields=["status", "cancelled_at"])
    assert _booked_hours_bulk(start, end, [world.vision])[(world.vision.pk, "a100")] == 2
    assert _booked_hours_bulk(start, end, [world.nlp]) == {}


def test_a_request_reads_every_version_in_one_cache_call(world, api_client_for):
    from portal import snapshots

    client = api_client_for("member")
    body = {"team": "vision", "script": "#!/bin/bash\ntrue\n", "partition": "nosuch"}
    assert client.post("/api/v1/jobs/", body, format="json").status_code == 400  # warm: every version exists
    reads = []
    real = snapshots._versions_get

    def versions_get(names):
        reads.append(list(names))
        return real(names)

    with mock.patch.object(snapshots, "_versions_get", versions_get):
        response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400  # validated against the inventory: a snapshot was read
    assert reads == [list(snapshots.NAMES)]  # one MGET of every version, none read alone


def test_a_token_is_looked_up_once_per_process_and_a_revocation_is_seen_at_once(world):
    from django.core.cache import cache
    from rest_framework.test import APIClient

    from portal.services import api_token_create, api_token_revoke

    token, key = api_token_create(user=world.alice, name="memo")
    client = APIClient(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/teams/").status_code == 200  # looked up, kept in the cache and the memo
    with mock.patch.object(cache, "get", wraps=cache.get) as get:
        assert client.get("/api/v1/teams/").status_code == 200
    assert not [c for c in get.call_args_list if "apitoken:" in str(c.args[0])]  # from the memo
    api_token_revoke(token=token)
    assert client.get("/api/v1/teams/").status_code == 401
