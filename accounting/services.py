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
from portal.db import any_of, bulk_insert_copy, bulk_upsert_copy
from portal.models import SyncStatus, Team
from portal.services import audit_record, sync_record_failure, sync_record_success
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
    "gpu_seconds", "gpu_hours", "requested_gpu_hours", "provisional", "known_until", "reservation", "booking_id",
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
            _mark_jobs_accounted({r.portal_job_uuid for r in rows if r.portal_job_uuid and not r.provisional}, now)
        if high_water_mark is not None:
            mark = (status.data or {}).get("high_water_mark")
            if not mark or dt.datetime.fromisoformat(mark) < high_water_mark:
                data = {**(status.data or {}), "high_water_mark": high_water_mark.isoformat()}
                SyncStatus.objects.filter(pk=status.pk).update(data=data)
    return result


def _mark_jobs_accounted(job_uuids: set, now: dt.datetime) -> None:
    """Portal jobs whose final usage record is now stored: their estimate stops holding budget
    (jobs.Job.accounted_at; accounting.selectors._held_hours). One UPDATE."""
    if not job_uuids:
        return
    from django.apps import apps

    job_model = apps.get_model("jobs", "Job")
    job_model.objects.filter(pk__in=any_of(job_uuids, "uuid"), accounted_at__isnull=True).update(accounted_at=now)


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


def _bookings_by_reservation(names: set[str]) -> dict:
    """Booking id per Slurm reservation name (the portal's bookings only); one query."""
    if not names:
        return {}
    from accounting.models import Booking

    return dict(Booking.objects.filter(reservation_name__in=names).values_list("reservation_name", "pk"))


def _bookings_by_portal_job(uuids: set) -> dict:
    """Booking id per portal job (jobs.Job.booking_id) for jobs submitted into a booking; one query."""
    if not uuids:
        return {}
    from django.apps import apps

    job_model = apps.get_model("jobs", "Job")
    return dict(job_model.objects.filter(pk__in=uuids, booking_id__isnull=False).values_list("pk", "booking_id"))


def _build_rows(records: Sequence[AccountingRecord], *, now: dt.datetime, cluster_default: str) -> list[UsageRecord]:
    teams = dict(Team.objects.filter(slurm_account__in={r.account for r in records}).values_list("slurm_account", "pk"))
    users = _users_by_unix_name({r.user for r in records if r.user})
    bookings = _bookings_by_reservation({r.reservation for r in records if r.reservation})
    # sacct 22.05 leaves Reservation empty (it keeps only ReservationId): portal jobs name their booking
    job_bookings = _bookings_by_portal_job({u for r in records if not r.reservation and (u := _portal_job_uuid(r.comment))})
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
            reservation=(r.reservation or "")[:64],
            booking_id=bookings.get(r.reservation or "") or job_bookings.get(_portal_job_uuid(r.comment)),
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


_KNOWN_UNTIL = RECORD_FIELDS.index("known_until")
_PROVISIONAL = RECORD_FIELDS.index("provisional")


def _comparable(values: tuple) -> tuple:
    """RECORD_FIELDS' values as compared: decimals to six places, and a running record's reading
    time left out (it always moves; its other figures decide)."""
    out = [value.quantize(SIX) if isinstance(value, Decimal) else value for value in values]
    if values[_PROVISIONAL]:
        del out[_KNOWN_UNTIL]
    return tuple(out)


def _changed_rows(rows: list[UsageRecord]) -> list[UsageRecord]:
    """Rows that are new or differ from what is stored (one query, read as tuples: no model
    instances for the stored side)."""
    clusters = {r.cluster for r in rows}
    existing = {
        (cluster, job_id, submit_time): _comparable(tuple(values))
        for cluster, job_id, submit_time, *values in UsageRecord.objects.filter(
            cluster__in=clusters, job_id__in=any_of({r.job_id for r in rows}, "bigint")
        ).values_list("cluster", "job_id", "submit_time", *RECORD_FIELDS)
    }
    changed = []
    for row in rows:
        old = existing.get((row.cluster, row.job_id, row.submit_time))
        if old is None or old != _comparable(tuple(getattr(row, name) for name in RECORD_FIELDS)):
            changed.append(row)
    return changed


def _upsert(rows: list[UsageRecord]) -> list[UsageRecord]:
    """Insert or update the records by (cluster, job_id, submit_time); each row gets its id."""
    bulk_upsert_copy(
        rows,
        unique_fields=["cluster", "job_id", "submit_time"],
        update_fields=[f.removesuffix("_id") if f in ("team_id", "user_id", "booking_id") else f for f in RECORD_FIELDS],
    )
    return rows


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
        if record.booking_id and settings.BOOKING_CHARGE_MODE == "reserved":
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


def _slices_replace(records: list[UsageRecord], book: _RateBook) -> int:
    """Delete and rebuild the slices of these records: one DELETE, one COPY."""
    if not records:
        return 0
    UsageSlice.objects.filter(record_id__in=[r.pk for r in records]).delete()
    return bulk_insert_copy([s for r in records for s in slice_record(r, book)])


# ---------------------------------------------------------------- bookings
#
# Capacity rule: at no instant may the APPROVED bookings of a GPU type hold more GPUs than the
# available nodes of that type have (NodeInfo: available=True, gpus_total, as sync_cluster last read
# them). REQUESTED bookings hold nothing; they are checked when made (so a hopeless request is refused
# at once) and again, under the lock, when an admin approves them. The check is the PEAK of the
# overlapping bookings' load over the window (a sweep over their start/end events), made under a
# per-GPU-type transaction-scoped advisory lock, so two bookings of the same type never both pass.
# On Slurm releases that cannot reserve GPU counts (22.05) a booking is whole nodes: the nodes are
# chosen in the same locked transaction among nodes of the type that no overlapping approved booking
# holds, so the node choice and the capacity check always agree.

BOOKING_LOCK_NAMESPACE = 0x6270  # "bp": first key of pg_advisory_xact_lock(int, int)
BOOKING_PAST_GRACE = dt.timedelta(minutes=5)  # a window may start this much before now (form latency)


def _booking_lock(gpu_type: str) -> None:
    """Serialise capacity decisions for one GPU type until the transaction ends."""
    import zlib

    from django.db import connection

    if connection.vendor != "postgresql":
        return  # SQLite (the demo) serialises writing transactions anyway
    key = zlib.crc32(gpu_type.encode()) - 2**31  # signed 32-bit
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [BOOKING_LOCK_NAMESPACE, key])


def bookings_whole_nodes() -> bool:
    """True when bookings must be whole nodes (the gateway cannot reserve GPU counts). The gateway's
    own answer (one ``sinfo --version``, cached by the gateway); whole nodes when Slurm is unreachable
    (the safe choice: whole-node bookings work on every release)."""
    choice = getattr(settings, "BOOKING_RESERVE_WHOLE_NODES", "auto")
    if choice in ("yes", "no"):
        return choice == "yes"
    try:
        return not get_gateway().reservations_support_gpu_counts
    except SlurmError:
        return True


