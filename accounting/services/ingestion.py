"""Usage ingestion from slurmdbd.

Usage ingestion reads ``gateway.accounting(start, end)`` once per window for every job of the cluster
(portal jobs and direct sbatch alike) and upserts one ``UsageRecord`` per started allocation plus its
``UsageSlice`` rows (one per calendar month and rate: accounting.services.repricing). Each cluster is
read on its own (its gateway, its high-water mark, its team accounts; ``cluster`` None: the default
one), so one cluster down stops only its own ingestion. The high-water mark lives in
``SyncStatus(kind="usage").data`` (another cluster's: "usage:NAME", SyncStatus.kind_for); each window starts ``ACCOUNTING_INGEST_OVERLAP_SECONDS``
before it, or earlier when a recent provisional (running) record has not been re-read since. Records
whose values did not change are not written again, so re-ingesting a window is a no-op.

A Kubernetes cluster (issue 41) is read the same way: its gateway's ``accounting`` is the portal's
Jobs and their pods (GPU-seconds from each pod's start and end × its GPUs), one record per Job keyed
as sacct's (the Job's number and creation time); a record whose Job went is closed by
``_vanished_close``.

Portal jobs' usage moves from their budget holds to the teams' used figures in the same transaction
(accounting.services.budget.budget_holds_convert), and the teams' running totals move by what the
records written count minus what the readings they replace counted (budget_used_change): accounting's
own rows, nothing of the jobs app."""

from __future__ import annotations

import dataclasses
import datetime as dt
import operator
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from accounting.models import Booking, BudgetHold, UsageRecord
from accounting.rates import RateBook
from accounting.services.budget import budget_holds_convert, budget_used_change
from accounting.services.repricing import slices_replace
from portal import money
from portal.db import any_of, bulk_upsert_copy, row_maker
from portal.models import SyncStatus
from portal.selectors import team_ids_by_account
from portal.services import sync_record_failure, sync_record_success
from portal.slurm import AccountingRecord, SlurmError, cluster_config, get_gateway
from portal.slurm.tags import record_is_job
from portal.slurm.tags import tagged_job_id as _portal_job_uuid  # the tag's one owner

USAGE_KIND = "usage"
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED", "SIGNALING"}

# Fields of UsageRecord written by an upsert (everything but the key and first_seen_at)
RECORD_FIELDS = (
    "start_time", "end_time", "state", "name", "account", "team_id", "unix_user", "user_id", "partition",
    "num_nodes", "comment", "portal_job_uuid", "gpus", "gpu_type", "elapsed_seconds", "time_limit_minutes",
    "gpu_seconds", "gpu_hours", "requested_gpu_hours", "provisional", "known_until", "reservation", "booking_id",
)  # fmt: skip


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


def usage_window_start(*, now: dt.datetime, cluster: str | None = None) -> dt.datetime:
    """Where the next window of a cluster starts: the high-water mark minus the overlap, earlier when
    a recent provisional record was last read before that, and a backfill period back on the first run."""
    name = cluster_config(cluster).name
    overlap = dt.timedelta(seconds=settings.ACCOUNTING_INGEST_OVERLAP_SECONDS)
    status = SyncStatus.objects.filter(kind=SyncStatus.kind_for(USAGE_KIND, name)).first()
    mark = (status.data or {}).get("high_water_mark") if status else None
    if mark:
        start = dt.datetime.fromisoformat(mark) - overlap
    else:
        start = now - dt.timedelta(days=settings.ACCOUNTING_INGEST_BACKFILL_DAYS)
    max_age = dt.timedelta(days=settings.ACCOUNTING_PROVISIONAL_MAX_AGE_DAYS)
    oldest = UsageRecord.objects.filter(cluster=name, provisional=True, known_until__gt=now - max_age).aggregate(
        at=Min("known_until")
    )["at"]
    if oldest is not None and oldest - overlap < start:
        start = oldest - overlap
    return start


