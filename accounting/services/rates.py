"""Writes of prices: ``rate_create`` (history is kept: a change is a new row). Which rate is in force
is accounting.rates.RateBook's answer; re-pricing the usage a new rate touches is
accounting.services.repricing (owed as a PendingReprice row written with the rate, swept)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from accounting.models import Rate
from accounting.services.repricing import usage_reprice_owed
from portal.exceptions import ApplicationError, Conflict
from portal.outbox import after_commit
from portal.roles import is_admin


def may_set_prices(user) -> bool:
    """Only admins set prices: rate_create's rule, which the rates page asks before showing its form."""
    return is_admin(user)


@transaction.atomic
def rate_create(
    *,
    gpu_type: str,
    price_per_gpu_hour: Decimal,
    effective_from: dt.date,
    partition: str = "",
    currency: str = "",
    note: str = "",
    created_by=None,
) -> Rate:
    """Add a price. Only admins set prices (403 otherwise); ``created_by=None`` is the system (the demo
    seed, commands). Usage from ``effective_from`` on is re-priced after commit: the work is owed as a
    row in this transaction (usage_reprice_owed), so a lost enqueue is the sweeper's."""
    if created_by is not None and not may_set_prices(created_by):
        raise ApplicationError("Only admins set prices.", status_code=403)
    currency = (currency or settings.DEFAULT_CURRENCY).upper()
    if currency != settings.DEFAULT_CURRENCY:
        raise ApplicationError(
            "One currency per site.", errors={"currency": f"Rates are in {settings.DEFAULT_CURRENCY}."}
        )
    gpu_type = (gpu_type or "").strip()
    partition = (partition or "").strip()
    if Rate.objects.filter(gpu_type=gpu_type, partition=partition, effective_from=effective_from).exists():
        raise Conflict(
            "A rate for this GPU type and partition already starts on that day.",
            errors={"effective_from": f"{effective_from} is taken; choose another day."},
        )
    rate = Rate(
        gpu_type=gpu_type,
        partition=partition,
        price_per_gpu_hour=Decimal(price_per_gpu_hour),
        currency=currency,
        effective_from=effective_from,
        note=note,
        created_by=created_by,
    )
    rate.full_clean()
    rate.save()
    usage_reprice_owed(gpu_type=gpu_type, since=effective_from)
    after_commit("accounting.tasks.usage_reprice_task", gpu_type, effective_from.isoformat())
    return rate