@dataclass(frozen=True)
class TypeCapacity:
    """Bookable GPUs of one type: the available nodes that have them."""

    gpu_type: str
    nodes: tuple  # NodeInfo rows, by name
    gpus_total: int
    gpus_per_node: int  # the smallest node's GPUs: the unit of whole-node bookings


def type_capacity(gpu_type: str) -> TypeCapacity:
    from portal.models import NodeInfo

    nodes = tuple(NodeInfo.objects.filter(gpu_type=gpu_type, available=True, gpus_total__gt=0).order_by("name"))
    return TypeCapacity(
        gpu_type=gpu_type,
        nodes=nodes,
        gpus_total=sum(n.gpus_total for n in nodes),
        gpus_per_node=min((n.gpus_total for n in nodes), default=0),
    )


def booking_load_steps(bookings, *, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime, int]]:
    """The GPUs the bookings hold over [start, end), as consecutive (from, to, gpus) steps covering
    the whole range (a sweep over their clipped start/end events). Steps with equal load are merged."""
    events: dict[dt.datetime, int] = {start: 0, end: 0}
    for booking in bookings:
        lo, hi = max(booking.start, start), min(booking.end, end)
        if hi <= lo:
            continue
        events[lo] = events.get(lo, 0) + booking.gpus
        events[hi] = events.get(hi, 0) - booking.gpus
    points = sorted(events)
    steps: list[tuple[dt.datetime, dt.datetime, int]] = []
    load = 0
    for a, b in zip(points, points[1:]):
        load += events[a]
        if steps and steps[-1][2] == load and steps[-1][1] == a:
            steps[-1] = (steps[-1][0], b, load)
        else:
            steps.append((a, b, load))
    return steps


def _approved_overlapping(gpu_type: str, start: dt.datetime, end: dt.datetime, *, exclude=None):
    from accounting.models import Booking, BookingStatus

    queryset = Booking.objects.filter(gpu_type=gpu_type, status=BookingStatus.APPROVED, start__lt=end, end__gt=start)
    if exclude is not None:
        queryset = queryset.exclude(pk=exclude)
    return list(queryset.only("pk", "gpus", "start", "end", "nodes"))


def _window_text(a: dt.datetime, b: dt.datetime) -> str:
    zone = billing_zone()
    a, b = a.astimezone(zone), b.astimezone(zone)
    end_format = "%H:%M" if a.date() == b.date() else "%Y-%m-%d %H:%M"
    return f"{a:%Y-%m-%d %H:%M}–{b.strftime(end_format)} {a.tzname()}"


def _capacity_check(*, gpu_type: str, gpus: int, start: dt.datetime, end: dt.datetime, exclude=None) -> list[str]:
    """Raise Conflict (409) naming the first window where ``gpus`` more would exceed the bookable
    GPUs of the type; returns the nodes to reserve (whole-node mode) or []. Call under _booking_lock."""
    capacity = type_capacity(gpu_type)
    overlapping = _approved_overlapping(gpu_type, start, end, exclude=exclude)
    for a, b, load in booking_load_steps(overlapping, start=start, end=end):
        if load + gpus > capacity.gpus_total:
            # widen to the whole stretch where this booking does not fit
            stretch_end = b
            for c, d, more in booking_load_steps(overlapping, start=b, end=end):
                if more + gpus <= capacity.gpus_total:
                    break
                stretch_end = d
            message = f"{gpu_type}: {load} of {capacity.gpus_total} GPUs already booked {_window_text(a, stretch_end)}"
            if load < capacity.gpus_total:
                message += f" (only {capacity.gpus_total - load} free)"
            raise Conflict(message, errors={"start": [message], "gpus": [message]})
    if not bookings_whole_nodes():
        return []
    taken = {name for booking in overlapping for name in (booking.nodes or [])}
    free = [n for n in capacity.nodes if n.name not in taken]
    free.sort(key=lambda n: (n.gpus_allocated > 0, n.name))  # idle nodes first
    chosen, covered = [], 0
    for node in free:
        if covered >= gpus:
            break
        chosen.append(node.name)
        covered += node.gpus_total
    if covered < gpus:
        message = (
            f"{gpu_type}: GPUs are free at every moment of {_window_text(start, end)}, but not {gpus} on whole nodes "
            "free for the whole window; shorten or split the booking"
        )
        raise Conflict(message, errors={"start": [message], "gpus": [message]})
    return sorted(chosen)


def _validate_booking_input(*, team: Team | None, gpu_type: str, gpus, start, end, now: dt.datetime) -> tuple[str, int]:
    errors: dict[str, list[str]] = {}
    if team is None:
        errors["team"] = ["No such team."]
    elif not team.active:
        errors["team"] = [f"Team {team.name} is inactive."]
    gpu_type = (gpu_type or "").strip()
    capacity = type_capacity(gpu_type) if gpu_type else None
    if not gpu_type:
        errors["gpu_type"] = ["This field is required."]
    elif not capacity.nodes:
        from portal.models import NodeInfo

        known = sorted(set(NodeInfo.objects.filter(gpus_total__gt=0).exclude(gpu_type="").values_list("gpu_type", flat=True)))
        errors["gpu_type"] = [f"No available {gpu_type} GPUs on the cluster (types: {', '.join(known) or 'none'})."]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        errors["gpus"] = ["Give a whole number of GPUs, at least 1."]
    elif capacity is not None and capacity.nodes:
        if gpus > capacity.gpus_total:
            errors["gpus"] = [f"The cluster has {capacity.gpus_total} bookable {gpu_type} GPUs."]
        elif bookings_whole_nodes() and gpus % capacity.gpus_per_node:
            errors["gpus"] = [
                f"must be a multiple of {capacity.gpus_per_node} (whole nodes) on this cluster: "
                f"Slurm here reserves whole {gpu_type} nodes of {capacity.gpus_per_node} GPUs."
            ]
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, dt.datetime) or timezone.is_naive(value):
            errors[name] = ["Give a date and time with a time zone."]
    if "start" not in errors and "end" not in errors:
        if end <= start:
            errors["end"] = ["The end must be after the start."]
        elif end - start < dt.timedelta(minutes=settings.BOOKING_MIN_MINUTES):
            errors["end"] = [f"Book at least {settings.BOOKING_MIN_MINUTES} minutes."]
        elif end - start > dt.timedelta(days=settings.BOOKING_MAX_DAYS):
            errors["end"] = [f"Book at most {settings.BOOKING_MAX_DAYS} days at once."]
        if start < now - BOOKING_PAST_GRACE:
            errors["start"] = ["The window must not start in the past."]
    if errors:
        first = next(iter(errors.values()))[0]
        name = next(iter(errors))
        raise ApplicationError(f"The booking cannot be made: {name} {first}", errors=errors)
    return gpu_type, gpus