def usage_ingest(
    *, cluster: str | None = None, since: dt.datetime | None = None, now: dt.datetime | None = None
) -> IngestResult:
    """Read one cluster's accounting (None: the default cluster's) since its high-water mark (or
    ``since``) up to now and record it. One ``gateway.accounting`` call per window (windows are at
    most ACCOUNTING_INGEST_WINDOW_DAYS long; the periodic run has one). Raises SlurmError after
    recording the failure in that cluster's SyncStatus."""
    config = cluster_config(cluster)
    name = config.name
    kind = SyncStatus.kind_for(USAGE_KIND, name)
    now = now or timezone.now()
    start = since if since is not None else usage_window_start(now=now, cluster=name)
    step = dt.timedelta(days=settings.ACCOUNTING_INGEST_WINDOW_DAYS)
    gateway = get_gateway(name)
    result = IngestResult(window_start=start, window_end=now)
    began = time.monotonic()
    window_start = start
    seen: set[int] = set()  # the jobs read (Kubernetes: one whose Job is gone is closed after the windows)
    while window_start < now:
        window_end = min(window_start + step, now)
        try:
            records = gateway.accounting(window_start, window_end)
        except SlurmError as exc:
            sync_record_failure(kind, error=f"{type(exc).__name__}: {exc.message}")
            raise
        partial = usage_records_upsert(records=records, now=now, high_water_mark=window_end, cluster=name)
        seen.update(r.job_id for r in records if _started(r))
        result.read += partial.read
        result.started += partial.started
        result.written += partial.written
        result.slices += partial.slices
        result.windows.append((window_start, window_end))
        window_start = window_end
    if config.is_kubernetes:
        try:
            result.written += _vanished_close(gateway=gateway, cluster=name, seen=seen, now=now)
        except SlurmError as exc:
            sync_record_failure(kind, error=f"{type(exc).__name__}: {exc.message}")
            raise
    result.seconds = time.monotonic() - began
    sync_record_success(
        kind,
        at=timezone.now(),
        data={"last_window_start": start.isoformat(), "last_read": result.read, "last_written": result.written,
              "last_seconds": round(result.seconds, 3)},
    )  # fmt: skip
    return result


def usage_records_upsert(
    *, records: Sequence[AccountingRecord], now: dt.datetime | None = None, high_water_mark: dt.datetime | None = None,
    cluster: str | None = None,
) -> IngestResult:
    """Upsert accounting records and their slices in bulk: a fixed number of queries whatever the
    number of records (teams, users, rates, existing rows, upsert, slice delete, slice insert — each
    one query per 2 000 rows). Serialised by a lock on the SyncStatus row, so two ingestions never
    interleave. Advances the high-water mark (never backwards) when one is given. ``records`` are
    one cluster's (None: the default cluster's): its name where sacct gives none, its team accounts."""
    now = now or timezone.now()
    result = IngestResult(window_start=now, window_end=now, read=len(records))
    cluster_default = cluster_config(cluster).name
    started = [r for r in records if _started(r)]
    result.started = len(started)

    with transaction.atomic():
        status, _ = SyncStatus.objects.get_or_create(kind=SyncStatus.kind_for(USAGE_KIND, cluster_default))
        status = SyncStatus.objects.select_for_update().get(pk=status.pk)
        if started:
            rows = _build_rows(started, now=now, cluster_default=cluster_default)
            changed, replaced = _changed_rows(rows)
            # the running totals these records count in, and what the stored readings they replace
            # counted there: the totals move by the difference (budget_used_change)
            used = budget_used_change(
                team_ids={r.team_id for r in changed} | {old[_TEAM] for old in replaced.values()},
                since=min([r.start_time for r in changed] + [old[_START] for old in replaced.values()], default=None),
                record_ids=replaced,
            )  # fmt: skip
            if changed:
                saved = _upsert(changed)
                result.written = len(saved)
                result.slices = slices_replace(saved, RateBook.load({r.gpu_type for r in saved if r.gpus}))
            budget_holds_convert(job_uuids={r.portal_job_uuid for r in rows if r.portal_job_uuid}, used=used,
                                 record_ids=[r.pk for r in changed], at=now)  # fmt: skip
        if high_water_mark is not None:
            mark = (status.data or {}).get("high_water_mark")
            if not mark or dt.datetime.fromisoformat(mark) < high_water_mark:
                data = {**(status.data or {}), "high_water_mark": high_water_mark.isoformat()}
                SyncStatus.objects.filter(pk=status.pk).update(data=data)
    return result


