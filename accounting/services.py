"""Writes for accounting: rates, usage ingestion from slurmdbd, re-pricing.

Usage ingestion reads ``gateway.accounting(start, end)`` once per window for every job of the cluster
(portal jobs and direct sbatch alike) and upserts one ``UsageRecord`` per started allocation plus its
``UsageSlice`` rows (one per calendar month and rate). The high-water mark lives in
``SyncStatus(kind="usage").data``; each window starts ``ACCOUNTING_INGEST_OVERLAP_SECONDS`` before it,
or earlier when a recent provisional (running) record has not been re-read since. Records whose values
did not change are not written again, so re-ingesting a window is a no-op."""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
import uuid
from bisect import bisect_right
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from collections.abc import Iterable, Sequence

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from accounting.models import Rate, UsageRecord, UsageSlice
from accounting.selectors import billing_midnight, billing_zone
from portal.exceptions import ApplicationError, Conflict
from portal.models import SyncStatus, Team
from portal.services import sync_record_failure, sync_record_success
from portal.slurm import AccountingRecord, SlurmError, get_gateway

logger = logging.getLogger(__name__)

USAGE_KIND = "usage"
COMMENT_TAG = re.compile(r"gpuportal:([0-9a-fA-F-]{36})")
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED", "SIGNALING"}
HOUR = Decimal(3600)
SIX = Decimal("0.000001")
BATCH = 2000

# Fields of UsageRecord written by an upsert (everything but the key and first_seen_at)
RECORD_FIELDS = (
    "start_time", "end_time", "state", "name", "account", "team_id", "unix_user", "user_id", "partition",
    "num_nodes", "comment", "portal_job_uuid", "gpus", "gpu_type", "elapsed_seconds", "time_limit_minutes",
    "gpu_seconds", "gpu_hours", "requested_gpu_hours", "provisional", "known_until",
)  # fmt: skip


def _setting(name: str, default):
    return getattr(settings, name, default)


# ---------------------------------------------------------------- rates


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
    """Add a price (history is kept: a change is a new row). Usage from ``effective_from`` on is
    re-priced after commit."""
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
    transaction.on_commit(lambda: _enqueue_reprice(gpu_type, effective_from))
    return rate


def _enqueue_reprice(gpu_type: str, since: dt.date) -> None:
    from accounting.tasks import usage_reprice_task

    usage_reprice_task.delay(gpu_type, since.isoformat())


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
            _slices_replace(records, _RateBook.load({r.gpu_type for r in records}))
    return len(ids)