def _lock_team(team: Team | None) -> None:
    """Lock the team row until the transaction ends: the first lock of booking_create/booking_approve,
    taken in the same order as budget_hold_check (team, then anything else), so that a booking and a
    job submission of one team are serialised and never both spend the last of its budget."""
    if team is not None:
        Team.objects.select_for_update().filter(pk=team.pk).first()


def _booking_budget_check(*, team: Team, gpu_type: str, gpus: int, start: dt.datetime, end: dt.datetime,
                          now: dt.datetime) -> None:  # fmt: skip
    """Refuse (Conflict, 409, with the figures) a booking whose reserved GPU-hours do not fit the
    team's budget. When bookings are charged by their reserved hours (BOOKING_CHARGE_MODE=reserved),
    an approved booking's GPU-hours count as "booked" against every quota that applies — the any-type
    quota and its GPU type's — each for the part of the window inside the quota's period
    (accounting.selectors.budget_rows). The quotas in force at the start, and at each quota period
    boundary inside the window, are checked. Without an applicable quota at the start,
    QUOTA_NO_QUOTA_POLICY decides, as for jobs — unless the team has a quota now and the booking
    starts on a later day whose period has none yet (a manager books next month before its quota
    is approved). Call under the team row lock (_lock_team)."""
    from accounting.models import Quota, QuotaState
    from accounting.selectors import billing_date, billing_midnight, budget_rows, quotas_effective

    if _setting("BOOKING_CHARGE_MODE", "reserved") != "reserved":
        return  # only use is charged: jobs in the booking meet the budget when they are submitted
    points = {start}
    bounds = Quota.objects.filter(team=team, state=QuotaState.APPROVED, period_start__lte=billing_date(end),
                                  period_end__gt=billing_date(start)).values_list("period_start", "period_end")  # fmt: skip
    for first, last in bounds:
        for day in (first, last):
            if start < (moment := billing_midnight(day)) < end:
                points.add(moment)
    def in_force_at(moment):
        return [q for (_, kind), q in quotas_effective(team=team, at=moment).items() if kind in ("", gpu_type)]

    applicable: dict[int, object] = {}
    for moment in sorted(points):
        in_force = in_force_at(moment)
        if moment == start and not in_force:
            if _setting("QUOTA_NO_QUOTA_POLICY", "blocked") == "unlimited":
                return
            if billing_date(start) > billing_date(now) and in_force_at(now):
                # budgeted now, no quota yet for the booking's (later) period: nothing to check it
                # against; its hours count as booked against the quota approved for that period
                continue
            message = (
                f"{team.slug} has no approved GPU quota covering {gpu_type} GPUs on {billing_date(start):%Y-%m-%d}: "
                f"a team manager can request one at {QUOTA_PAGE}"
            )
            raise Conflict(message, errors={"team": [message]})
        applicable.update((q.pk, q) for q in in_force)
    for row in budget_rows(sorted(applicable.values(), key=lambda q: (q.period_start, q.gpu_type)), at=now):
        quota = row["quota"]
        lo = max(start, billing_midnight(quota.period_start))
        hi = min(end, billing_midnight(quota.period_end))
        if hi <= lo:
            continue
        needs = Decimal(gpus * int((hi - lo).total_seconds())) / HOUR
        if needs > row["remaining"]:
            kind = f"{row['gpu_type']} " if row["gpu_type"] else ""
            left = max(row["remaining"], Decimal(0))
            message = (
                f"Over budget: the booking needs {_gh(needs)} GPU-h; {_gh(left)} of {_gh(row['budget'])} {kind}GPU-h "
                f"left for {team.slug} in {row['period_label']} (used {_gh(row['used'])}, held by unfinished jobs "
                f"{_gh(row['held'])}, booked {_gh(row['booked'])})."
            )
            hint = f"The booking needs {_gh(needs)} GPU-h (GPUs × window); {_gh(left)} {kind}GPU-h are left."
            raise Conflict(message, errors={"gpus": [hint], "end": ["Book fewer GPUs or a shorter window."]})


def _enqueue_booking_task(task_name: str, booking_id) -> None:
    from accounting import tasks

    task = getattr(tasks, task_name)

    def publish():
        from kombu.exceptions import OperationalError as BrokerError

        try:
            task.delay(str(booking_id))
        except BrokerError as exc:  # booking_cleanup_task picks it up later
            logger.warning("booking %s: %s not enqueued (broker unavailable: %s)", booking_id, task_name, exc)

    transaction.on_commit(publish)


def booking_create(
    *, team: Team | None, gpu_type: str, gpus: int, start: dt.datetime, end: dt.datetime, note: str = "",
    actor, request=None, now: dt.datetime | None = None,
):  # fmt: skip
    """Book ``gpus`` GPUs of ``gpu_type`` for the team over [start, end). The team's managers and
    admins may book. Bookings of at most BOOKING_AUTO_APPROVE_GPU_HOURS GPU-hours (and every booking an
    admin makes) are approved at once and reserved in Slurm after commit; larger ones wait for an
    admin (``booking_approve``). ApplicationError (400) on bad input, Conflict (409) naming the window
    when the GPUs are not free."""
    from accounting.models import Booking, BookingStatus, ReservationState
    from portal.roles import is_admin, is_manager

    now = now or timezone.now()
    if team is not None and not (is_admin(actor) or is_manager(actor, team)):
        raise ApplicationError(
            "Only the team's managers and admins may book GPUs.",
            errors={"team": [f"You are not a manager of team {team.name}."]}, status_code=403,
        )  # fmt: skip
    gpu_type, gpus = _validate_booking_input(team=team, gpu_type=gpu_type, gpus=gpus, start=start, end=end, now=now)
    start = max(start, now)  # a window starting within the grace period starts now
    booking_id = uuid.uuid4()
    booking = Booking(
        id=booking_id, team=team, gpu_type=gpu_type, gpus=gpus, start=start, end=end, note=(note or "")[:200],
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
        reservation_name=Booking.reservation_name_for(booking_id),
    )  # fmt: skip
    auto = is_admin(actor) or booking.gpu_hours <= Decimal(settings.BOOKING_AUTO_APPROVE_GPU_HOURS)
    with transaction.atomic():
        # lock order: the team row (as budget_hold_check does for job submissions), then the type
        _lock_team(team)
        _booking_lock(gpu_type)
        nodes = _capacity_check(gpu_type=gpu_type, gpus=gpus, start=start, end=end)
        _booking_budget_check(team=team, gpu_type=gpu_type, gpus=gpus, start=start, end=end, now=now)
        if auto:
            booking.status = BookingStatus.APPROVED
            booking.auto_approved = True
            booking.approved_at = booking.decided_at = now
            booking.nodes = nodes
            booking.reservation_state = ReservationState.PENDING
            booking.reservation_updated_at = now
        booking.save(force_insert=True)
        audit_record(
            actor=actor, action="booking.create", target=booking, team=team, request=request,
            data={"gpu_type": gpu_type, "gpus": gpus, "start": start.isoformat(), "end": end.isoformat(),
                  "gpu_hours": str(booking.gpu_hours), "status": booking.status, "nodes": booking.nodes},
        )  # fmt: skip
        if auto:
            _enqueue_booking_task("booking_reserve_task", booking.pk)
    return booking