# What ``sacctmgr show runawayjobs`` sets when it fixes a runaway (Slurm's default EndState).
RUNAWAY_END_STATE = "COMPLETED"


def runaway_fixed(record: AccountingRecord) -> AccountingRecord:
    """A runaway record (started, no end: its controller forgot the job) as Slurm's own fix leaves it:
    ``sacctmgr show runawayjobs`` (sacctmgr(1), RunawayJobs) sets the end "to the latest of the job's
    start, eligible, and submit times" — its start: nothing ran, as far as slurmdbd and sreport will
    ever say — and the state to completed."""
    end = max(record.start_time, record.submit_time or record.start_time)
    return dataclasses.replace(record, state=RUNAWAY_END_STATE, end_time=end,
                               elapsed_seconds=int((end - record.start_time).total_seconds()))  # fmt: skip


def usage_runaway_close(*, records: Sequence[AccountingRecord], cluster: str | None = None,
                        now: dt.datetime | None = None) -> IngestResult:  # fmt: skip
    """Record the final usage of jobs Slurm forgot while they ran (the jobs sync decides which:
    jobs.services.sync): each runaway record closed as Slurm's fix closes it (``runaway_fixed``),
    through the ingestion's one upsert (usage_records_upsert: the same rows, slices, money and hold
    conversion as every record). Idempotent; the later readings of a closed record — still running
    (no fix), or fixed by ``sacctmgr`` (the same figures) — change nothing (_changed_rows)."""
    closed = [runaway_fixed(r) for r in records
              if r.start_time is not None and r.end_time is None and r.state.split(" ")[0] in RUNNING_STATES]  # fmt: skip
    return usage_records_upsert(records=closed, now=now, cluster=cluster)


def _started(record: AccountingRecord) -> bool:
    """Jobs that never started used nothing and get no record. Slurm gives a job cancelled while
    pending Start = End and no allocated TRES: that is "never started" too."""
    if record.start_time is None or record.submit_time is None:
        return False
    if record.end_time is not None and record.end_time <= record.start_time and not record.alloc_tres:
        return False
    return True


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
    return dict(Booking.objects.filter(reservation_name__in=names).values_list("reservation_name", "pk"))


def _bookings_by_portal_job(uuids: set) -> dict:
    """Booking id per portal job for jobs submitted into a booking (their budget hold names it); one query."""
    if not uuids:
        return {}
    return dict(BudgetHold.objects.filter(job_uuid__in=any_of(uuids, "uuid"), booking_id__isnull=False).values_list("job_uuid", "booking_id"))


def _slurm_key(record: AccountingRecord, cluster_default: str) -> tuple[str, int]:
    """(cluster, the job's Slurm id as the portal knows it: an array task's array id)."""
    return record.cluster or cluster_default, record.array_job_id or record.job_id


def _holds_by_slurm_job(records: Sequence[AccountingRecord], cluster_default: str) -> dict[tuple[str, int], BudgetHold]:
    """The open budget hold that knows each untagged record's cluster and Slurm id (a running job:
    sacct fills Comment only at its end), by that key; whether the record is that hold's job is
    portal.slurm.tags.record_is_job's word (_portal_job). One query (index budgethold_slurm_job)."""
    wanted = {_slurm_key(r, cluster_default) for r in records if not r.comment}
    if not wanted:
        return {}
    rows = BudgetHold.objects.filter(
        released_at__isnull=True, slurm_cluster__in={c for c, _ in wanted}, slurm_job_id__in=sorted({j for _, j in wanted})
    ).only("job_uuid", "slurm_cluster", "slurm_job_id", "created_at", "slurm_id_known_at")
    return {(hold.slurm_cluster, hold.slurm_job_id): hold for hold in rows if (hold.slurm_cluster, hold.slurm_job_id) in wanted}


def _portal_job(record: AccountingRecord, holds: dict[tuple[str, int], BudgetHold], cluster_default: str) -> uuid.UUID | None:
    """The portal job a record is: its tag's, or the job of the open hold with its Slurm id when
    record_is_job says the record is that job's (not a job that reuses the id)."""
    tagged = _portal_job_uuid(record.comment)
    if tagged or record.comment:
        return tagged
    hold = holds.get(_slurm_key(record, cluster_default))
    if hold is None or not record_is_job(record, job_id=hold.job_uuid, sent_after=hold.created_at, id_known_at=hold.slurm_id_known_at):
        return None
    return hold.job_uuid