class _RateBook:
    """Every rate of some GPU types (one query), answering "which rate applies from when"."""

    def __init__(self, rates: Iterable[Rate]):
        self._by_key: dict[tuple[str, str], list[tuple[dt.datetime, Rate]]] = {}
        for rate in rates:
            self._by_key.setdefault((rate.gpu_type, rate.partition), []).append(
                (billing_midnight(rate.effective_from), rate)
            )
        for items in self._by_key.values():
            items.sort(key=lambda item: item[0])

    @classmethod
    def load(cls, gpu_types: set[str]) -> _RateBook:
        return cls(Rate.objects.filter(gpu_type__in=gpu_types) if gpu_types else [])

    @staticmethod
    def _at(items: list[tuple[dt.datetime, Rate]], at: dt.datetime) -> Rate | None:
        index = bisect_right([start for start, _ in items], at) - 1
        return items[index][1] if index >= 0 else None

    def rate_at(self, gpu_type: str, partition: str, at: dt.datetime) -> Rate | None:
        if partition:
            specific = self._at(self._by_key.get((gpu_type, partition), []), at)
            if specific is not None:
                return specific
        return self._at(self._by_key.get((gpu_type, ""), []), at)

    def change_points(self, gpu_type: str, partition: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
        keys = [(gpu_type, "")] + ([(gpu_type, partition)] if partition else [])
        return sorted(
            {at for key in keys for at, _ in self._by_key.get(key, []) if start < at < end}
        )


# ---------------------------------------------------------------- ingestion


@dataclass
class IngestResult:
    window_start: dt.datetime
    window_end: dt.datetime
    read: int = 0  # allocations Slurm returned
    started: int = 0  # of which started (recorded)
    written: int = 0  # new or changed records upserted
    slices: int = 0
    seconds: float = 0.0
    windows: list[tuple[dt.datetime, dt.datetime]] = field(default_factory=list)


def usage_window_start(*, now: dt.datetime) -> dt.datetime:
    """Where the next window starts: the high-water mark minus the overlap, earlier when a recent
    provisional record was last read before that, and a backfill period back on the first run."""
    overlap = dt.timedelta(seconds=_setting("ACCOUNTING_INGEST_OVERLAP_SECONDS", 600))
    status = SyncStatus.objects.filter(kind=USAGE_KIND).first()
    mark = (status.data or {}).get("high_water_mark") if status else None
    if mark:
        start = dt.datetime.fromisoformat(mark) - overlap
    else:
        start = now - dt.timedelta(days=_setting("ACCOUNTING_INGEST_BACKFILL_DAYS", 35))
    max_age = dt.timedelta(days=_setting("ACCOUNTING_PROVISIONAL_MAX_AGE_DAYS", 3))
    oldest = UsageRecord.objects.filter(provisional=True, known_until__gt=now - max_age).aggregate(
        at=Min("known_until")
    )["at"]
    if oldest is not None and oldest - overlap < start:
        start = oldest - overlap
    return start


def usage_ingest(*, since: dt.datetime | None = None, now: dt.datetime | None = None) -> IngestResult:
    """Read accounting from Slurm since the high-water mark (or ``since``) up to now and record it.
    One ``gateway.accounting`` call per window (windows are at most ACCOUNTING_INGEST_WINDOW_DAYS long;
    the periodic run has one). Raises SlurmError after recording the failure in SyncStatus."""
    now = now or timezone.now()
    start = since if since is not None else usage_window_start(now=now)
    step = dt.timedelta(days=_setting("ACCOUNTING_INGEST_WINDOW_DAYS", 7))
    gateway = get_gateway()
    result = IngestResult(window_start=start, window_end=now)
    began = time.monotonic()
    window_start = start
    while window_start < now:
        window_end = min(window_start + step, now)
        try:
            records = gateway.accounting(window_start, window_end)
        except SlurmError as exc:
            sync_record_failure(USAGE_KIND, error=f"{type(exc).__name__}: {exc.message}")
            raise
        partial = usage_records_upsert(records=records, now=now, high_water_mark=window_end)
        result.read += partial.read
        result.started += partial.started
        result.written += partial.written
        result.slices += partial.slices
        result.windows.append((window_start, window_end))
        window_start = window_end
    result.seconds = time.monotonic() - began
    sync_record_success(
        USAGE_KIND,
        at=timezone.now(),
        data={"last_window_start": start.isoformat(), "last_read": result.read, "last_written": result.written,
              "last_seconds": round(result.seconds, 3)},
    )  # fmt: skip
    return result


def usage_records_upsert(
    *, records: Sequence[AccountingRecord], now: dt.datetime | None = None, high_water_mark: dt.datetime | None = None
) -> IngestResult:
    """Upsert accounting records and their slices in bulk: a fixed number of queries whatever the
    number of records (teams, users, rates, existing rows, upsert, slice delete, slice insert — each
    one query per 2 000 rows). Serialised by a lock on the SyncStatus row, so two ingestions never
    interleave. Advances the high-water mark (never backwards) when one is given."""
    now = now or timezone.now()
    result = IngestResult(window_start=now, window_end=now, read=len(records))
    cluster_default = settings.SLURM_CLUSTER
    started = [r for r in records if _started(r)]
    result.started = len(started)

    with transaction.atomic():
        status, _ = SyncStatus.objects.get_or_create(kind=USAGE_KIND)
        status = SyncStatus.objects.select_for_update().get(pk=status.pk)
        if started:
            rows = _build_rows(started, now=now, cluster_default=cluster_default)
            changed = _changed_rows(rows)
            if changed:
                saved = _upsert(changed)
                result.written = len(saved)
                result.slices = _slices_replace(saved, _RateBook.load({r.gpu_type for r in saved if r.gpus}))
        if high_water_mark is not None:
            mark = (status.data or {}).get("high_water_mark")
            if not mark or dt.datetime.fromisoformat(mark) < high_water_mark:
                data = {**(status.data or {}), "high_water_mark": high_water_mark.isoformat()}
                SyncStatus.objects.filter(pk=status.pk).update(data=data)
    return result


def _started(record: AccountingRecord) -> bool:
    """Jobs that never started used nothing and get no record. Slurm gives a job cancelled while
    pending Start = End and no allocated TRES: that is "never started" too."""
    if record.start_time is None or record.submit_time is None:
        return False
    if record.end_time is not None and record.end_time <= record.start_time and not record.alloc_tres:
        return False
    return True


def _portal_job_uuid(comment: str) -> uuid.UUID | None:
    match = COMMENT_TAG.search(comment or "")
    if not match:
        return None
    try:
        return uuid.UUID(match.group(1))
    except ValueError:
        return None


def _users_by_unix_name(names: set[str]) -> dict[str, int]:
    """Portal user id per cluster user name (profile.unix_username, else the login name); one query."""
    if not names:
        return {}
    user_model = get_user_model()
    found: dict[str, int] = {}
    rows = user_model.objects.filter(
        Q(profile__unix_username__in=names)
        | (Q(username__in=names) & (Q(profile__isnull=True) | Q(profile__unix_username="")))
    ).values_list("pk", "username", "profile__unix_username")
    for pk, username, unix_name in rows:
        name = unix_name or username
        if name in names:
            found.setdefault(name, pk)
    return found


def _build_rows(records: Sequence[AccountingRecord], *, now: dt.datetime, cluster_default: str) -> list[UsageRecord]:
    teams = dict(Team.objects.filter(slurm_account__in={r.account for r in records}).values_list("slurm_account", "pk"))
    users = _users_by_unix_name({r.user for r in records if r.user})
    rows: dict[tuple, UsageRecord] = {}
    for r in records:
        running = r.end_time is None or r.state in RUNNING_STATES
        end = None if running else r.end_time
        if running:  # figures up to the reading: sacct's Elapsed of a running job is "so far"
            effective_end = r.start_time + dt.timedelta(seconds=max(r.elapsed_seconds, 0))
        else:
            effective_end = max(r.end_time, r.start_time)
        seconds = int((effective_end - r.start_time).total_seconds())
        gpus = r.gpus
        gpu_seconds = gpus * seconds
        if r.time_limit_minutes is None:
            requested_seconds = gpu_seconds
        else:
            requested_seconds = max(gpus * r.time_limit_minutes * 60, gpu_seconds)
        row = UsageRecord(
            cluster=r.cluster or cluster_default,
            job_id=r.job_id,
            submit_time=r.submit_time,
            start_time=r.start_time,
            end_time=end,
            state=r.state[:32],
            name=(r.name or "")[:200],
            account=r.account,
            team_id=teams.get(r.account),
            unix_user=r.user,
            user_id=users.get(r.user),
            partition=r.partition or "",
            num_nodes=r.num_nodes or 1,
            comment=(r.comment or "")[:500],
            portal_job_uuid=_portal_job_uuid(r.comment),
            gpus=gpus,
            gpu_type=r.gpu_type,
            elapsed_seconds=max(r.elapsed_seconds, 0),
            time_limit_minutes=r.time_limit_minutes,
            gpu_seconds=gpu_seconds,
            gpu_hours=(Decimal(gpu_seconds) / HOUR).quantize(SIX, ROUND_HALF_UP),
            requested_gpu_hours=(Decimal(requested_seconds) / HOUR).quantize(SIX, ROUND_HALF_UP),
            provisional=running,
            known_until=now if running else end,
            first_seen_at=now,
        )
        rows[(row.cluster, row.job_id, row.submit_time)] = row  # last one wins on duplicates
    return list(rows.values())


def _comparable(row: UsageRecord) -> tuple:
    values = []
    for name in RECORD_FIELDS:
        if name == "known_until" and row.provisional:
            continue  # a running record's reading time always moves; its other figures decide
        value = getattr(row, name)
        if isinstance(value, Decimal):
            value = value.quantize(SIX)
        values.append(value)
    return tuple(values)


def _changed_rows(rows: list[UsageRecord]) -> list[UsageRecord]:
    """Rows that are new or differ from what is stored (one query)."""
    clusters = {r.cluster for r in rows}
    existing = {
        (e.cluster, e.job_id, e.submit_time): e
        for e in UsageRecord.objects.filter(cluster__in=clusters, job_id__in={r.job_id for r in rows})
    }
    changed = []
    for row in rows:
        old = existing.get((row.cluster, row.job_id, row.submit_time))
        if old is None or _comparable(old) != _comparable(row):
            changed.append(row)
    return changed


def _upsert(rows: list[UsageRecord]) -> list[UsageRecord]:
    saved = UsageRecord.objects.bulk_create(
        rows,
        batch_size=BATCH,
        update_conflicts=True,
        unique_fields=["cluster", "job_id", "submit_time"],
        update_fields=[f.removesuffix("_id") if f in ("team_id", "user_id") else f for f in RECORD_FIELDS],
    )
    missing = [r for r in saved if r.pk is None]
    if missing:  # backends that do not return ids from an upsert
        ids = {
            (c, j, s): pk
            for pk, c, j, s in UsageRecord.objects.filter(job_id__in={r.job_id for r in missing}).values_list(
                "pk", "cluster", "job_id", "submit_time"
            )
        }
        for row in missing:
            row.pk = ids[(row.cluster, row.job_id, row.submit_time)]
    return saved


def month_starts(start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """Month boundaries (00:00 of the 1st, billing time zone) strictly inside (start, end)."""
    zone = billing_zone()
    local = start.astimezone(zone)
    year, month = local.year, local.month
    points = []
    while True:
        month += 1
        if month == 13:
            year, month = year + 1, 1
        boundary = dt.datetime(year, month, 1, tzinfo=zone)
        if boundary >= end:
            return points
        points.append(boundary)


def slice_record(record: UsageRecord, book: _RateBook) -> list[UsageSlice]:
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


def _slices_replace(records: list[UsageRecord], book: _RateBook) -> int:
    """Delete and rebuild the slices of these records: two statements per 2 000 records."""
    if not records:
        return 0
    UsageSlice.objects.filter(record_id__in=[r.pk for r in records]).delete()
    slices = [s for r in records for s in slice_record(r, book)]
    UsageSlice.objects.bulk_create(slices, batch_size=BATCH)
    return len(slices)
