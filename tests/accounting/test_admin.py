"""accounting.admin: a rate added in the Django admin goes through rate_create (the form's fields as
entered, the admin as its creator, the re-pricing owed in the same transaction)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from accounting.models import PendingReprice, Rate

pytestmark = pytest.mark.django_db


def test_a_rate_added_in_the_admin_is_created_by_rate_create_with_every_field_of_the_form(
    world, client_for, settings, django_capture_on_commit_callbacks
):
    day = dt.date(2031, 3, 1)
    with django_capture_on_commit_callbacks():  # the re-pricing task is not run: its row is what counts
        response = client_for("admin").post(
            "/admin/accounting/rate/add/",
            {"gpu_type": "a100", "partition": "gpu", "price_per_gpu_hour": "3.2500", "currency": settings.DEFAULT_CURRENCY,
             "effective_from": day.isoformat(), "note": "from the admin"},
        )  # fmt: skip
    assert response.status_code == 302, response.content[:2000]
    rate = Rate.objects.get(gpu_type="a100", partition="gpu", effective_from=day)
    assert rate.price_per_gpu_hour == Decimal("3.2500")
    assert rate.note == "from the admin"
    assert rate.currency == settings.DEFAULT_CURRENCY
    assert rate.created_by == world.admin
    assert PendingReprice.objects.filter(gpu_type="a100", since=day).exists()