_new_record = row_maker(UsageRecord)  # UsageRecord's values as a plain row for the COPY, not a model instance


def _build_rows(records: Sequence[AccountingRecord], *, now: dt.datetime, cluster_default: str) -> list:
    teams = team_ids_by_account(cluster=cluster_default, accounts={r.account for r in records})
    users = _users_by_unix_name({r.user for r in records if r.user})
    bookings = _bookings_by_reservation({r.reservation for r in records if r.reservation})
    # sacct leaves a running job's Comment (the portal's tag) empty until it ends: the open hold the
    # jobs app told its Slurm id (budget_holds_identify) names its portal job
    holds = _holds_by_slurm_job(records, cluster_default)
    portal_jobs = [_portal_job(r, holds, cluster_default) for r in records]
    # sacct 22.05 leaves Reservation empty (it keeps only ReservationId): portal jobs name their booking
    job_bookings = _bookings_by_portal_job({u for r, u in zip(records, portal_jobs) if not r.reservation and u})
    rows: dict[tuple, UsageRecord] = {}
    for r, portal_job in zip(records, portal_jobs):
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
        row = _new_record(
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
            portal_job_uuid=portal_job,
            reservation=(r.reservation or "")[:64],
            booking_id=bookings.get(r.reservation or "") or job_bookings.get(portal_job),
            gpus=gpus,
            gpu_type=r.gpu_type,
            elapsed_seconds=max(r.elapsed_seconds, 0),
            time_limit_minutes=r.time_limit_minutes,
            gpu_seconds=gpu_seconds,
            gpu_hours=money.stored(money.gpu_hours(gpu_seconds)),
            requested_gpu_hours=money.stored(money.gpu_hours(requested_seconds)),
            provisional=running,
            known_until=now if running else end,
            first_seen_at=now,
        )
        rows[(row.cluster, row.job_id, row.submit_time)] = row  # last one wins on duplicates
    return list(rows.values())


_KNOWN_UNTIL = RECORD_FIELDS.index("known_until")
_PROVISIONAL = RECORD_FIELDS.index("provisional")
_record_values = operator.attrgetter(*RECORD_FIELDS)  # a row's RECORD_FIELDS values, as a tuple


def _same_reading(old: tuple, new: tuple) -> bool:
    """Whether two readings' RECORD_FIELDS values say the same: equal (a Decimal compares by value:
    the stored six places equal the reading's), or both running and equal but for the reading time
    (a running record's ``known_until`` always moves; its other figures decide)."""
    if old == new:
        return True
    return bool(old[_PROVISIONAL] and new[_PROVISIONAL]) and (
        old[:_KNOWN_UNTIL] + old[_KNOWN_UNTIL + 1:] == new[:_KNOWN_UNTIL] + new[_KNOWN_UNTIL + 1:]
    )


_PORTAL_JOB = RECORD_FIELDS.index("portal_job_uuid")
_TEAM = RECORD_FIELDS.index("team_id")
_START = RECORD_FIELDS.index("start_time")


