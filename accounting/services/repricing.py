"""Pricing usage: a usage record's slices (its GPU time cut at month boundaries and at rate changes,
each priced by accounting.rates.RateBook) and re-pricing after a rate is added (``usage_reprice``).
Ingestion (accounting.services.ingestion) writes slices through ``slices_replace`` too."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

from django.db import transaction
from django.db.models import Q

from accounting.calendar import HOUR, billing_midnight, billing_zone, month_starts
from accounting.charging import bookings_charge_reserved
from accounting.models import UsageRecord, UsageSlice
from accounting.rates import RateBook
from portal.db import bulk_insert_copy

SIX = Decimal("0.000001")
BATCH = 2000


def usage_reprice(*, gpu_type: str, since: dt.date) -> int:
    """Rebuild the slices of every record of ``gpu_type`` that used GPUs on or after ``since`` (after a
    rate was added). Batches of records; returns how many records were re-priced."""
    since_at = billing_midnight(since)
    ids = list(
        UsageRecord.objects.filter(gpu_type=gpu_type, gpus__gt=0)
        .filter(Q(end_time__isnull=True) | Q(end_time__gt=since_at))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for offset in range(0, len(ids), BATCH):
        with transaction.atomic():
            records = list(UsageRecord.objects.filter(pk__in=ids[offset : offset + BATCH]))
            slices_replace(records, RateBook.load({r.gpu_type for r in records}))
    return len(ids)


def slice_record(record: UsageRecord, book: RateBook) -> list[UsageSlice]:
    """A record's slices: its GPU time cut at month boundaries and at rate changes."""
    if not record.gpus or not record.gpu_seconds:
        return []
    start = record.start_time
    end = start + dt.timedelta(seconds=record.gpu_seconds // record.gpus)
    cuts = sorted(set(month_starts(start, end)) | set(book.change_points(record.gpu_type, record.partition, start, end)))
    bounds = [start, *cuts, end]
    total_seconds = int((end - start).total_seconds())
    requested_total = int((record.requested_gpu_hours * HOUR).to_integral_value(ROUND_HALF_UP))
    zone = billing_zone()
    slices: list[UsageSlice] = []
    requested_left = requested_total
    for index, (a, b) in enumerate(zip(bounds, bounds[1:])):
        seconds = int((b - a).total_seconds())
        if seconds <= 0:
            continue
        gpu_seconds = record.gpus * seconds
        if index == len(bounds) - 2:
            requested = requested_left
        else:
            requested = requested_total * seconds // total_seconds
            requested_left -= requested
        rate = book.rate_at(record.gpu_type, record.partition, a)
        price = rate.price_per_gpu_hour if rate else None
        cost = (Decimal(gpu_seconds) * price / HOUR).quantize(SIX, ROUND_HALF_UP) if rate else Decimal("0")
        if record.booking_id and bookings_charge_reserved():
            cost = Decimal("0")  # the booking carries the charge (accounting.selectors.booking_charges)
        local = a.astimezone(zone)
        slices.append(
            UsageSlice(
                record_id=record.pk,
                period=dt.date(local.year, local.month, 1),
                slice_start=a,
                slice_end=b,
                cluster=record.cluster,
                account=record.account,
                team_id=record.team_id,
                unix_user=record.unix_user,
                gpu_type=record.gpu_type,
                partition=record.partition,
                gpus=record.gpus,
                gpu_seconds=gpu_seconds,
                requested_gpu_seconds=requested,
                rate=rate,
                price_per_gpu_hour=price,
                cost=cost,
                provisional=record.provisional,
            )
        )
    return slices


def slices_replace(records: list[UsageRecord], book: RateBook) -> int:
    """Delete and rebuild the slices of these records: one DELETE, one COPY."""
    if not records:
        return 0
    UsageSlice.objects.filter(record_id__in=[r.pk for r in records]).delete()
    return bulk_insert_copy([s for r in records for s in slice_record(r, book)])