def _locked_booking(booking_id):
    from accounting.models import Booking

    return Booking.objects.select_for_update().select_related("team").get(pk=booking_id)


def booking_approve(*, booking, actor, note: str = "", request=None, now: dt.datetime | None = None):
    """An admin approves a REQUESTED booking: the capacity is checked again under the type's lock
    (409 naming the window when it does not fit any more), nodes are chosen, and the Slurm reservation
    is made after commit."""
    from accounting.models import BookingStatus, ReservationState
    from portal.roles import is_admin

    if not is_admin(actor):
        raise ApplicationError("Only admins approve bookings.", status_code=403)
    now = now or timezone.now()
    with transaction.atomic():
        # lock order: the team row (as budget_hold_check does for job submissions), then the type,
        # then the booking row
        _lock_team(booking.team)
        _booking_lock(booking.gpu_type)
        booking = _locked_booking(booking.pk)
        if booking.status != BookingStatus.REQUESTED:
            raise Conflict(f"The booking is {booking.get_status_display().lower()}, not awaiting approval.",
                           errors={"status": [booking.status]})  # fmt: skip
        if booking.end <= now:
            raise Conflict("The booking's window has passed.", errors={"end": ["The window has passed."]})
        start = max(booking.start, now)
        nodes = _capacity_check(gpu_type=booking.gpu_type, gpus=booking.gpus, start=start, end=booking.end,
                                exclude=booking.pk)  # fmt: skip
        _booking_budget_check(team=booking.team, gpu_type=booking.gpu_type, gpus=booking.gpus, start=booking.start,
                              end=booking.end, now=now)  # fmt: skip
        booking.status = BookingStatus.APPROVED
        booking.approved_at = booking.decided_at = now
        booking.decided_by = actor
        booking.decision_note = (note or "")[:500]
        booking.nodes = nodes
        booking.reservation_state = ReservationState.PENDING
        booking.reservation_updated_at = now
        booking.save(update_fields=["status", "approved_at", "decided_at", "decided_by", "decision_note", "nodes", "reservation_state", "reservation_updated_at"])
        audit_record(actor=actor, action="booking.approve", target=booking, team=booking.team, request=request,
                     data={"nodes": nodes, "note": booking.decision_note})  # fmt: skip
        _enqueue_booking_task("booking_reserve_task", booking.pk)
    return booking


def booking_reject(*, booking, actor, note: str = "", request=None, now: dt.datetime | None = None):
    from accounting.models import BookingStatus
    from portal.roles import is_admin

    if not is_admin(actor):
        raise ApplicationError("Only admins reject bookings.", status_code=403)
    now = now or timezone.now()
    with transaction.atomic():
        booking = _locked_booking(booking.pk)
        if booking.status != BookingStatus.REQUESTED:
            raise Conflict(f"The booking is {booking.get_status_display().lower()}, not awaiting approval.",
                           errors={"status": [booking.status]})  # fmt: skip
        booking.status = BookingStatus.REJECTED
        booking.decided_at = now
        booking.decided_by = actor
        booking.decision_note = (note or "")[:500]
        booking.save(update_fields=["status", "decided_at", "decided_by", "decision_note"])
        audit_record(actor=actor, action="booking.reject", target=booking, team=booking.team, request=request,
                     data={"note": booking.decision_note})  # fmt: skip
    return booking


def booking_cancel(*, booking, actor, request=None, now: dt.datetime | None = None):
    """The team's managers or an admin cancel a requested or approved booking that has not ended. Its
    reservation is deleted after commit; the part of an active booking before now stays charged."""
    from accounting.models import BookingStatus, ReservationState
    from portal.roles import is_admin, is_manager

    if not (is_admin(actor) or is_manager(actor, booking.team)):
        raise ApplicationError("Only the team's managers and admins may cancel its bookings.", status_code=403)
    now = now or timezone.now()
    with transaction.atomic():
        booking = _locked_booking(booking.pk)
        if booking.status not in (BookingStatus.REQUESTED, BookingStatus.APPROVED):
            raise Conflict(f"The booking is already {booking.get_status_display().lower()}.", errors={"status": [booking.status]})
        if booking.end <= now:
            raise Conflict("The booking has ended.", errors={"end": ["The booking has ended."]})
        booking.status = BookingStatus.CANCELLED
        booking.cancelled_at = now
        booking.cancelled_by = actor
        fields = ["status", "cancelled_at", "cancelled_by"]
        state = booking.reservation_state
        if state in (ReservationState.ACTIVE, ReservationState.DELETING):
            booking.reservation_state = ReservationState.DELETING
            _enqueue_booking_task("booking_unreserve_task", booking.pk)
        elif state in (ReservationState.PENDING, ReservationState.FAILED):
            booking.reservation_state = ReservationState.DELETED  # nothing in Slurm (the claim needs APPROVED)
        # CREATING: booking_reserve_run sees the cancellation after its Slurm call and deletes it
        booking.reservation_updated_at = now
        booking.save(update_fields=[*fields, "reservation_state", "reservation_updated_at"])
        audit_record(actor=actor, action="booking.cancel", target=booking, team=booking.team, request=request,
                     data={"reservation_state": booking.reservation_state})  # fmt: skip
    return booking


RESERVE_LEASE = dt.timedelta(minutes=5)


