"""Pricing usage: a usage record's slices (its GPU time cut at month boundaries and at rate changes,
each priced by accounting.rates.RateBook) and re-pricing after a rate is added (``usage_reprice``).
Ingestion (accounting.services.ingestion) writes slices through ``slices_replace`` too.

Re-pricing owed is a row (PendingReprice, written with the rate by rate_create): the task
(accounting.tasks.usage_reprice_task → ``usage_reprice_pending``) claims the rows it covers, re-prices
and deletes them; ``usage_reprice_sweep`` (periodic, portal/project/celery.py) enqueues again what a lost
task left — the outbox's policy (portal/outbox.py)."""

from __future__ import annotations

import datetime as dt
import operator
from decimal import Decimal

from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from accounting.calendar import billing_midnight, billing_zone, month_starts
from accounting.charging import bookings_charge_reserved
from accounting.models import PendingReprice, UsageRecord, UsageSlice
from accounting.rates import RateBook
from accounting.services.usage_rollup import usage_months_reopen
from portal import money
from portal.db import any_of, bulk_insert_copy, copied_fields, row_maker
from portal.outbox import publish

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
            # locked (in id order): a concurrent re-pricing or ingestion of these records waits for
            # this batch's slices instead of rebuilding them beside it
            batch = ids[offset : offset + BATCH]
            records = list(UsageRecord.objects.select_for_update().filter(pk__in=batch).order_by("pk"))
            slices_replace(records, RateBook.load({r.gpu_type for r in records}))
    return len(ids)


# A new rate's own task has this long to run before the sweeper enqueues its work again; a run under
# way holds its rows this long (beyond usage_reprice_task's hard time limit, 660 s)
REPRICE_SWEEP_AFTER = dt.timedelta(minutes=5)
REPRICE_LEASE = dt.timedelta(minutes=15)


def usage_reprice_owed(*, gpu_type: str, since: dt.date) -> PendingReprice:
    """Record that the usage of ``gpu_type`` from ``since`` on is to be re-priced: call in the
    transaction that adds the rate (rate_create), then enqueue usage_reprice_task after commit."""
    return PendingReprice.objects.create(gpu_type=gpu_type, since=since)


def usage_reprice_pending(*, gpu_type: str, since: dt.date, now: dt.datetime | None = None) -> int | None:
    """The work of usage_reprice_task: claim the PendingReprice rows of ``gpu_type`` from ``since``
    on (locked SKIP LOCKED and marked in one UPDATE: rows another run holds are skipped), re-price
    that usage and delete them. Those rows were committed with their rates, so the rate book this run reads has them; a
    rate added meanwhile has a row (and a task) of its own. None when nothing is owed: another run
    did it (a sweep's repeat, a redelivery) — running it twice re-prices once. A failure hands the
    rows back for the retry or the sweeper."""
    now = now or timezone.now()
    free = Q(started_at__isnull=True) | Q(started_at__lt=now - REPRICE_LEASE)
    with transaction.atomic():
        claimed = list(
            PendingReprice.objects.select_for_update(skip_locked=True)
            .filter(free, gpu_type=gpu_type, since__gte=since)
            .values_list("pk", flat=True)
        )
        PendingReprice.objects.filter(pk__in=claimed).update(started_at=now)
    if not claimed:
        return None
    mine = PendingReprice.objects.filter(pk__in=claimed, started_at=now)
    try:
        count = usage_reprice(gpu_type=gpu_type, since=since)
    except BaseException:
        mine.update(started_at=None)
        raise
    mine.delete()
    return count


def usage_reprice_sweep(*, now: dt.datetime | None = None) -> list[tuple[str, str]]:
    """The sweeper of usage_reprice_task: re-pricing owed for more than REPRICE_SWEEP_AFTER and not
    under way is enqueued again, one task per GPU type from its earliest day (which covers the
    type's later rows too). Returns the (gpu_type, ISO day) enqueued."""
    now = now or timezone.now()
    rows = (
        PendingReprice.objects.filter(created_at__lt=now - REPRICE_SWEEP_AFTER)
        .filter(Q(started_at__isnull=True) | Q(started_at__lt=now - REPRICE_LEASE))
        .values("gpu_type")
        .annotate(first=Min("since"))
        .order_by("gpu_type")
    )
    owed = [(row["gpu_type"], row["first"].isoformat()) for row in rows]
    for gpu_type, since in owed:
        publish("accounting.tasks.usage_reprice_task", gpu_type, since)
    return owed