def _changed_rows(rows: list[UsageRecord]) -> tuple[list[UsageRecord], dict[int, tuple]]:
    """Rows that are new or differ from what is stored, and the stored readings they replace (their
    RECORD_FIELDS values by record id) — one query, read as tuples: no model instances for the
    stored side. Two rules about what a later reading may change:

    - **A final record stays final.** A running reading of an allocation whose record is final is a
      runaway (slurmdbd has its start and no end: its controller forgot it in a takeover, and sacct's
      Elapsed for it is "until now" for ever): the stored figures are kept, never charged up to now
      (usage_runaway_close closed it; docs/reliability.md, "Jobs a takeover controller forgot"). It is
      also a reading taken before the end and written after it: an ingestion that read a Kubernetes
      Job while the portal's cancel deleted it and recorded what ran up to the Job's deletion as
      final (jobs.services.cancel) — written, it would undercut that charge, and with the Job gone
      nothing would correct it (tests/k8s/test_kubernetes_output.py).
    - **A portal job once identified stays identified.** A reading without the tag (sacct fills Comment
      only at a normal end; a runaway fixed by ``sacctmgr`` never gets one) and without an open hold to
      name it keeps the portal job the stored record names: same cluster, id and submit time, same
      allocation. The row passed in is given it (it is the row stored and compared)."""
    clusters = {r.cluster for r in rows}
    existing = {
        (cluster, job_id, submit_time): (pk, tuple(values))
        for pk, cluster, job_id, submit_time, *values in UsageRecord.objects.filter(
            cluster__in=clusters, job_id__in=any_of({r.job_id for r in rows}, "bigint")
        ).values_list("pk", "cluster", "job_id", "submit_time", *RECORD_FIELDS)
    }
    changed, replaced = [], {}
    for row in rows:
        pk, old = existing.get((row.cluster, row.job_id, row.submit_time), (None, None))
        if old is None:
            changed.append(row)
            continue
        if row.provisional and not old[_PROVISIONAL]:
            continue  # a runaway's running reading after its end was recorded
        if row.portal_job_uuid is None and old[_PORTAL_JOB] is not None:
            row.portal_job_uuid = old[_PORTAL_JOB]
        if not _same_reading(old, _record_values(row)):
            changed.append(row)
            replaced[pk] = old
    return changed, replaced


def _upsert(rows: list[UsageRecord]) -> list[UsageRecord]:
    """Insert or update the records by (cluster, job_id, submit_time); each row gets its id."""
    bulk_upsert_copy(
        rows,
        unique_fields=["cluster", "job_id", "submit_time"],
        update_fields=[f.removesuffix("_id") if f in ("team_id", "user_id", "booking_id") else f for f in RECORD_FIELDS],
    )
    return rows



def _vanished_close(*, gateway, cluster: str, seen: set[int], now: dt.datetime) -> int:
    """Kubernetes keeps no accounting (issue 41): a Job the API no longer has (deleted by hand; the
    portal's own cancel records what ran up to the deletion itself: jobs.services.cancel) or whose
    pod is gone (the Job controller deletes a pod past the Job's deadline) leaves no reading of its
    end. Its running record (provisional, not refreshed by this ingestion's reading) is closed through
    the same upsert as every record: at the Job controller's verdict when the Job is still there, else
    at its last reading (``known_until``: the last time the API showed its pod running — up to one
    ingestion period, 60 s, goes uncharged rather than a guess charged). One more accounting read,
    by id, only when a record is left open (the gateway's lists are cluster-wide: a Job they do not
    show is gone). Returns the records written."""
    open_rows = list(UsageRecord.objects.filter(cluster=cluster, provisional=True).exclude(job_id__in=seen))
    if not open_rows:
        return 0
    since = min(r.submit_time for r in open_rows)
    verdicts = {r.job_id: r for r in gateway.accounting(since, now, job_ids={r.job_id for r in open_rows})}
    closed = []
    for row in open_rows:
        verdict = verdicts.get(row.job_id)
        if verdict is None or verdict.state in RUNNING_STATES or verdict.state == "PENDING":
            continue  # still there, or not known to be gone: the next reading decides
        gone = verdict.submit_time is None  # no Job any more: its last reading is what is known
        end = max(row.known_until if gone else (verdict.end_time or row.known_until), row.start_time)
        tres = {"gres/gpu": row.gpus, **({f"gres/gpu:{row.gpu_type}": row.gpus} if row.gpu_type and row.gpus else {})}
        closed.append(AccountingRecord(
            job_id=row.job_id, name=row.name, user=row.unix_user, account=row.account, partition=row.partition,
            state=verdict.state, exit_code=verdict.exit_code, exit_signal=verdict.exit_signal, submit_time=row.submit_time,
            start_time=row.start_time,
            end_time=end, elapsed_seconds=int((end - row.start_time).total_seconds()),
            time_limit_minutes=row.time_limit_minutes, num_nodes=row.num_nodes, nodes="", alloc_tres=tres, req_tres=tres,
            comment=row.comment, reservation=row.reservation, cluster=row.cluster,
        ))  # fmt: skip
    return usage_records_upsert(records=closed, now=now, cluster=cluster).written if closed else 0