def booking_reserve_run(booking_id) -> str:
    """Make the Slurm reservation of an approved booking (what ``booking_reserve_task`` does).
    Claims PENDING → CREATING (conditional update), calls Slurm outside any transaction, records the
    outcome. Idempotent through the reservation's name: a rerun after a crash finds it in Slurm.
    Raises SlurmUnavailable (state back to PENDING) for the task to retry."""
    from accounting.models import Booking, BookingStatus, ReservationState
    from portal.slurm import ReservationSpec, SlurmRejected, SlurmUnavailable

    now = timezone.now()
    claimed = Booking.objects.filter(
        Q(reservation_state=ReservationState.PENDING)
        | Q(reservation_state=ReservationState.CREATING, reservation_updated_at__lt=now - RESERVE_LEASE),
        pk=booking_id, status=BookingStatus.APPROVED,
    ).update(reservation_state=ReservationState.CREATING, reservation_updated_at=now)  # fmt: skip
    if not claimed:
        return "not-claimed"
    booking = Booking.objects.select_related("team").get(pk=booking_id)
    if booking.end <= now:
        _reservation_state(booking, ReservationState.DELETED, "The window passed before the reservation was made.")
        return "ended"
    gateway = get_gateway()
    spec = ReservationSpec(
        name=booking.reservation_name,
        start=max(booking.start, now),
        end=booking.end,
        accounts=(booking.team.slurm_account,),
        nodes=tuple(booking.nodes),
        tres={} if booking.nodes else {f"gres/gpu:{booking.gpu_type}": booking.gpus},
        # IGNORE_JOBS: jobs already running on the nodes (or holding them by time limit) must not make
        # the reservation fail; the scheduler starts nothing new there that would overlap the window
        flags=("IGNORE_JOBS",),
    )
    try:
        gateway.reservation_create(spec)
        outcome = "created"
    except SlurmUnavailable as exc:
        _reservation_state(booking, ReservationState.PENDING, f"Slurm unavailable: {exc.message}", expect=ReservationState.CREATING)
        raise
    except SlurmRejected as exc:
        try:
            exists = any(r.name == booking.reservation_name for r in gateway.reservation_list())
        except SlurmUnavailable:
            _reservation_state(booking, ReservationState.PENDING, f"Slurm unavailable: {exc.message}", expect=ReservationState.CREATING)
            raise
        if not exists:
            _reservation_state(booking, ReservationState.FAILED, exc.message, expect=ReservationState.CREATING)
            audit_record(actor=None, action="booking.reservation_failed", target=booking, team=booking.team,
                         data={"error": exc.message[:500]})  # fmt: skip
            return "failed"
        outcome = "adopted"  # made by an earlier run that died before recording it
    _reservation_state(booking, ReservationState.ACTIVE, "", expect=ReservationState.CREATING)
    audit_record(actor=None, action="booking.reserve", target=booking, team=booking.team,
                 data={"reservation": booking.reservation_name, "nodes": booking.nodes, "outcome": outcome})  # fmt: skip
    booking.refresh_from_db(fields=["status"])
    if booking.status != BookingStatus.APPROVED:  # cancelled while Slurm was creating it
        Booking.objects.filter(pk=booking.pk, reservation_state=ReservationState.ACTIVE).update(
            reservation_state=ReservationState.DELETING, reservation_updated_at=timezone.now()
        )
        _enqueue_booking_task("booking_unreserve_task", booking.pk)
        return "cancelled"
    return outcome


def _reservation_state(booking, state: str, error: str, *, expect: str | None = None) -> bool:
    from accounting.models import Booking

    query = Booking.objects.filter(pk=booking.pk)
    if expect is not None:
        query = query.filter(reservation_state=expect)
    return bool(query.update(reservation_state=state, reservation_error=error[:4000], reservation_updated_at=timezone.now()))


def booking_unreserve_run(booking_id) -> str:
    """Delete the Slurm reservation of a cancelled (or ended) booking: DELETING → DELETED. Deleting a
    reservation that is gone is not an error, so reruns are harmless. SlurmUnavailable: retried."""
    from accounting.models import Booking, ReservationState

    booking = Booking.objects.filter(pk=booking_id, reservation_state=ReservationState.DELETING).select_related("team").first()
    if booking is None:
        return "not-claimed"
    from portal.slurm import SlurmRejected

    try:
        get_gateway().reservation_delete(booking.reservation_name)
    except SlurmRejected as exc:
        # "Requested reservation is in use": Slurm keeps a reservation while jobs run in it; it stays
        # DELETING and booking_cleanup tries again each minute (the jobs end by the booking's end)
        _reservation_state(booking, ReservationState.DELETING, exc.message, expect=ReservationState.DELETING)
        return "in-use"
    if _reservation_state(booking, ReservationState.DELETED, "", expect=ReservationState.DELETING):
        audit_record(actor=None, action="booking.unreserve", target=booking, team=booking.team,
                     data={"reservation": booking.reservation_name})  # fmt: skip
    return "deleted"


def booking_cleanup(*, now: dt.datetime | None = None) -> dict:
    """Periodic: delete reservations of cancelled and ended bookings that still exist in Slurm (one
    ``reservation_list``), retry deletions and creations left behind (broker down, worker lost)."""
    from accounting.models import Booking, BookingStatus, ReservationState
    from portal.slurm import SlurmRejected

    now = now or timezone.now()
    stale = now - dt.timedelta(minutes=1)
    done = {"deleted": 0, "marked": 0, "requeued": 0}
    # ended bookings: Slurm removes ended reservations itself; delete any left and mark them
    ended = list(Booking.objects.filter(reservation_state=ReservationState.ACTIVE, end__lte=now))
    leftover = list(Booking.objects.filter(reservation_state=ReservationState.DELETING, reservation_updated_at__lt=stale))
    if ended or leftover:
        in_slurm = {r.name for r in get_gateway().reservation_list()}
        for booking in ended + leftover:
            if booking.reservation_name in in_slurm:
                try:
                    get_gateway().reservation_delete(booking.reservation_name)
                except SlurmRejected as exc:  # jobs still run in it: next time
                    _reservation_state(booking, ReservationState.DELETING, exc.message)
                    continue
                done["deleted"] += 1
            _reservation_state(booking, ReservationState.DELETED, "", expect=booking.reservation_state)
            done["marked"] += 1
    # creations never run (enqueue lost) or stuck
    for booking_id in Booking.objects.filter(
        Q(reservation_state=ReservationState.PENDING) | Q(reservation_state=ReservationState.CREATING, reservation_updated_at__lt=now - RESERVE_LEASE),
        status=BookingStatus.APPROVED, end__gt=now,
    ).filter(Q(reservation_updated_at__isnull=True) | Q(reservation_updated_at__lt=stale)).values_list("pk", flat=True):  # fmt: skip
        from accounting.tasks import booking_reserve_task

        booking_reserve_task.delay(str(booking_id))
        done["requeued"] += 1
    return done


# ---------------------------------------------------------------- quotas
#
# A quota is a team's GPU-hour budget for a period (a calendar month by default), for any GPU type
# or one type, with an optional cap on GPUs in use at once. Managers request, admins approve or
# reject; a newer approval for the same team, type and period supersedes the older one. Approved
# quotas are enforced twice: by the portal at submission (budget_hold_check, inside job_submit's
# transaction, under a lock on the team row) and by Slurm (GrpTRESMins / GrpTRES on the team's
# account, mirrored by accounting.tasks.quota_mirror_task; quota_limit_drift / quota_limits_apply
# for slurm_reconcile; quota_period_rollover at a new period).

QUOTA_ALERT_THRESHOLDS = (80, 100)
QUOTA_PAGE = "/accounting/quotas/"
ROLLOVER_KIND = "quota-rollover"


def _quota_models():
    from accounting.models import BudgetAlert, Quota, QuotaState

    return Quota, QuotaState, BudgetAlert


def _gh(value) -> str:
    """GPU-hours for messages: one decimal place ("16.0", "3.5")."""
    return f"{Decimal(value).quantize(Decimal('0.1'), ROUND_HALF_UP)}"


def _forbidden(message: str) -> ApplicationError:
    return ApplicationError(message, status_code=403)


