"""portal.services.lease_claim / lease_release (the beat lease, portal/beat.py) on the real database:
one holder at a time by the database's clock; the holder renews, another takes an expired lease only."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from portal.models import Lease
from portal.services import lease_claim, lease_release

pytestmark = pytest.mark.django_db


def _expire(name: str) -> None:
    Lease.objects.filter(name=name).update(expires_at=timezone.now() - dt.timedelta(seconds=1))


def test_one_holder_until_the_lease_expires_then_another_takes_it():
    assert lease_claim(name="beat", holder="h1:1:a", seconds=30) is True  # the row is created, then taken
    first = Lease.objects.get(name="beat")
    assert first.holder == "h1:1:a" and first.expires_at > timezone.now() + dt.timedelta(seconds=25)
    assert lease_claim(name="beat", holder="h2:2:b", seconds=30) is False  # held: refused, nothing changed
    assert Lease.objects.get(name="beat").holder == "h1:1:a"
    assert lease_claim(name="beat", holder="h1:1:a", seconds=30) is True  # renewed, same acquired_at
    assert Lease.objects.get(name="beat").acquired_at == first.acquired_at
    _expire("beat")  # the holder died and did not renew
    assert lease_claim(name="beat", holder="h2:2:b", seconds=30) is True
    taken = Lease.objects.get(name="beat")
    assert taken.holder == "h2:2:b" and taken.acquired_at > first.acquired_at
    assert lease_claim(name="beat", holder="h1:1:a", seconds=30) is False  # the old holder is out


def test_a_released_lease_is_taken_at_once_and_only_its_holder_releases_it():
    assert lease_claim(name="beat", holder="h1:1:a", seconds=30)
    assert lease_release(name="beat", holder="h2:2:b") is False  # not its lease
    assert lease_claim(name="beat", holder="h2:2:b", seconds=30) is False
    assert lease_release(name="beat", holder="h1:1:a") is True
    assert lease_claim(name="beat", holder="h2:2:b", seconds=30) is True


def test_leases_of_different_names_are_independent():
    assert lease_claim(name="beat", holder="h1:1:a", seconds=30)
    assert lease_claim(name="other", holder="h2:2:b", seconds=30)
    assert dict(Lease.objects.values_list("name", "holder")) == {"beat": "h1:1:a", "other": "h2:2:b"}