# What a UsageSlice takes unchanged from its UsageRecord (who, where, what; provisional until final).
SLICE_COPIED = ("cluster", "account", "team_id", "unix_user", "gpu_type", "partition", "gpus", "provisional")


_new_slice = row_maker(UsageSlice)  # UsageSlice's values as a plain row for the COPY, not a model instance


def slice_record(record: UsageRecord, book: RateBook) -> list:
    """A record's slices (UsageSlice rows: portal.db.row_maker): its GPU time cut at month boundaries
    and at rate changes."""
    if not record.gpus or not record.gpu_seconds:
        return []
    start = record.start_time
    end = start + dt.timedelta(seconds=record.gpu_seconds // record.gpus)
    cuts = sorted(set(month_starts(start, end)) | set(book.change_points(record.gpu_type, record.partition, start, end)))
    bounds = [start, *cuts, end]
    requested_total = money.gpu_seconds(record.requested_gpu_hours)
    # the requested GPU time falls where the job's requested window [start, start + limit) does; what
    # it left unused is counted at its last slice. A slice before the last is then the same at every
    # ingestion of a running job (its closed months stay rolled: slices_replace).
    window_end = start + dt.timedelta(seconds=requested_total // record.gpus)
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
            requested = min(requested_left, record.gpus * max(0, int((min(b, window_end) - a).total_seconds())))
            requested_left -= requested
        rate = book.rate_at(record.gpu_type, record.partition, a)
        price = rate.price_per_gpu_hour if rate else None
        cost = money.stored(money.cost(gpu_seconds=gpu_seconds, price=price)) if rate else Decimal("0")
        if record.booking_id and bookings_charge_reserved():
            cost = Decimal("0")  # the booking carries the charge (accounting.selectors.booking_charges)
        local = a.astimezone(zone)
        slices.append(
            _new_slice(
                record_id=record.pk,
                period=dt.date(local.year, local.month, 1),
                slice_start=a,
                slice_end=b,
                **copied_fields(record, SLICE_COPIED),
                gpu_seconds=gpu_seconds,
                requested_gpu_seconds=requested,
                rate_id=rate.pk if rate else None,
                price_per_gpu_hour=price,
                cost=cost,
            )
        )
    return slices


# what a slice says: a month whose slices say the same after a rebuild keeps its roll-up
_SLICE_FACTS = tuple(
    f.attname for f in UsageSlice._meta.concrete_fields if not f.primary_key
)


_slice_facts = operator.attrgetter(*_SLICE_FACTS)  # a new slice's facts, as the stored ones are read


def slices_replace(records: list[UsageRecord], book: RateBook) -> int:
    """Delete and rebuild the slices of these records: one read of the old ones, one DELETE, one COPY.
    The months before the current one whose slices changed are marked for a new roll-up
    (usage_months_reopen: a late record or a re-pricing of a closed month). A record re-read every
    ingestion while its job runs (or re-ingested unchanged) rebuilds its closed months' slices
    identically: those months stay rolled (no statement)."""
    if not records:
        return 0
    ids = any_of([r.pk for r in records], "bigint")  # one array parameter, not one per record
    old: dict = {}
    period = _SLICE_FACTS.index("period")
    for values in UsageSlice.objects.filter(record_id__in=ids).values_list(*_SLICE_FACTS):
        old.setdefault(values[period], []).append(values)
    UsageSlice.objects.filter(record_id__in=ids).delete()
    slices = [s for r in records for s in slice_record(r, book)]
    new: dict = {}
    for piece in slices:
        new.setdefault(piece.period, []).append(_slice_facts(piece))
    usage_months_reopen({p for p in old.keys() | new.keys() if sorted(old.get(p, ())) != sorted(new.get(p, ()))})
    return bulk_insert_copy(slices)