@transaction.atomic
def quota_request(
    *,
    team: Team,
    user,
    gpu_hours,
    gpu_type: str = "",
    period_start: dt.date | None = None,
    period_end: dt.date | None = None,
    max_gpus: int | None = None,
    justification: str = "",
    request=None,
):
    """A manager of the team (or an admin) asks for a budget. Period: the current calendar month
    unless given ([period_start, period_end), end exclusive)."""
    from accounting.selectors import current_month
    from portal.models import NodeInfo
    from portal.roles import is_admin, is_manager

    Quota, QuotaState, _ = _quota_models()
    if not (is_admin(user) or is_manager(user, team)):
        raise _forbidden(f"Only managers of {team.name} can request a quota.")
    errors: dict[str, list[str]] = {}
    default_start, default_end = current_month()
    period_start = period_start or default_start
    period_end = period_end or (default_end if period_start == default_start else next_month_of(period_start))
    if period_end <= period_start:
        errors["period_end"] = ["The period must end after it starts."]
    try:
        gpu_hours = Decimal(str(gpu_hours))
    except (ArithmeticError, ValueError, TypeError):
        gpu_hours = None
    if gpu_hours is None or not gpu_hours.is_finite() or gpu_hours < 0 or gpu_hours >= Decimal("1e10"):
        errors["gpu_hours"] = ["Give a number of GPU-hours (0 or more)."]
    if max_gpus is not None and (isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 0):
        errors["max_gpus"] = ["Give a whole number of GPUs (0 or more), or leave it empty."]
    gpu_type = (gpu_type or "").strip()
    known_types = set(NodeInfo.objects.exclude(gpu_type="").values_list("gpu_type", flat=True))
    if gpu_type and known_types and gpu_type not in known_types:
        errors["gpu_type"] = [f"Unknown GPU type {gpu_type!r} (types: {', '.join(sorted(known_types))})."]
    justification = (justification or "").strip()
    if not justification:
        errors["justification"] = ["Say what the GPU-hours are for."]
    if errors:
        first = next(iter(errors.values()))[0]
        raise ApplicationError(f"The quota cannot be requested: {first}", errors=errors)
    quota = Quota.objects.create(
        team=team, gpu_type=gpu_type, period_start=period_start, period_end=period_end, gpu_hours=gpu_hours,
        max_gpus=max_gpus, justification=justification[:5000], requested_by=user, state=QuotaState.REQUESTED,
    )  # fmt: skip
    audit_record(
        actor=user, action="quota.request", target=quota, team=team, request=request,
        data={"gpu_type": gpu_type, "period": quota.period_label, "gpu_hours": str(gpu_hours), "max_gpus": max_gpus},
    )  # fmt: skip
    return quota


def next_month_of(day: dt.date) -> dt.date:
    return dt.date(day.year + (day.month == 12), day.month % 12 + 1, 1)


def _quota_for_decision(quota_id):
    """The quota row, locked, with its team row locked first (the order budget_hold_check uses)."""
    Quota, _, _ = _quota_models()
    team_id = Quota.objects.filter(pk=quota_id).values_list("team_id", flat=True).first()
    if team_id is None:
        raise ApplicationError("No such quota.", status_code=404)
    Team.objects.select_for_update().filter(pk=team_id).first()
    return Quota.objects.select_for_update().select_related("team").get(pk=quota_id)


@transaction.atomic
def quota_approve(*, quota, user, comment: str = "", request=None):
    """An admin approves a requested quota: it takes effect now, the approved quota of the same team,
    type and period (if any) becomes SUPERSEDED, and Slurm's limits are mirrored after commit."""
    from portal.roles import is_admin

    _, QuotaState, _ = _quota_models()
    if not is_admin(user):
        raise _forbidden("Only admins can approve quotas.")
    quota = _quota_for_decision(getattr(quota, "pk", quota))
    if quota.state != QuotaState.REQUESTED:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}, not awaiting approval.",
                       errors={"state": [quota.state]})  # fmt: skip
    now = timezone.now()
    older = list(
        type(quota).objects.select_for_update().filter(
            team_id=quota.team_id, gpu_type=quota.gpu_type, period_start=quota.period_start,
            period_end=quota.period_end, state=QuotaState.APPROVED,
        )
    )  # fmt: skip
    for old in older:
        type(quota).objects.filter(pk=old.pk).update(state=QuotaState.SUPERSEDED, superseded_by=quota)
        audit_record(actor=user, action="quota.supersede", target=old, team=quota.team, request=request,
                     data={"superseded_by": quota.pk})  # fmt: skip
    type(quota).objects.filter(pk=quota.pk).update(
        state=QuotaState.APPROVED, decided_by=user, decided_at=now, approved_at=now, decision_comment=(comment or "")[:1000]
    )
    quota.refresh_from_db()
    audit_record(
        actor=user, action="quota.approve", target=quota, team=quota.team, request=request,
        data={"comment": comment or "", "gpu_hours": str(quota.gpu_hours), "gpu_type": quota.gpu_type,
              "period": quota.period_label, "max_gpus": quota.max_gpus, "superseded": [o.pk for o in older]},
    )  # fmt: skip
    _enqueue_quota_mirror(quota.team_id)
    return quota


@transaction.atomic
def quota_reject(*, quota, user, comment: str, request=None):
    """An admin rejects a requested quota, saying why."""
    from portal.roles import is_admin

    _, QuotaState, _ = _quota_models()
    if not is_admin(user):
        raise _forbidden("Only admins can reject quotas.")
    if not (comment or "").strip():
        raise ApplicationError("Say why the quota is rejected.", errors={"comment": ["Say why the quota is rejected."]})
    quota = _quota_for_decision(getattr(quota, "pk", quota))
    if quota.state != QuotaState.REQUESTED:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}, not awaiting approval.",
                       errors={"state": [quota.state]})  # fmt: skip
    type(quota).objects.filter(pk=quota.pk).update(
        state=QuotaState.REJECTED, decided_by=user, decided_at=timezone.now(), decision_comment=comment.strip()[:1000]
    )
    quota.refresh_from_db()
    audit_record(actor=user, action="quota.reject", target=quota, team=quota.team, request=request,
                 data={"comment": quota.decision_comment})  # fmt: skip
    return quota


@transaction.atomic
def quota_cancel(*, quota, user, request=None):
    """Withdraw a request (its team's managers, admins) or revoke an approved quota (admins; Slurm's
    limits are mirrored again after commit)."""
    from portal.roles import is_admin, is_manager

    _, QuotaState, _ = _quota_models()
    quota = _quota_for_decision(getattr(quota, "pk", quota))
    if quota.state == QuotaState.REQUESTED:
        allowed = is_admin(user) or is_manager(user, quota.team)
    elif quota.state == QuotaState.APPROVED:
        allowed = is_admin(user)
    else:
        raise Conflict(f"This quota is {quota.get_state_display().lower()}.", errors={"state": [quota.state]})
    if not allowed:
        raise _forbidden("You may not cancel this quota.")
    was = quota.state
    type(quota).objects.filter(pk=quota.pk).update(state=QuotaState.CANCELLED, decided_by=user, decided_at=timezone.now())
    quota.refresh_from_db()
    audit_record(actor=user, action="quota.cancel", target=quota, team=quota.team, request=request, data={"was": was})
    if was == QuotaState.APPROVED:
        _enqueue_quota_mirror(quota.team_id)
    return quota


