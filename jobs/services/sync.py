"""Syncing live jobs with Slurm: one ``queue()`` and at most one ``accounting()`` per cycle, the changes
planned in Python and applied with one conditional bulk update (live rows only)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from accounting.selectors.rollup import RUNAWAY_FIX_KIND
from accounting.services import (
    budget_holds_identify,
    budget_holds_release,
    budget_holds_tasks_settle,
    runaway_fixed,
    usage_runaway_close,
)
from jobs.arrays import (
    array_index_ranges,
    array_task_indexes,
    array_tasks_record,
    array_tasks_to_start,
    array_view,
    ended_array_record,
    ended_tasks,
    forgotten_tasks,
    group_by_array,
    tasks_without_exit_code,
)
from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState, state_from_slurm, transition_allowed
from jobs.dependencies import NEVER_SATISFIED, dependents_waiting, never_satisfied_cancel
from jobs.models import Job, JobArrayTask, JobEvent
from jobs.pending import Outlook, estimate_moved, queue_outlook
from jobs.services.output import job_logs_keep
from jobs.services.relay import _submission_for, jobs_lost_resend, relay_drain_after_commit
from portal.db import any_of, bulk_insert_copy, bulk_update, row_maker
from portal.models import SyncStatus
from portal.outbox import after_commit
from portal.services import sync_record_failure, sync_record_success
from portal.slurm import SlurmError, SlurmRejected, SlurmUnavailable, cluster_config, get_gateway
from portal.slurm.tags import SLURM_TAG_PREFIX, record_is_job, slurm_tag
from portal.unix import unix_ids

logger = logging.getLogger(__name__)

# Fields the sync reads and may write.
_SYNC_FIELDS = [
    "id", "state", "state_reason", "cancel_reason", "slurm_cluster", "slurm_job_id", "submitted_at", "started_at", "ended_at",
    "exit_code", "exit_signal", "created_at", "array", "array_tasks", "expected_start_at", "queue_position", "expected_start_moved_from",
    "gone_from_queue_at", "array_throttle", "cancel_requested_at",
]  # fmt: skip
# A job the portal has seen start: while in these states, its absence from the queue with no end in
# accounting means its controller forgot it (_forgotten_while_running)
STARTED_STATES = (JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)
# A job that ended in the queue but is not in accounting yet (slurmdbd lags a little) is left
# live for this long, so its final state and exit code come from accounting next cycle.
ACCOUNTING_GRACE_SECONDS = 120
# The sync asks sacct for the jobs that ended by id (-j) up to this many; beyond, for the whole
# window (one call either way; an argv of 5 000 ids is ~40 KB)
ACCOUNTING_BY_ID_MAX = 5000


_event = row_maker(JobEvent)  # a JobEvent's values for the COPY (10 000 jobs ending in one cycle: 2 s as bulk_create)


def jobs_sync(*, cluster: str | None = None) -> dict:
    """Bring every live job of one cluster (None: the default one) in line with that cluster's
    Slurm, in a constant number of queries and Slurm calls (one task per cluster per cycle:
    portal/project/celery.py; one cluster down leaves the others' jobs followed).

    One ``gateway.queue()``; at most one ``gateway.accounting(start, end)`` — only when a live job
    has left the queue or ended in it (for its final state and exit code), window = earliest
    submission among them .. now. Matching by Slurm id (checked by portal.slurm.tags.record_is_job,
    so an id Slurm reused after losing its state is not taken for ours) and, for ACCEPTED jobs whose relay crashed after
    sbatch, by tag (the id is adopted). Changes are computed in Python and written with one
    conditional bulk update (live rows only) and one bulk insert of events.

    Slurm unavailable: the failure is recorded (SyncStatus "jobs", another cluster's "jobs:NAME")
    and nothing changes; the next cycle catches up. Returns figures: always live, changed,
    queue_calls, accounting_calls, array_tasks, dependency_cancelled, duration_ms; with what a step
    did: resent, forgotten_* and runaway_fix* (a controller's losses), array_tasks_started,
    deleted and delete_skipped (Kubernetes), accounting_error; and error when the queue could not
    be read (then nothing else was done)."""
    started = time.monotonic()
    config = cluster_config(cluster)
    name = config.name
    kind = SyncStatus.kind_for("jobs", name)
    # the live jobs as rows of _SYNC_FIELDS (named tuples, Django's values_list(named=True)), not model
    # instances: a third of the cost at 10 000 live jobs (bench/results.md); writes go through _apply_plan
    live = list(Job.objects.filter(state__in=LIVE_STATES, cluster__name=name).values_list(*_SYNC_FIELDS, named=True))
    stats: dict[str, Any] = {"live": len(live), "changed": 0, "queue_calls": 0, "accounting_calls": 0}
    gateway = get_gateway(name)
    followed = [j for j in live if j.slurm_job_id is not None or j.state == JobState.ACCEPTED]
    # Kubernetes keeps every finished Job until someone deletes it: the portal does, so it reads them all
    ttl = settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS if config.is_kubernetes else 0
    queue_read_at = timezone.now()
    try:
        queue = gateway.queue() if followed or ttl else []
    except SlurmUnavailable as exc:
        sync_record_failure(kind, error=f"squeue: {exc}")
        return stats | {"error": str(exc)}
    stats["queue_calls"] = 1 if followed or ttl else 0
    array_ended = ended_tasks([j.id for j in followed if j.array and j.slurm_job_id is not None])
    # Kubernetes holds no array's tasks back: the next ones under its %N limit are created now
    waiting = []
    if config.is_kubernetes:
        waiting, started_stats = _array_tasks_start(gateway, followed, queue, array_ended)
        stats |= started_stats
    entries, array_tasks, need_accounting = _pair_with_queue(followed, [*queue, *waiting], array_ended)
    records, accounting_ok = {}, False
    if need_accounting:
        stats["accounting_calls"] = 1
        try:
            records = _accounting_records(gateway, need_accounting, array_tasks, array_ended, kubernetes=config.is_kubernetes)
            accounting_ok = True
        except SlurmUnavailable as exc:  # slurmdbd down: apply what the queue says, record the rest later
            stats["accounting_error"] = str(exc)

    now = timezone.now()
    planned = _plan_jobs(followed, entries, records, queue, now, accounting_ok=accounting_ok)
    stats["changed"] = _apply_plan(planned, now, cluster=name) if planned else 0
    if accounting_ok and not config.is_kubernetes:
        stats |= _controller_losses(gateway, need_accounting, entries, records, queue_read_at=queue_read_at, now=now,
                                    cluster=name)  # fmt: skip
    stats["array_tasks"] = _arrays_record(array_tasks, planned, now)
    stats["dependency_cancelled"] = _dependencies_follow(planned, entries, now)
    if ttl:
        stats["deleted"], skipped = _finished_jobs_delete(gateway, queue, cluster=name, older_than=now - dt.timedelta(seconds=ttl))
        if skipped:
            stats["delete_skipped"] = skipped
    stats["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    _sync_record(kind, stats, deletes=bool(ttl))
    return stats


# ---------------------------------------------------------------- jobs_sync's steps


def _plan_jobs(followed: list[Job], entries: dict, records: dict, queue, now: dt.datetime, *,
               accounting_ok: bool) -> dict[uuid.UUID, dict]:  # fmt: skip
    """The changes to write, by job id (jobs with none left out): _plan_job of each followed job, from
    its queue entry, its accounting record (when it is the job's) and its outlook while pending."""
    outlook = queue_outlook(queue)  # pending jobs' expected start and place: the same read, no squeue --start
    planned: dict[uuid.UUID, dict] = {}
    for job in followed:
        record = records.get(job.slurm_job_id) if job.slurm_job_id is not None else None
        if record is not None and not _is_ours(record, job):
            record = None  # a reused id (Slurm lost its state): not ours
        entry = entries.get(job.id)
        job_outlook = outlook.get(entry.job_id) if entry is not None else None
        values = _plan_job(job, entry, record, now, accounting_ok=accounting_ok, outlook=job_outlook)
        if entry is not None and job.gone_from_queue_at is not None:
            values["gone_from_queue_at"] = None  # back in the queue after all
        if values:
            planned[job.id] = values
    return planned


def _controller_losses(gateway, need_accounting: list[Job], entries: dict, records: dict, *, queue_read_at: dt.datetime,
                       now: dt.datetime, cluster: str) -> dict:  # fmt: skip
    """The jobs a Slurm controller lost when its backup took over, sent again or ended. Returns
    figures for the sync's stats."""
    # jobs a Slurm controller gave an id to and then lost (killed before its state save; its backup took
    # over without them): sent again, found by their tag first (issue 42 item 3)
    lost = _lost_in_takeover(need_accounting, entries, records, queue_read_at)
    stats: dict[str, Any] = {"resent": jobs_lost_resend(jobs=lost, now=now) if lost else 0}
    # jobs it forgot while they ran (killed on their node; accounting has their start, never an end)
    forgotten = _forgotten_while_running(need_accounting, entries, records)
    if forgotten:
        stats |= _forgotten_end(gateway, forgotten, records, queue_read_at=queue_read_at, now=now, cluster=cluster)
    return stats


def _arrays_record(array_tasks: dict, planned: dict[uuid.UUID, dict], now: dt.datetime) -> int:
    """The array tasks seen this cycle stored, and the budget holds of the arrays that ended in it
    settled. Returns the task rows written."""
    written = array_tasks_record(array_tasks) if array_tasks else 0
    ended_arrays = [job_id for job_id, values in planned.items() if job_id in array_tasks and values.get("state") in TERMINAL_STATES]
    if ended_arrays:
        _array_holds_settle(ended_arrays, now)
    return written


def _dependencies_follow(planned: dict[uuid.UUID, dict], entries: dict, now: dt.datetime) -> int:
    """The jobs that wait for others: relayed when one they wait for ended this cycle, cancelled when
    Slurm will never start them. Returns how many were cancelled."""
    # jobs waiting in the portal for a job that ended (Kubernetes holds none itself): their relay, now
    ended = [job_id for job_id, values in planned.items() if values.get("state") in TERMINAL_STATES]
    if ended and dependents_waiting(ended):
        relay_drain_after_commit()
    # jobs Slurm will never start (a job they wait for failed): cancelled, with why (jobs.dependencies)
    never = [job_id for job_id, entry in entries.items() if entry.reason == NEVER_SATISFIED]
    return never_satisfied_cancel(job_ids=never, now=now) if never else 0


def _sync_record(kind: str, stats: dict, *, deletes: bool) -> None:
    """The cycle recorded in its SyncStatus: a failure when accounting did not answer, else a success
    with its figures (``deletes``: the cycle deletes finished Kubernetes Jobs)."""
    data = {"duration_ms": stats["duration_ms"], "live": stats["live"], "changed": stats["changed"]}
    if deletes:  # said on every cycle, so a namespace that is usable again clears it
        data["namespaces_skipped"] = stats.get("delete_skipped", [])
    if "runaway_fix_error" in stats:  # ended and charged by the portal; slurmdbd still counts them running
        data["runaway_fix_error"] = stats["runaway_fix_error"]
    if "accounting_error" in stats:
        sync_record_failure(kind, error=f"sacct: {stats['accounting_error']}")
    else:
        sync_record_success(kind, data=data)


def _lost_in_takeover(need_accounting: list[Job], entries: dict, records: dict, queue_read_at: dt.datetime) -> list[Job]:
    """The jobs Slurm gave an id and no longer knows: gone from the controller's queue, which keeps
    even an ended job for MinJobAge (300 s by default), and never started according to accounting
    (no record of theirs, or one still PENDING) — what a controller killed before it saved its state
    leaves when its backup takes over (docs/reliability.md: `Vestigial state files for JobId=…, but no
    job record`). Only ids known JOB_LOST_AFTER_SECONDS before the queue was read (a job submitted
    while the read was under way is not in it yet). Array jobs are left alone (their tasks leave the
    queue one by one)."""
    before = queue_read_at - dt.timedelta(seconds=settings.JOB_LOST_AFTER_SECONDS)
    lost = []
    for job in need_accounting:
        if job.slurm_job_id is None or job.array or job.id in entries or job.submitted_at is None or job.submitted_at > before:
            continue
        record = records.get(job.slurm_job_id)
        if record is not None and not _is_ours(record, job):
            record = None  # another job under a reused id
        # sacct shows a pending job's Start as when it may start: PENDING without an end never ran; nor
        # did a COMPLETED one without a start (a runaway pending record that `sacctmgr` fixed)
        if record is None or (record.end_time is None and state_from_slurm(record.state) == JobState.PENDING) or (
            record.start_time is None and state_from_slurm(record.state) == JobState.COMPLETED
        ):
            lost.append(job)
    return lost


def _forgotten_while_running(need_accounting: list[Job], entries: dict, records: dict) -> list[Job]:
    """The jobs the portal saw start that the controller's queue no longer shows while accounting has
    no end for them (a record started and not ended — slurmdbd's "runaway" —, one that never
    started, or none): what a controller killed just after starting them, before its state save,
    leaves when its backup takes over without them (the node's slurmd then has them killed as
    unknown). A job that ended normally stays in the queue for MinJobAge (300 s by default) and has
    its end in accounting by then. Array jobs are left alone."""
    forgotten = []
    for job in need_accounting:
        if job.slurm_job_id is None or job.array or job.id in entries or job.state not in STARTED_STATES:
            continue
        record = records.get(job.slurm_job_id)
        if record is not None and not _is_ours(record, job):
            record = None  # another job under a reused id: ours is not in accounting
        if record is None or record.end_time is None:
            forgotten.append(job)
    return forgotten


def _forgotten_end(gateway, forgotten: list[Job], records: dict, *, queue_read_at: dt.datetime, now: dt.datetime,
                   cluster: str) -> dict:  # fmt: skip
    """What the sync does with the jobs _forgotten_while_running found. A job first missed is marked
    (``gone_from_queue_at``, one UPDATE); one missed for JOB_LOST_AFTER_SECONDS is ended, in one
    transaction: FAILED, its reason saying the controller forgot it, ``ended_at`` where Slurm's own
    fix of a runaway puts its end — its start (accounting.services.runaway_fixed: so the job, its usage,
    sacct and sreport say the same whoever fixes it, the portal or an operator); its usage closed at
    that (usage_runaway_close: the ingestion's upsert, which converts and releases its budget hold;
    never charged as running until now), or its hold released when accounting has no start of it.
    Then Slurm's fix (gateway.runaway_jobs_fix, ``sacctmgr -i show runawayjobs``), outside the
    transaction; without the AdminLevel it needs the portal's figures stand alone and the failure
    is reported. Returns figures for the sync's stats."""
    unmarked = [job.id for job in forgotten if job.gone_from_queue_at is None]
    if unmarked:
        Job.objects.filter(pk__in=unmarked, gone_from_queue_at__isnull=True).update(gone_from_queue_at=queue_read_at)
    before = queue_read_at - dt.timedelta(seconds=settings.JOB_LOST_AFTER_SECONDS)
    due = {job.id: job.slurm_job_id for job in forgotten if job.gone_from_queue_at is not None and job.gone_from_queue_at <= before}
    stats: dict[str, Any] = {"forgotten_seen": len(unmarked), "forgotten_ended": 0}
    if not due:
        return stats
    runaways = {}
    with transaction.atomic():
        rows = [job for job in Job.objects.select_for_update().filter(pk__in=list(due), state__in=STARTED_STATES)
                .only(*_SYNC_FIELDS) if job.slurm_job_id == due[job.pk]]  # fmt: skip
        events = []
        for job in rows:
            record = records.get(job.slurm_job_id)
            if (record is not None and record.start_time is not None and record.end_time is None
                    and state_from_slurm(record.state) in STARTED_STATES and _is_ours(record, job)):  # fmt: skip
                runaways[job.pk] = record
            end = runaway_fixed(record).end_time if job.pk in runaways else (job.started_at or queue_read_at)
            job.state, job.ended_at, job.exit_code = JobState.FAILED, end, None
            job.state_reason = (f"Slurm's controller forgot job {job.slurm_job_id} while it ran (a failover before its state "
                                "was saved) and had it killed on its node; Slurm's accounting ends it at its start: nothing is charged")  # fmt: skip
            events.append(_event(job_id=job.pk, state=job.state, reason=job.state_reason, at=now))
            logger.warning("job %s: Slurm job %s forgotten by its controller while running; ended", job.pk, job.slurm_job_id)
        if not rows:
            return stats
        bulk_update(Job, rows, ["state", "state_reason", "ended_at", "exit_code"])
        bulk_insert_copy(events)
        if runaways:
            usage_runaway_close(records=list(runaways.values()), cluster=cluster, now=now)
        budget_holds_release(job_uuids=[job.pk for job in rows if job.pk not in runaways], at=now)
        after_commit("jobs.tasks.job_end_notify", [str(job.pk) for job in rows])
    stats["forgotten_ended"] = len(rows)
    if runaways:
        try:
            stats["runaway_fixed"] = len(gateway.runaway_jobs_fix())
            # slurmdbd rolls those hours up again at its next roll-up: the reconciliation waits for it
            sync_record_success(SyncStatus.kind_for(RUNAWAY_FIX_KIND, cluster), data={"jobs": stats["runaway_fixed"]})
        except SlurmError as exc:  # no Operator level (or slurmdbd gone again): sacct keeps them running
            logger.warning("sacctmgr show runawayjobs (fix) failed: %s", exc)
            stats["runaway_fix_error"] = str(exc)
    return stats


def _finished_jobs_delete(gateway, queue, *, cluster: str, older_than: dt.datetime) -> tuple[int, list[str]]:
    """Kubernetes (issue 41): the Jobs of this cycle's list that ended before ``older_than`` and that
    the portal has done with — its job is terminal (state, exit code read) and their final usage is
    recorded, or they never started (nothing to charge) — deleted in bulk (``gateway.jobs_delete``:
    one call per namespace, propagationPolicy Background; their pods and logs go with them), once
    their pods' logs are kept (``job_logs_keep``). An array job's Jobs (one per task, each entry with
    its own id and the array's) go together, by the array's number, once every task's has ended
    before ``older_than`` and each task's usage is final or the task never started. Two queries,
    only when some Job is old enough, and the keeping's. Returns (jobs whose Jobs were deleted,
    namespaces skipped: no right)."""
    from accounting.selectors import usage_final_job_ids

    by_number: dict[int, list] = {}  # an array's task entries under the array's number (the portal's slurm_job_id)
    for e in queue:
        by_number.setdefault(e.array_job_id if e.array_job_id is not None else e.job_id, []).append(e)
    old = {number: entries for number, entries in by_number.items()
           if all(e.end_time is not None and e.end_time <= older_than and state_from_slurm(e.state) in TERMINAL_STATES
                  for e in entries)}  # fmt: skip
    if not old:
        return 0, []
    done = set(Job.objects.filter(slurm_cluster=cluster, slurm_job_id__in=list(old), state__in=TERMINAL_STATES)
               .values_list("slurm_job_id", flat=True))  # fmt: skip
    started = [e.job_id for entries in old.values() for e in entries if e.start_time is not None]
    charged = usage_final_job_ids(cluster=cluster, job_ids=started) if started else set()
    doomed = [(entries[0].account, number) for number, entries in old.items()
              if number in done and all(e.start_time is None or e.job_id in charged for e in entries)]  # fmt: skip
    # their pods' logs (the jobs' output) kept first: a Job whose log cannot be read now stays (jobs.services.output)
    doomed, unread = job_logs_keep(gateway=gateway, cluster=cluster, jobs=doomed) if doomed else ([], [])
    deleted, skipped = gateway.jobs_delete(doomed) if doomed else (0, [])
    return deleted, unread + skipped


def _array_tasks_start(gateway, followed: list[Job], queue, array_ended: dict) -> tuple[list, dict]:
    """Kubernetes (issue 41): the ``%N`` limit of its live array jobs, which no scheduler enforces there
    (each task is a Job the portal creates; the submission created the first N). From this cycle's
    one list of Jobs: the tasks to start now (jobs.arrays.array_tasks_to_start: at most N unfinished,
    never a task the portal recorded as ended, cancelled alone, or saw held once), created
    through the submission's create (gateway.array_tasks_start: named after the job and the task, so a
    create retried is that Job); none for a job whose cancel was asked for. Returns (queue rows for the
    tasks not held by the scheduler yet — still waiting: PENDING, reason JobArrayTaskLimit, as squeue
    shows a throttled array's record; created now: PENDING — added to the cycle's queue, so the job
    shows every task; figures for the stats). A job none of whose Jobs is held (deleted: a cancel, an
    admin) gets none, and its accounting says what became of it — unless the portal cancelled one of its
    tasks alone (the only one running, its Job gone): the next one is started. One query of the tasks
    cancelled alone or held once (never started again), one of the jobs whose tasks start (their
    stored requests), and two afterwards for a cancel asked for meanwhile (the whole job's, or that
    task's: its relay is sent again); no API call but the creates."""
    throttled = [j for j in followed if j.array and j.array_throttle and j.slurm_job_id is not None and j.cancel_requested_at is None]
    if not throttled:
        return [], {}
    # tasks never created again: cancelled alone (asked for, maybe not passed on yet, or done), or held by the
    # scheduler once (a Job of theirs was listed: their own id recorded) — a Job deleted by hand is not run twice
    cancelled: dict[uuid.UUID, set[int]] = {}
    held_once: dict[uuid.UUID, set[int]] = {}
    for job_id, index, asked, state, own_id in JobArrayTask.objects.filter(job_id__in=[j.id for j in throttled]).filter(
        Q(cancel_requested_at__isnull=False) | Q(state=JobState.CANCELLED) | Q(slurm_job_id__isnull=False)
    ).values_list("job_id", "index", "cancel_requested_at", "state", "slurm_job_id"):
        if asked is not None or state == JobState.CANCELLED:
            cancelled.setdefault(job_id, set()).add(index)
        if own_id is not None:
            held_once.setdefault(job_id, set()).add(index)
    by_array = group_by_array(queue)
    rows_out: list = []
    starts: dict[uuid.UUID, tuple[Job, list[int]]] = {}
    for job in throttled:
        rows = [r for r in by_array.get(job.slurm_job_id, []) if _is_ours(r, job)]
        done = set(array_ended.get(job.id, {})) | cancelled.get(job.id, set()) | held_once.get(job.id, set())
        if not rows and not cancelled.get(job.id):
            continue
        listed = {int(r.array_tasks): state_from_slurm(r.state) or JobState.PENDING for r in rows}
        start, waiting = array_tasks_to_start(array_task_indexes(job), job.array_throttle, listed, done)
        if start:
            starts[job.id] = (job, start)
        if rows:  # squeue's record of an array's tasks not started: the array's id, the indexes
            base = dataclasses.replace(rows[0], job_id=job.slurm_job_id, state="PENDING", nodes="", start_time=None,
                                       end_time=None)  # fmt: skip
            rows_out += [dataclasses.replace(base, array_tasks=array_index_ranges(indexes), reason=reason)
                         for indexes, reason in ((waiting, "JobArrayTaskLimit"), (start, "None")) if indexes]  # fmt: skip
    stats: dict[str, Any] = {"array_tasks_started": 0}
    if not starts:
        return rows_out, stats
    started: dict[uuid.UUID, list[int]] = {}
    for full in Job.objects.filter(pk__in=list(starts)).select_related("submitter"):
        indexes = starts[full.pk][1]
        try:
            gateway.array_tasks_start(_submission_for(full, ensure_dirs=False), indexes)
        except SlurmRejected as exc:
            logger.warning("job %s: array tasks %s not started: %s", full.pk, indexes, exc.message)
            continue
        except SlurmUnavailable as exc:  # the next cycle tries again
            stats["array_tasks_error"] = str(exc)
            break
        started[full.pk] = indexes
        stats["array_tasks_started"] += len(indexes)
    if started:  # a cancel asked for while they were created: sent again, so nothing created outlives it
        for job_id in Job.objects.filter(pk__in=list(started), cancel_requested_at__isnull=False).values_list("pk", flat=True):
            after_commit("jobs.tasks.job_cancel_relay", str(job_id))
        for job_id, index in JobArrayTask.objects.filter(job_id__in=list(started), cancel_requested_at__isnull=False).values_list("job_id", "index"):
            if index in started[job_id] and index not in cancelled.get(job_id, set()):
                after_commit("jobs.tasks.job_array_task_cancel_relay", str(job_id), index)
    return rows_out, stats


def _is_ours(record, job: Job) -> bool:
    """Whether a queue entry or accounting record found by the job's Slurm id is the job's
    (portal.slurm.tags.record_is_job: its tag, or no comment and submitted while the portal sent it)."""
    return record_is_job(record, job_id=job.id, sent_after=job.created_at, id_known_at=job.submitted_at)


def _pair_with_queue(followed: list[Job], queue, array_ended: dict) -> tuple[dict, dict, list[Job]]:
    """Each followed job's queue entry (by Slurm id, checked by record_is_job so an id Slurm reused
    after losing its state is not taken for ours; an ACCEPTED job whose relay crashed after sbatch: by its
    tag, the id adopted; an array job: its rows folded into one, jobs.arrays). Returns (entries by
    job id, the array tasks seen by job id, the jobs that need accounting: gone from the queue,
    ended there, or array tasks the queue no longer shows)."""
    in_queue = {e.job_id: e for e in queue if e.array_job_id is None}
    in_arrays = group_by_array(queue)
    tagged = {e.comment: e for e in queue if e.comment.startswith(SLURM_TAG_PREFIX)}
    entries: dict[uuid.UUID, Any] = {}
    array_tasks: dict[uuid.UUID, dict] = {}
    need_accounting: list[Job] = []
    for job in followed:
        tag = slurm_tag(job.id)
        if job.slurm_job_id is None:
            entry = tagged.get(tag)  # ACCEPTED, relay crashed after sbatch: adopt the id
            if entry is not None and entry.array_job_id is not None:
                entry = dataclasses.replace(entry, job_id=entry.array_job_id)
        else:
            tasks_missing = False
            if job.array:
                rows = [r for r in in_arrays.get(job.slurm_job_id, []) if _is_ours(r, job)]
                entry, array_tasks[job.id] = array_view(job, rows, kind="queue", known=array_ended.get(job.id))
                # tasks the queue no longer shows (cancelled while pending, or ended long ago): accounting has them
                tasks_missing = len(set(array_tasks[job.id]) | set(array_ended.get(job.id, {}))) < job.array_tasks
            else:
                entry = in_queue.get(job.slurm_job_id)
            if entry is not None and not _is_ours(entry, job):
                entry = None  # a reused id (Slurm lost its state): not ours
            if entry is None or tasks_missing or state_from_slurm(entry.state) in TERMINAL_STATES:
                need_accounting.append(job)
        if entry is not None:
            entries[job.id] = entry
    return entries, array_tasks, need_accounting


def _accounting_records(gateway, need_accounting: list[Job], array_tasks: dict, array_ended: dict, *,
                        kubernetes: bool = False) -> dict[int, Any]:  # fmt: skip
    """ONE accounting read for the jobs that need it (sacct -j those jobs, unless so many that the
    window read is the cheaper one; window = the earliest submission among them .. now): each job's
    final record by Slurm id, an array's folded from its tasks once every task has ended (its tasks
    added to ``array_tasks``). Raises SlurmUnavailable (slurmdbd down)."""
    start = min((j.submitted_at or j.created_at) for j in need_accounting) - dt.timedelta(minutes=5)
    ids = {j.slurm_job_id for j in need_accounting if j.slurm_job_id is not None}
    rows = gateway.accounting(start, timezone.now(), job_ids=ids if len(ids) <= ACCOUNTING_BY_ID_MAX else None)
    records = _records_by_id(rows, {j.slurm_job_id: j for j in need_accounting if j.slurm_job_id is not None})
    for job in need_accounting:
        if job.array and job.slurm_job_id is not None:
            array_rows = group_by_array(rows).get(job.slurm_job_id, [])
            # tasks ended by the queue's word count as ended here too (slurmdbd may not have them yet)
            queue_ended = {i: v for i, v in array_tasks.get(job.id, {}).items() if v["state"] in TERMINAL_STATES}
            known = {**array_ended.get(job.id, {}), **queue_ended}
            whole = records.get(job.slurm_job_id)
            forgotten = not array_rows and whole is not None and state_from_slurm(whole.state) in TERMINAL_STATES
            if forgotten:
                array_rows = forgotten_tasks(job, whole, known)  # Kubernetes: its tasks' Jobs deleted (a cancel)
            record, done = array_view(job, array_rows, kind="accounting", known=known)
            # Kubernetes: the Jobs are gone for good (slurmdbd only lags: its task records come later)
            gone = forgotten and kubernetes
            if gone and not array_rows:  # every task had ended already: the array has
                record = ended_array_record(job, whole, known)
            array_tasks.setdefault(job.id, {}).update(done)
            # one task's raw row is not the array's; the array has ended once every task has
            records.pop(job.slurm_job_id, None)
            # (a gone array's missing exit codes never come: the Jobs that held them are deleted)
            if record is not None and state_from_slurm(record.state) in TERMINAL_STATES:
                if gone or _array_final(record, {**known, **array_tasks[job.id]}):
                    records[job.slurm_job_id] = record
    return records


def _records_by_id(rows, jobs_by_id: dict[int, Job]) -> dict[int, Any]:
    """One record per Slurm id: where an id has several (Slurm gave it again after a controller lost
    its state: the first may be our job's runaway, the second another job), the one that is the portal
    job's (_is_ours), else the latest submitted."""
    records: dict[int, Any] = {}
    oldest = dt.datetime.min.replace(tzinfo=dt.UTC)
    for r in rows:
        if r.array_job_id is not None:
            continue
        current, job = records.get(r.job_id), jobs_by_id.get(r.job_id)
        if current is None:
            records[r.job_id] = r
            continue
        mine, current_mine = job is not None and _is_ours(r, job), job is not None and _is_ours(current, job)
        if (mine and not current_mine) or (mine == current_mine and (r.submit_time or oldest) >= (current.submit_time or oldest)):
            records[r.job_id] = r
    return records


def _array_holds_settle(job_ids: list, now: dt.datetime) -> None:
    """Array jobs that ended this cycle: their budget holds expect only the tasks that started
    (those cancelled while pending never use anything), so the hold ends with the last task's final
    usage record (accounting.services.budget_holds_tasks_settle). One query, plus the service's."""
    ran = dict(
        Job.objects.filter(pk__in=job_ids, state__in=TERMINAL_STATES)
        .annotate(ran=Count("array_task_rows", filter=Q(array_task_rows__started_at__isnull=False)))
        .values_list("pk", "ran")
    )
    budget_holds_tasks_settle(ran=ran, at=now)


def _array_final(record, tasks: dict[int, dict]) -> bool:
    """An array whose tasks have all ended is final once accounting has every ended task's exit
    code, or ACCOUNTING_GRACE_SECONDS after its end (a task slurmdbd never records stays without)."""
    if not tasks_without_exit_code(tasks):
        return True
    return record.end_time is None or (timezone.now() - record.end_time).total_seconds() >= ACCOUNTING_GRACE_SECONDS


def _clean_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    return "" if reason in ("None", "(null)") else reason[:1024]


def _plan_job(job: Job, entry, record, now: dt.datetime, *, accounting_ok: bool, outlook: Outlook | None = None) -> dict:
    """The field values to write for one job, from its queue entry and/or accounting record
    (empty dict: nothing changes). Accounting wins once the job has ended (final state, exit code).
    ``outlook``: its expected start and place while pending (jobs.pending.queue_outlook)."""
    entry_state = state_from_slurm(entry.state) if entry is not None else None
    if record is not None and (entry is None or entry_state in TERMINAL_STATES):
        source, new_state = record, state_from_slurm(record.state)
    elif entry is not None:
        source, new_state = entry, entry_state
        if (
            new_state in TERMINAL_STATES
            and accounting_ok
            and entry.end_time is not None
            and (now - entry.end_time).total_seconds() < ACCOUNTING_GRACE_SECONDS
        ):
            return {}  # ended moments ago; accounting will have its exit code next cycle
    else:
        return {}

    values: dict[str, Any] = {}
    if job.slurm_job_id is None and entry is not None:  # adopted by tag
        values["slurm_job_id"] = entry.job_id
        values["submitted_at"] = entry.submit_time or now
        if ids := unix_ids(entry.user):  # the Unix user it runs as: the output owner check's uid
            values["unix_uid"] = ids[0]
    if new_state is not None and transition_allowed(job.state, new_state):
        values["state"] = new_state
    state = values.get("state", job.state)
    if state != job.state or new_state == job.state:  # the source speaks about the current state
        reason = _clean_reason(entry.reason) if source is entry and state in (JobState.PENDING, JobState.REQUEUED, JobState.SUSPENDED) else ""
        if state == JobState.CANCELLED and job.cancel_reason:
            reason = job.cancel_reason  # the portal's own cancel (idle GPUs): its history says why
        if reason != job.state_reason:
            values["state_reason"] = reason
    values |= _plan_outlook(job, outlook if source is entry and state in (JobState.PENDING, JobState.REQUEUED) else None)
    # a job cancelled while pending has a start time that is not one: squeue's expected start (after
    # its end: a --begin in the future), or sacct's Start = End — it never ran, and holds nothing more.
    # Start = End for a job that ended otherwise is one that ran for less than sacct's second.
    ran = source.start_time is not None and (
        source.end_time is None or source.start_time < source.end_time
        or (source.start_time == source.end_time and state != JobState.CANCELLED)
    )  # fmt: skip
    if ran and state not in (JobState.ACCEPTED, JobState.PENDING, JobState.REQUEUED) and job.started_at != source.start_time:
        values["started_at"] = source.start_time
    if state in TERMINAL_STATES:
        if job.ended_at is None:
            values["ended_at"] = source.end_time or now
        for field in ("exit_code", "exit_signal"):  # accounting's (a queue entry has neither)
            value = getattr(source, field, None)
            if value is not None and getattr(job, field) != value:
                values[field] = value
    return values


def _plan_outlook(job: Job, outlook: Outlook | None) -> dict:
    """The expected start, place and last move to write (none once the job is no longer pending).
    A move of more than START_ESTIMATE_MOVE_MINUTES keeps the estimate it moved from."""
    start, position = (outlook.expected_start, outlook.position) if outlook is not None else (None, None)
    values: dict[str, Any] = {}
    if start != job.expected_start_at:
        values["expected_start_at"] = start
        if estimate_moved(job.expected_start_at, start, threshold_minutes=settings.START_ESTIMATE_MOVE_MINUTES):
            values["expected_start_moved_from"] = job.expected_start_at
    if position != job.queue_position:
        values["queue_position"] = position
    if outlook is None and job.expected_start_moved_from is not None:
        values["expected_start_moved_from"] = None
    return values


def _moved_note(previous: dt.datetime, current: dt.datetime) -> str:
    """The history's words for a moved estimate (no clock times: the page shows them in local time)."""
    minutes = round(abs((current - previous).total_seconds()) / 60)
    hours, minutes = divmod(minutes, 60)
    amount = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    return f"Expected start moved {'later' if current > previous else 'earlier'} by {amount}"


def _apply_plan(planned: dict[uuid.UUID, dict], now: dt.datetime, *, cluster: str | None = None) -> int:
    """Write planned changes. The rows are locked and re-read in one query so a concurrent change
    (a relay recording its id, a local cancel) is neither overwritten nor contradicted; then one bulk
    update restricted to live rows (the filter is part of its WHERE) and one COPY of events."""
    # the rows with every field the plan may write (the bulk update reads each of them on every row:
    # one left deferred is a query per row — the Unix uid of an adopted job was)
    written = {"slurm_cluster"}.union(*planned.values())
    with transaction.atomic():
        fresh = {
            job.id: job
            for job in Job.objects.select_for_update()
            .filter(pk__in=any_of(planned, "uuid"), state__in=LIVE_STATES)
            .only(*_SYNC_FIELDS, *sorted(written - set(_SYNC_FIELDS)))
        }
        to_update: list[Job] = []
        events: list = []
        ended: list[str] = []
        seen_in_slurm: list[tuple] = []  # started (or adopted): their holds learn the Slurm id
        update_fields: set[str] = set()
        for job_id, values in planned.items():
            current = fresh.get(job_id)
            if current is None:
                continue  # ended meanwhile
            if "slurm_job_id" in values:
                if current.slurm_job_id is not None:
                    values = {k: v for k, v in values.items() if k not in ("slurm_job_id", "submitted_at")}
                else:
                    values["slurm_cluster"] = cluster or cluster_config().name
            if "state" in values and not transition_allowed(current.state, values["state"]):
                values = {k: v for k, v in values.items() if k != "state"}
            if not values:
                continue
            for key, value in values.items():
                setattr(current, key, value)
            update_fields.update(values)
            if ("started_at" in values or "slurm_job_id" in values) and current.slurm_job_id is not None:
                seen_in_slurm.append((job_id, current.slurm_cluster or cluster or cluster_config().name, current.slurm_job_id,
                                      current.submitted_at))  # fmt: skip
            to_update.append(current)
            if values.get("expected_start_moved_from") is not None and current.expected_start_at is not None:
                note = _moved_note(values["expected_start_moved_from"], current.expected_start_at)
                events.append(_event(job_id=job_id, state=current.state, reason=note, at=now))
            if "state" in values:
                events.append(_event(job_id=job_id, state=values["state"], reason=values.get("state_reason", ""), at=now))
                if values["state"] in TERMINAL_STATES:
                    ended.append(str(job_id))
        if to_update:
            bulk_update(Job, to_update, sorted(update_fields))  # the rows locked above
            bulk_insert_copy(events)
            # ended without ever starting (cancelled while pending, …): its hold holds nothing any more;
            # a job that ran keeps it until the usage ingestion converts it
            never_ran = [job.id for job in to_update if job.state in TERMINAL_STATES and job.started_at is None]
            budget_holds_release(job_uuids=never_ran, at=now)
            # running usage comes without the job's tag (sacct fills Comment at the end): match it by id
            budget_holds_identify(jobs=seen_in_slurm)
        if ended:

            after_commit("jobs.tasks.job_end_notify", ended)
    return len(to_update)