def _enqueue_quota_mirror(team_id: int) -> None:
    from kombu.exceptions import OperationalError as BrokerError

    from accounting.tasks import quota_mirror_task

    def publish():
        try:
            quota_mirror_task.delay(team_id)
        except BrokerError as exc:  # the periodic roll-over/drift check mends it later
            logger.warning("team %s: quota mirror not enqueued (broker unavailable: %s)", team_id, exc)

    transaction.on_commit(publish)


# ---------------------------------------------------------------- enforcement in the portal


def budget_hold_check(*, team: Team, estimate, booking_id=None, at: dt.datetime | None = None) -> None:
    """Refuse (Conflict, 409) a job whose estimate does not fit the team's budget.

    Called by jobs.services.job_submit INSIDE its transaction, before the job row is inserted: the
    team row is locked (SELECT … FOR UPDATE) so concurrent submissions for one team are serialised —
    the next one sees the committed job in ``held``. For each quota that applies (the any-type quota,
    and the job's type's quota when the job asked for a type), ``estimate.gpu_hours`` must fit in
    budget − used − held − booked (accounting.selectors.budget_rows). Without an applicable approved
    quota, QUOTA_NO_QUOTA_POLICY decides (blocked: 409 asking a manager to request one). A job inside
    a booking is covered by the booking when bookings are charged by their reserved hours."""
    from accounting.selectors import budget_rows, current_month, quotas_effective

    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        effective = quotas_effective(team=team, at=at)
        if booking_id is not None and getattr(settings, "BOOKING_CHARGE_MODE", "reserved") == "reserved":
            return
        job_type = "" if getattr(estimate, "gpu_type_assumed", False) else (estimate.gpu_type or "")
        applicable = [q for key, q in effective.items() if key[1] == "" or (job_type and key[1] == job_type)]
        if not applicable:
            if getattr(settings, "QUOTA_NO_QUOTA_POLICY", "blocked") == "unlimited":
                return
            start, _ = current_month(at)
            what = "GPU quota" if not effective else f"GPU quota covering {job_type or 'any-type'} GPUs"
            message = (
                f"{team.slug} has no approved {what} for {start:%Y-%m}: a team manager can request one at {QUOTA_PAGE}"
            )
            raise Conflict(message, errors={"team": [message]})
        needs = Decimal(estimate.gpu_hours)
        for row in budget_rows(sorted(applicable, key=lambda q: q.gpu_type), at=at):
            if needs > row["remaining"]:
                kind = f"{row['gpu_type']} " if row["gpu_type"] else ""
                left = max(row["remaining"], Decimal(0))
                message = (
                    f"needs {_gh(needs)} GPU-h; {_gh(left)} of {_gh(row['budget'])} {kind}GPU-h left for "
                    f"{team.slug} in {row['period_label']} (used {_gh(row['used'])}, held by unfinished jobs "
                    f"{_gh(row['held'])}, booked {_gh(row['booked'])})"
                )
                hint = f"The job needs {_gh(needs)} GPU-h (GPUs × time limit); {_gh(left)} {kind}GPU-h are left."
                raise Conflict(
                    f"Over budget: {message}.",
                    errors={"gpus": [hint], "time_limit_minutes": ["Ask for fewer GPUs or a shorter time limit."]},
                )


# ---------------------------------------------------------------- enforcement in Slurm


def quota_expected_limits(*, team: Team, at: dt.datetime | None = None):
    """The association limits the team's quotas in force call for: GrpTRESMins gres/gpu[:type] =
    budget minutes, GrpTRES gres/gpu[:type] = the cap. No quota: no limits."""
    from accounting.selectors import quotas_effective
    from portal.slurm import AssociationLimits

    quotas = quotas_effective(team=team, at=at).values()
    return AssociationLimits(
        account=team.slurm_account,
        grp_tres_mins={q.slurm_tres: int(Decimal(q.gpu_hours) * 60) for q in quotas},
        grp_tres={q.slurm_tres: q.max_gpus for q in quotas if q.max_gpus is not None},
    )


def _managed(limits: dict) -> dict:
    return {k: v for k, v in (limits or {}).items() if k == "gres/gpu" or k.startswith("gres/gpu:")}


def _quota_teams() -> list[Team]:
    """Teams that have (or had) an approved quota: the accounts whose GPU limits the portal owns."""
    Quota, QuotaState, _ = _quota_models()
    ids = Quota.objects.filter(state__in=[QuotaState.APPROVED, QuotaState.SUPERSEDED, QuotaState.CANCELLED],
                               approved_at__isnull=False).values("team_id")  # fmt: skip
    return list(Team.objects.filter(pk__in=ids).order_by("slug"))


def _drift_of(team: Team, gateway) -> tuple[object, list[str]]:
    expected = quota_expected_limits(team=team)
    actual = gateway.association_limits_get(team.slurm_account)
    lines = []
    for label, want, have in (
        ("GrpTRESMins", expected.grp_tres_mins, _managed(actual.grp_tres_mins)),
        ("GrpTRES", expected.grp_tres, _managed(actual.grp_tres)),
    ):
        for key in sorted(set(want) | set(have)):
            if want.get(key) != have.get(key):
                lines.append(
                    f"quota limits of account {team.slurm_account}: {label} {key} is "
                    f"{have.get(key, 'unset')} in Slurm, the portal expects {want.get(key, 'unset')}"
                )
    return expected, lines


def quota_limit_drift() -> list[str]:
    """Differences between the limits the portal's quotas call for and the associations Slurm holds,
    for every team with a quota (one association_limits_get per team). For slurm_reconcile."""
    gateway = get_gateway()
    lines = []
    for team in _quota_teams():
        lines.extend(_drift_of(team, gateway)[1])
    return lines


def quota_limits_apply(*, teams: list[Team] | None = None, force: bool = False) -> list[str]:
    """Set the expected limits on every team's account that drifted (``force``: on all of them).
    Returns what was fixed. Idempotent (sacctmgr modify to the same values)."""
    Quota, QuotaState, _ = _quota_models()
    gateway = get_gateway()
    fixed = []
    for team in teams if teams is not None else _quota_teams():
        expected, lines = _drift_of(team, gateway)
        if lines or force:
            gateway.association_limits_set(expected)
            fixed.extend(f"fixed: {line}" for line in lines)
        Quota.objects.filter(team=team, state=QuotaState.APPROVED).update(slurm_mirrored_at=timezone.now())
    return fixed


def quota_period_rollover(*, at: dt.datetime | None = None) -> list[str]:
    """At a new period: reset the Slurm usage of each quota team's account (its GrpTRESMins count from
    0 again) and mirror the new period's limits. The period of a team is that of its any-type quota in
    force (or the earliest-starting typed one); a team seen for the first time is only recorded (its
    Slurm usage of the running period stays). The cluster's PriorityUsageResetPeriod=MONTHLY resets
    usage at each calendar month too; this covers non-calendar periods and a missed reset. Idempotent:
    the last period reset per account is kept in SyncStatus(kind="quota-rollover")."""
    from accounting.selectors import quotas_effective

    gateway = get_gateway()
    status, _ = SyncStatus.objects.get_or_create(kind=ROLLOVER_KIND)
    seen = dict(status.data.get("accounts", {}))
    effective = quotas_effective(at=at)
    starts: dict[int, dt.date] = {}
    for (team_id, gpu_type), quota in effective.items():
        if gpu_type == "" or team_id not in starts:
            starts[team_id] = quota.period_start if gpu_type == "" else min(starts.get(team_id, quota.period_start), quota.period_start)
    done = []
    for team in _quota_teams():
        period = starts.get(team.pk)
        key = period.isoformat() if period else ""
        previous = seen.get(team.slurm_account)
        if period and previous is not None and previous != key:
            gateway.account_usage_reset(team.slurm_account)
            done.append(f"reset usage of account {team.slurm_account} for the period from {key}")
        seen[team.slurm_account] = key
    done.extend(quota_limits_apply())
    SyncStatus.objects.filter(pk=status.pk).update(data={**status.data, "accounts": seen}, last_success_at=timezone.now(),
                                                   last_attempt_at=timezone.now())  # fmt: skip
    return done


# ---------------------------------------------------------------- alerts


def budget_alerts_check(*, team: Team | None = None, at: dt.datetime | None = None) -> list:
    """Record a BudgetAlert for each quota in force whose consumption (used + booked: what is really
    spent, not what unfinished jobs hold) reached 80 % / 100 % of its budget, once per (quota,
    threshold) — the unique constraint decides between concurrent checks — and deliver it (email to
    the team's managers, webhook) after commit. Called after every usage ingest. Returns new alerts."""
    from django.db import IntegrityError

    from accounting.selectors import budget_rows, quotas_effective

    _, _, BudgetAlert = _quota_models()
    quotas = list(quotas_effective(team=team, at=at).values())
    if not quotas:
        return []
    existing = set(BudgetAlert.objects.filter(quota__in=quotas).values_list("quota_id", "threshold"))
    created = []
    for row in budget_rows(quotas, at=at, with_held=False):
        budget = Decimal(row["budget"])
        if budget <= 0:
            continue
        for threshold in QUOTA_ALERT_THRESHOLDS:
            if row["consumed"] * 100 < budget * threshold or (row["quota"].pk, threshold) in existing:
                continue
            try:
                with transaction.atomic():
                    alert = BudgetAlert.objects.create(
                        quota=row["quota"], threshold=threshold, consumed_gpu_hours=_two_places(row["consumed"]),
                        budget_gpu_hours=budget,
                    )  # fmt: skip
                    audit_record(actor=None, action="quota.alert", target=row["quota"], team=row["team"],
                                 data={"threshold": threshold, "consumed": str(alert.consumed_gpu_hours)})  # fmt: skip
            except IntegrityError:
                continue  # another check recorded it first
            created.append(alert)
            transaction.on_commit(lambda pk=alert.pk: _enqueue_alert(pk))
    return created


def _two_places(value) -> Decimal:
    return Decimal(value).quantize(Decimal("0.01"), ROUND_HALF_UP)


def _enqueue_alert(alert_id: int) -> None:
    from kombu.exceptions import OperationalError as BrokerError

    from accounting.tasks import budget_alert_deliver_task

    try:
        budget_alert_deliver_task.delay(alert_id)
    except BrokerError as exc:
        logger.warning("budget alert %s not enqueued (broker unavailable: %s)", alert_id, exc)


def budget_alert_payload(alert) -> dict:
    quota = alert.quota
    return {
        "event": "budget.threshold",
        "team": quota.team.slug,
        "gpu_type": quota.gpu_type,
        "period": quota.period_label,
        "period_start": quota.period_start.isoformat(),
        "period_end": quota.period_end.isoformat(),
        "threshold_percent": alert.threshold,
        "budget_gpu_hours": str(alert.budget_gpu_hours),
        "consumed_gpu_hours": str(alert.consumed_gpu_hours),
        "quota_id": quota.pk,
        "at": alert.created_at.isoformat(),
    }


def budget_alert_email(*, alert_id: int) -> bool:
    """Email the team's managers once (claimed by a conditional update). Returns True when sent."""
    from django.core.mail import send_mail

    from portal.models import Membership, Role

    _, _, BudgetAlert = _quota_models()
    if BudgetAlert.objects.filter(pk=alert_id, emailed_at__isnull=True).update(emailed_at=timezone.now()) != 1:
        return False
    alert = BudgetAlert.objects.select_related("quota__team").get(pk=alert_id)
    quota, team = alert.quota, alert.quota.team
    recipients = sorted(
        set(Membership.objects.filter(team=team, role=Role.MANAGER).exclude(user__email="").values_list("user__email", flat=True))
    )
    if not recipients:
        return False
    kind = f"{quota.gpu_type} " if quota.gpu_type else ""
    subject = f"[gpuportal] {team.slug} reached {alert.threshold}% of its {kind}GPU budget for {quota.period_label}"
    body = (
        f"Team {team.name} has consumed {alert.consumed_gpu_hours} of its {alert.budget_gpu_hours} {kind}GPU-hours "
        f"for {quota.period_label} ({alert.threshold}% threshold).\n\n"
        f"Budget page: /accounting/budget/?team={team.slug}\nRequest more: {QUOTA_PAGE}\n"
    )
    try:
        send_mail(subject, body, None, recipients)
    except Exception:
        BudgetAlert.objects.filter(pk=alert_id).update(emailed_at=None)  # let a retry send it
        raise
    return True


def budget_alert_webhook(*, alert_id: int) -> bool:
    """POST the alert as JSON to the team's alert_webhook_url (if any). Raises on failure (the task
    retries with backoff); does nothing once delivered."""
    import json
    import urllib.request

    _, _, BudgetAlert = _quota_models()
    alert = BudgetAlert.objects.select_related("quota__team").get(pk=alert_id)
    url = alert.quota.team.alert_webhook_url
    if not url or alert.webhook_delivered_at is not None:
        return False
    data = json.dumps(budget_alert_payload(alert)).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json",
                                                                          "User-Agent": "gpuportal"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as response:  # an http(s) URLField
            response.read(1024)
    except Exception as exc:
        BudgetAlert.objects.filter(pk=alert_id).update(webhook_error=str(exc)[:2000])
        raise
    BudgetAlert.objects.filter(pk=alert_id).update(webhook_delivered_at=timezone.now(), webhook_error="")
    return True
