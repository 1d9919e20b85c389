"""Relaying ACCEPTED jobs to Slurm, exactly once: claim / lease / release (a conditional update with a
token), the stored request of a job as the gateway gets it, and ONE relay: the batched relay (one job is a batch of one:
job_relay_run) and the drain (the group commit of submits, on the batched relay's machinery). Slurm
is called outside any transaction; every state change is a conditional UPDATE on the row."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from accounting.services import budget_holds_release
from jobs.choices import JobState
from jobs.dependencies import dependency_option, parents_of, relay_ready_sql
from jobs.models import Job, JobEvent
from jobs.workdirs import cluster_username, submit_dir_ensure
from portal.db import json_rows, model_columns, model_from_row
from portal.models import Cluster, Profile
from portal.outbox import after_commit_coalesced, coalesced_done, coalesced_hold, publish
from portal.slurm import JobRequest, JobSubmission, NotPermitted, SlurmRejected, SlurmUnavailable, get_gateway

logger = logging.getLogger(__name__)


# A relay's claim on a job (``relay_started_at``, with its token) expires this long after it was taken
# or last renewed. The relay renews it (one UPDATE of its claims) every RELAY_LEASE_RENEW_SECONDS while it
# works — a round of a few sbatch calls ends before the first renewal is due and costs none — and starts
# no sbatch that could outlive the lease as last renewed (_Lease.start_by): so a claim that expired is a
# dead relay's, or one's that could not renew and starts nothing more, and another relay may take its
# jobs (looking their tags up first). A host that dies holds its jobs for at most this long (it was a
# fixed 120 s, longer than the task's hard time limit, before renewals).
RELAY_LEASE_SECONDS = 30
RELAY_LEASE_RENEW_SECONDS = 5
RELAY_SOFT_TIME_LIMIT = 60
RELAY_HARD_TIME_LIMIT = 90


def relay_lease_seconds() -> int:
    """The lease: RELAY_LEASE_SECONDS, or longer where SLURM_TIMEOUT needs it — an sbatch may start up
    to a renewal period after the last renewal and must end within the lease, so the lease is at least
    SLURM_TIMEOUT + two renewal periods + 2 s (27 s with the default SLURM_TIMEOUT of 15 s)."""
    return max(RELAY_LEASE_SECONDS, settings.SLURM_TIMEOUT + 2 * RELAY_LEASE_RENEW_SECONDS + 2)


def _lease_free() -> Q:
    return Q(relay_started_at__isnull=True) | Q(relay_started_at__lt=timezone.now() - dt.timedelta(seconds=relay_lease_seconds()))


class _Lease:
    """One relay run's claims (its token) and how long they are sure to hold. ``renewed``: the
    time.monotonic() taken just before the claim's or the last renewal's UPDATE (so the stored lease is
    never earlier than this process believes). ``renew_if_due`` (the run's own thread, between its Slurm
    calls) renews every RELAY_LEASE_RENEW_SECONDS: ONE UPDATE of the rows still claimed with the
    token; a renewal that fails (the database failing over) leaves ``start_by`` where it was, so the
    run starts no sbatch past the lease other relays see."""

    def __init__(self, token: uuid.UUID, *, claimed_at: float):
        self.token, self.renewed, self.renewals = token, claimed_at, 0
        self.seconds = relay_lease_seconds()

    def start_by(self) -> float:
        """The last time.monotonic() at which an sbatch may start: it ends (SLURM_TIMEOUT, plus 2 s) within the lease."""
        return self.renewed + self.seconds - settings.SLURM_TIMEOUT - 2

    def renew_if_due(self) -> None:
        at = time.monotonic()
        if at - self.renewed < RELAY_LEASE_RENEW_SECONDS:
            return
        try:
            Job.objects.filter(relay_token=self.token, state=JobState.ACCEPTED, slurm_job_id__isnull=True).update(
                relay_started_at=timezone.now()
            )
        except DatabaseError as exc:
            logger.warning("relay lease %s not renewed: %s", self.token, exc)
            return
        self.renewed = at
        self.renewals += 1


def _claim(job_ids: list) -> tuple[uuid.UUID, list[Job]]:
    """Claim for one relay run, with one token, every job among ``job_ids`` that is ACCEPTED, has no
    Slurm id, no live lease and no parent still waiting for its Slurm id (jobs.dependencies) (ONE
    conditional update: two runs cannot both win a job; relay_attempts + 1), and read them back with
    their submitter, profile and cluster in the same statement (_claim_statement). Returns (the
    token, the jobs claimed)."""
    return _claim_jobs(ids=[uuid.UUID(str(job_id)) for job_id in job_ids])


def _claim_jobs(*, ids: list | None = None, limit: int | None = None) -> tuple[uuid.UUID, list[Job]]:
    """_claim (``ids``) or _claim_waiting (``limit``): ONE statement, in autocommit (its own
    transaction), that claims and returns the claimed rows (_claim_statement)."""
    token, now = uuid.uuid4(), timezone.now()
    params = {"token": token, "now": now, "expired": now - dt.timedelta(seconds=relay_lease_seconds())}
    params |= {"ids": ids} if ids is not None else {"limit": limit}
    with connection.cursor() as cursor:
        cursor.execute(_claim_statement(waiting=ids is None), params)
        rows = cursor.fetchall()
    return token, [_claimed_job(row) for row in rows]


_CLAIM_STATEMENTS: dict[bool, str] = {}


def _claim_statement(*, waiting: bool) -> str:
    """The claim as one plain SQL statement, its text made once per process (PostgreSQL then runs it
    prepared; Django compiled the ORM's UPDATE with its sub-select and EXISTS, then the read of the
    claimed jobs with their submitter, profile and cluster, for every drain round: 67 % of the
    worker's CPU per round, bench/results.md, "the POST's CPU (nineteenth session)"):
    ``WITH c AS (UPDATE jobs_job SET relay_token, relay_started_at, relay_attempts + 1 WHERE <the
    claim's condition> RETURNING *) SELECT c.*, the submitter's, profile's and cluster's columns
    FROM c JOIN …``. The condition: ACCEPTED, no Slurm id, no live lease (_lease_free's rule:
    ``relay_started_at`` NULL or older than the lease), jobs.dependencies.relay_ready_sql; ``waiting``
    (the drain): the oldest ``limit`` such jobs, ``FOR UPDATE SKIP LOCKED`` in the sub-select; else
    those among ``ids``."""
    made = _CLAIM_STATEMENTS.get(waiting)
    if made is None:
        user = get_user_model()
        jobs, users, profiles, clusters = (model._meta.db_table for model in (Job, user, Profile, Cluster))
        condition = (f"j.state = '{JobState.ACCEPTED}' AND j.slurm_job_id IS NULL "
                     f"AND (j.relay_started_at IS NULL OR j.relay_started_at < %(expired)s) AND {relay_ready_sql('j')}")  # fmt: skip
        claim = "SET relay_token = %(token)s, relay_started_at = %(now)s, relay_attempts = j.relay_attempts + 1"
        if waiting:
            where = f"{jobs}.id IN (SELECT j.id FROM {jobs} j WHERE {condition} ORDER BY j.created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
            update = f"UPDATE {jobs} {claim.replace('j.relay_attempts', f'{jobs}.relay_attempts')} WHERE {where} RETURNING *"
        else:
            update = f"UPDATE {jobs} j {claim} WHERE j.id = ANY(%(ids)s) AND {condition} RETURNING j.*"
        columns = ", ".join(model_columns(model, alias) for model, alias in ((Job, "c"), (user, "u"), (Profile, "p"), (Cluster, "k")))
        made = _CLAIM_STATEMENTS[waiting] = (
            f"WITH c AS ({update}) SELECT {columns} FROM c JOIN {users} u ON u.id = c.submitter_id "
            f"LEFT JOIN {profiles} p ON p.user_id = u.id JOIN {clusters} k ON k.id = c.cluster_id ORDER BY c.created_at DESC"
        )
    return made


def _claimed_job(row) -> Job:
    """A row of the claim (_claim_statement's columns) as the Job with its submitter, the submitter's
    profile (when there is one) and the cluster, as ``select_related`` would give them."""
    user = get_user_model()
    sizes = [len(model._meta.concrete_fields) for model in (Job, user, Profile)]
    at = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    job = model_from_row(Job, row[: at[1]])
    job.submitter = model_from_row(user, row[at[1] : at[2]])
    profile = model_from_row(Profile, row[at[2] : at[3]])
    if profile.pk is not None:  # LEFT JOIN: every column NULL when the submitter has no profile
        job.submitter.profile = profile
    job.cluster = model_from_row(Cluster, row[at[3] :])
    return job


def _booking_reservation(job: Job) -> str:
    """The Slurm reservation of the job's booking; SlurmRejected when the booking lost it meanwhile."""
    if job.booking_id is None:
        return ""
    from accounting.models import Booking, BookingStatus, ReservationState

    booking = Booking.objects.filter(pk=job.booking_id).only("status", "reservation_state", "reservation_name").first()
    if booking is None or booking.status != BookingStatus.APPROVED or booking.reservation_state != ReservationState.ACTIVE:
        raise SlurmRejected("The job's booking was cancelled or its reservation is gone.")
    return booking.reservation_name


def _submission_for(job: Job, *, ensure_dirs: bool = True, parents: list | None = None) -> JobSubmission:
    """The stored request of a job as the gateway gets it, with the booking's reservation, the
    submitter's Unix ids and the dependency on its parents (``parents``: jobs.dependencies.parents_of).
    Raises SlurmRejected when the submitter has no Unix account, when the job's submit directory
    cannot be used (``ensure_dirs``: the user's default one is created, as the user, when missing:
    jobs.workdirs), or when a parent ended without success."""
    from portal.unix import unix_account_problem, unix_ids

    request = JobRequest.from_json(job.request)
    uid = gid = None
    username = cluster_username(job.submitter)
    if settings.SLURM_SUBMIT_AS_USER:
        ids = unix_ids(username)
        if problem := unix_account_problem(username, ids, getattr(job.submitter, "profile", None)):
            raise SlurmRejected(problem)
        uid, gid = ids
    if ensure_dirs:
        submit_dir_ensure(request.submit_dir, username=username, ids=(uid, gid) if uid is not None else None,
                          default=request.submit_dir_default)  # fmt: skip
    dependency = dependency_option(parents or []) if request.depends_on else ""
    return JobSubmission(request, reservation=_booking_reservation(job), uid=uid, gid=gid, dependency=dependency)


def job_relay_run(job_id) -> str:
    """Send one ACCEPTED job to Slurm, exactly once (what the ``job_relay`` task and a cancel of a job
    not in Slurm yet do): the batched relay for a batch of one (job_relay_batch_run: claim with a
    token and a lease; a job claimed before is looked for by its tag first and adopted; a cancel
    requested meanwhile is passed on, or done in the portal if Slurm never saw the job). Raises
    SlurmUnavailable (claim released) for the task to retry. Returns what happened: not-claimed,
    submitted, adopted, submit-failed, cancelled or already-recorded."""
    result = job_relay_batch_run([job_id], threads=1)
    outcomes = ("submitted", "adopted", "submit_failed", "cancelled", "already_recorded")
    return next((kind.replace("_", "-") for kind in outcomes if result[kind]), "not-claimed")


RELAY_BATCH_THREADS = 4
# A batched relay stops starting sbatch calls after this long (the rest is released for the retry),
# well inside RELAY_SOFT_TIME_LIMIT and the lease.
RELAY_BATCH_SUBMIT_SECONDS = 40


def job_relay_batch_run(job_ids: list, *, threads: int = RELAY_BATCH_THREADS) -> dict:
    """Send many ACCEPTED jobs to Slurm, each exactly once. What the ``job_relay_batch`` task does.

    Same rules as job_relay_run, in a constant number of queries:
    1. ONE statement claims every job among ``job_ids`` that is ACCEPTED, has no Slurm id and no
       live lease (a conditional UPDATE; one token for the run; relay_attempts + 1) and returns the
       claimed jobs with their submitter and cluster (_claim_statement). Jobs not claimed are left to
       their current holder, the sweeper or the single relay.
    2. The claimed jobs' sbatch calls run ``threads`` at a time (Slurm is
       called outside any transaction); a job claimed before (relay_attempts > 1) is first looked up
       by its tag (all such jobs in one find_by_comments) and adopted if an interrupted run submitted it already. A job
       whose cancel was requested and that Slurm never saw is cancelled in the portal.
    3. ONE statement records the outcomes (_record_statement): the still-claimed rows (conditional
       on the token, ACCEPTED, no Slurm id) get PENDING + Slurm id / SUBMIT_FAILED with Slurm's
       message (SlurmRejected: that job only) / CANCELLED, and their events.
    4. SlurmUnavailable for some jobs: their claims are released (one UPDATE) and SlurmUnavailable is
       raised after the others are recorded, for the task to retry with backoff (the retry claims
       only the jobs still ACCEPTED).
    Returns counts by outcome."""
    claimed_at = time.monotonic()
    token, jobs = _claim(job_ids)
    result = _relay_result(len(jobs), not_claimed=len(set(map(str, job_ids))) - len(jobs))
    if jobs:
        _relay_claimed(_Lease(token, claimed_at=claimed_at), jobs, result, threads=threads,
                       deadline=time.monotonic() + RELAY_BATCH_SUBMIT_SECONDS)  # fmt: skip
    if result["out_of_time"]:  # released for the retry, as when Slurm does not answer
        raise SlurmUnavailable(f"{result['out_of_time']} of {len(jobs)} jobs not relayed: time budget spent")
    return result


def _relay_result(claimed: int, *, not_claimed: int = 0) -> dict:
    return {"claimed": claimed, "not_claimed": not_claimed, "submitted": 0, "adopted": 0, "submit_failed": 0,
            "cancelled": 0, "unavailable": 0, "out_of_time": 0, "already_recorded": 0, "lease_renewals": 0}  # fmt: skip


def _relay_claimed(lease: _Lease, jobs: list[Job], result: dict, *, threads: int, deadline: float) -> None:
    """Steps 2–4 of job_relay_batch_run for the ``jobs`` claimed with ``lease.token`` just now (the
    batched relay and the drain share them; the claim read them): ONE look-up by tag for the jobs claimed before
    (find_by_comments: two Slurm calls at most, not two per job); the gateway's submit (sbatch, or
    pyslurm on 25.11) ``threads`` at a time, the lease renewed between them when due; one bulk write;
    counts added to ``result``. No sbatch starts after ``deadline`` (time.monotonic()) nor so late that
    it could outlive the claim's lease as last renewed (_Lease.start_by): the jobs not started are
    released (``result["out_of_time"]``). Raises SlurmUnavailable after recording the others when Slurm
    did not answer for some (their claims released)."""
    token = lease.token
    run = _RelayRound(jobs, deadline=deadline, lease=lease)
    todo = run.submissions()
    run.look_up_repeats(todo)
    lease.renew_if_due()
    run.submit_all(todo, threads=threads)
    result["lease_renewals"] += lease.renewals
    updates, held, released = _record_outcomes(token, run, result)
    _after_recording(run, updates, held)
    if run.unavailable:
        raise SlurmUnavailable(f"{len(released)} of {len(run.jobs)} jobs not relayed: {run.unavailable[0]}")


class _RelayRound:
    """One relay run's claimed jobs on their way to Slurm: each job's submission, the look-up of
    those claimed before, the submits, and what happened to each (``outcomes``: job pk -> (kind,
    Slurm id or message); kinds: submitted, adopted, rejected, cancel, unavailable, out_of_time)."""

    def __init__(self, jobs: list[Job], *, deadline: float, lease: _Lease):
        self.jobs, self.deadline, self.lease = jobs, deadline, lease
        self.gateways = {job.cluster.name: get_gateway(job.cluster.name) for job in jobs}  # each job to its cluster
        self.outcomes: dict[Any, tuple[str, Any]] = {}
        # per cluster: set once its Slurm does not answer, so its remaining jobs are not tried
        self.down: dict[str, list[str]] = {name: [] for name in self.gateways}
        self.waiting: list[str] = []  # jobs denied by the scheduler in one namespace only (NotPermitted)
        # those jobs: released with their lease kept, so no relay claims them again before it expires
        # (relay_lease_seconds()): a namespace that stays unusable is retried every lease, and its jobs,
        # the oldest, do not fill every drain round ahead of the other teams' (claims are oldest first)
        self.backed_off: set = set()
        self.in_slurm: dict[str, int] = {}  # tag -> Slurm id of the repeats found there

    @property
    def unavailable(self) -> list[str]:
        return [message for messages in self.down.values() for message in messages[:1]] or self.waiting[:1]

    def submissions(self) -> list[tuple[Job, JobSubmission]]:
        """Each job's submission (in this thread: a booked job's reservation and the parents are
        queries); a job that cannot be sent is recorded as rejected."""
        waiting = [job.pk for job in self.jobs if job.request.get("depends_on")]
        parents = parents_of(waiting) if waiting else {}  # one query, for the jobs that wait for others
        todo = []
        for job in self.jobs:
            try:
                submission = _submission_for(job, parents=parents.get(job.pk))
            except SlurmRejected as exc:
                self.outcomes[job.pk] = ("rejected", exc.message)
                continue
            job.unix_uid = submission.uid
            todo.append((job, submission))
        return todo

    def look_up_repeats(self, todo) -> None:
        """A job claimed before may have reached Slurm in a run that died after sbatch: its tag says
        so (one look-up per cluster that has such jobs)."""
        for name, gateway in self.gateways.items():
            repeats = [job.slurm_tag for job, _ in todo if job.relay_attempts > 1 and job.cluster.name == name]
            try:
                self.in_slurm |= gateway.find_by_comments(repeats) if repeats else {}
            except SlurmUnavailable as exc:
                self.down[name].append(exc.message)

    def _decide(self, job) -> tuple[str, Any] | None:
        """What happens to a job without a submit (None: it is submitted)."""
        if self.down[job.cluster.name]:
            return ("unavailable", self.down[job.cluster.name][0])
        if time.monotonic() > min(self.deadline, self.lease.start_by()):
            return ("out_of_time", None)
        existing = self.in_slurm.get(job.slurm_tag) if job.relay_attempts > 1 else None
        if existing is not None:
            return ("adopted", existing)
        if job.cancel_requested_at is not None:
            return ("cancel", None)
        return None

    def _relay_one(self, item) -> tuple[Any, tuple[str, Any]]:
        job, submission = item
        decided = self._decide(job)
        if decided is not None:
            return job.pk, decided
        try:
            return job.pk, ("submitted", self.gateways[job.cluster.name].submit(submission))
        except SlurmRejected as exc:
            return job.pk, ("rejected", exc.message)
        except NotPermitted as exc:
            if not exc.namespace:  # the portal's right is missing cluster-wide: as a cluster that does not answer
                self.down[job.cluster.name].append(exc.message)
            else:  # one namespace's (its RoleBinding missing): that job waits, the others of the cluster go on
                self.waiting.append(exc.message)
                self.backed_off.add(job.pk)
            return job.pk, ("unavailable", exc.message)
        except SlurmUnavailable as exc:
            self.down[job.cluster.name].append(exc.message)
            return job.pk, ("unavailable", exc.message)

    def submit_all(self, todo, *, threads: int) -> None:
        """The submits, ``threads`` at a time (Slurm is called outside any transaction); this thread
        renews the lease between them when it is due (the pool's threads touch no database)."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        if min(threads, len(todo)) <= 1:  # one at a time: in this thread
            for item in todo:
                self.lease.renew_if_due()
                self.outcomes.update([self._relay_one(item)])
            return
        with ThreadPoolExecutor(min(threads, len(todo))) as pool:
            pending = {pool.submit(self._relay_one, item) for item in todo}
            while pending:
                done, pending = wait(pending, timeout=RELAY_LEASE_RENEW_SECONDS, return_when=FIRST_COMPLETED)
                self.outcomes.update(future.result() for future in done)
                self.lease.renew_if_due()


_RECORDED_FIELDS = ["slurm_job_id", "slurm_cluster", "state", "submitted_at", "relay_token", "relay_started_at",
                    "last_relay_error", "unix_uid", "state_reason", "ended_at"]  # fmt: skip


def _outcome_applied(job: Job, kind: str, value, now) -> str:
    """The job row as an outcome leaves it (not saved); returns its event's reason."""
    job.relay_token = job.relay_started_at = None
    if kind in ("submitted", "adopted"):
        job.slurm_job_id, job.slurm_cluster, job.state, job.submitted_at = value, job.cluster.name, JobState.PENDING, now
        job.last_relay_error = ""
        return "Submitted to Slurm" if kind == "submitted" else "Found in Slurm by its tag after an interrupted relay"
    if kind == "rejected":
        job.state, job.state_reason, job.last_relay_error, job.ended_at = JobState.SUBMIT_FAILED, value[:1024], value[:4000], now
        return value[:1024]
    # cancel requested and Slurm never saw the job
    job.state, job.state_reason, job.ended_at = JobState.CANCELLED, "Cancelled before it reached Slurm", now
    return "Cancelled before it reached Slurm"


def _record_outcomes(token: uuid.UUID, run: _RelayRound, result: dict) -> tuple[list[Job], dict, list]:
    """ONE statement records the outcomes (_record_statement): the rows still claimed (conditional on
    the token, ACCEPTED, no Slurm id) updated, their events added, each one's cancel request as its
    row lock read it returned; the holds of those that never ran released in the same transaction;
    then the claims of the jobs not sent released (one UPDATE). Returns (the rows written, {pk still
    held: its cancel_requested_at as the lock read it}, the pks released)."""
    now = timezone.now()
    by_pk = {job.pk: job for job in run.jobs}
    released = [pk for pk, (kind, _) in run.outcomes.items() if kind in ("unavailable", "out_of_time")]
    counted = {"submitted": "submitted", "adopted": "adopted", "rejected": "submit_failed", "cancel": "cancelled"}
    written, events = [], []
    for pk, (kind, value) in run.outcomes.items():
        if kind not in ("unavailable", "out_of_time"):
            reason = _outcome_applied(by_pk[pk], kind, value, now)
            written.append(by_pk[pk])
            events.append(JobEvent(job=by_pk[pk], state=by_pk[pk].state, reason=reason, at=now))
    held: dict = {}
    if written:
        # refused by Slurm or cancelled before it: never ran, holds nothing (released with the outcome)
        never_ran = [job.pk for job in written if job.state != JobState.PENDING]
        with transaction.atomic() if never_ran else contextlib.nullcontext():
            # with each row's cancel request as of its lock: a cancel asked later waits for this
            # statement and then finds the Slurm id (jobs.services.cancel passes it on itself)
            with connection.cursor() as cursor:
                cursor.execute(_record_statement(), {"rows": json_rows(written, _RECORDED_FIELDS), "token": token,
                                                     "events": json_rows(events, ["job", "state", "reason", "at"], add=True)})  # fmt: skip
                held = dict(cursor.fetchall())
            if never_ran and (never_ran := [pk for pk in never_ran if pk in held]):
                budget_holds_release(job_uuids=never_ran, at=now)
    for job in written:
        kind = run.outcomes[job.pk][0]
        if job.pk in held:
            result[counted[kind]] += 1
        else:
            result["already_recorded"] += kind in ("submitted", "adopted")
    if released:
        by_message: dict[tuple[str, bool], list] = {}  # each released job with its own reason (one UPDATE per reason)
        for pk in released:
            kind, value = run.outcomes[pk]
            reason = f"Slurm unavailable: {value}" if kind == "unavailable" else "Relay time budget spent"
            by_message.setdefault((reason[:4000], pk in run.backed_off), []).append(pk)
        for (reason, backed_off), pks in by_message.items():
            Job.objects.filter(pk__in=pks, relay_token=token).update(
                relay_token=None, relay_started_at=now if backed_off else None, last_relay_error=reason)  # fmt: skip
        for pk in released:
            result[run.outcomes[pk][0]] += 1
    return [job for job in written if job.pk in held], held, released


_RECORD_STATEMENTS: list[str] = []


def _record_statement() -> str:
    """The recording as one plain SQL statement, its text made once per process: ``WITH v AS (the
    outcomes, one JSON parameter: json_populate_recordset), u AS (UPDATE jobs_job SET <recorded
    fields> FROM v WHERE the row is still claimed with the token, ACCEPTED, without Slurm id
    RETURNING id, cancel_requested_at), e AS (INSERT INTO jobs_jobevent … the events of the rows
    updated) SELECT * FROM u``. It replaces BEGIN, a SELECT … FOR UPDATE, a bulk UPDATE, a bulk INSERT
    and COMMIT, which Django (and django-pgbulk) compiled for every drain round (23 % of the worker's
    CPU per round, bench/results.md, nineteenth session). The UPDATE locks each row as the SELECT …
    FOR UPDATE did (a cancel's transaction holding it is waited for, and the row read again)."""
    if not _RECORD_STATEMENTS:
        qn = connection.ops.quote_name
        jobs, events = Job._meta.db_table, JobEvent._meta.db_table
        sets = ", ".join(f"{qn(column)} = v.{qn(column)}" for column in (Job._meta.get_field(name).column for name in _RECORDED_FIELDS))
        _RECORD_STATEMENTS.append(
            f"WITH v AS (SELECT * FROM json_populate_recordset(NULL::{jobs}, %(rows)s::json)), "
            f"u AS (UPDATE {jobs} j SET {sets} FROM v WHERE j.id = v.id AND j.relay_token = %(token)s "
            f"AND j.state = '{JobState.ACCEPTED}' AND j.slurm_job_id IS NULL RETURNING j.id, j.cancel_requested_at), "
            f"e AS (INSERT INTO {events} (job_id, state, reason, at) SELECT x.job_id, x.state, x.reason, x.at "
            f"FROM json_populate_recordset(NULL::{events}, %(events)s::json) x WHERE x.job_id IN (SELECT id FROM u)) "
            "SELECT id, cancel_requested_at FROM u"
        )
    return _RECORD_STATEMENTS[0]


def _after_recording(run: _RelayRound, updates: list[Job], held: dict) -> None:
    """Submitted but recorded by someone else (the sync adopting it by its tag): a different id there
    would be a duplicate (never expected) and is cancelled. Cancels asked while we were submitting:
    passed on now (as _record_outcomes's lock read them: no query)."""
    lost = {pk: value for pk, (kind, value) in run.outcomes.items() if kind in ("submitted", "adopted") and pk not in held}
    if lost:
        by_pk = {job.pk: job for job in run.jobs}
        for pk, recorded in Job.objects.filter(pk__in=list(lost)).values_list("pk", "slurm_job_id"):
            if recorded not in (None, lost[pk]):
                logger.error("job %s: duplicate Slurm job %s cancelled (kept %s)", pk, lost[pk], recorded)
                run.gateways[by_pk[pk].cluster.name].cancel(lost[pk])
    for job in updates:
        if job.state == JobState.PENDING and held[job.pk] is not None:
            publish("jobs.tasks.job_cancel_relay", str(job.pk))  # lost: jobs_sweep sends it


def jobs_lost_resend(*, jobs: list[Job], now: dt.datetime) -> int:
    """Send again the jobs Slurm lost in a controller takeover (jobs.services.sync decides which: an id
    neither the queue nor accounting knows to have started): back to ACCEPTED without their Slurm id,
    a history event saying why, the relay drain after commit. Their next claim is an attempt beyond
    the first, so the relay looks for their tag in Slurm before it submits (a job the controller does
    know after all is adopted, not sent twice). Conditional: only a job still live, never started and
    still under the lost id changes. Their budget holds stay (the new id is noted when seen)."""
    lost = {job.id: job.slurm_job_id for job in jobs}
    with transaction.atomic():
        rows = [
            (pk, slurm_job_id) for pk, slurm_job_id in Job.objects.select_for_update()
            .filter(pk__in=list(lost), state__in=(JobState.PENDING, JobState.REQUEUED), started_at__isnull=True)
            .values_list("pk", "slurm_job_id")
            if slurm_job_id == lost[pk]
        ]  # fmt: skip
        if not rows:
            return 0
        reasons = {pk: f"Slurm lost job {slurm_job_id} (its controller failed over before saving it): sent again" for pk, slurm_job_id in rows}
        Job.objects.filter(pk__in=[pk for pk, _ in rows]).update(
            state=JobState.ACCEPTED, slurm_job_id=None, slurm_cluster="", submitted_at=None, relay_token=None,
            relay_started_at=None, state_reason="Slurm lost it in a controller failover: sent again",
        )  # fmt: skip
        JobEvent.objects.bulk_create([JobEvent(job_id=pk, state=JobState.ACCEPTED, reason=reasons[pk], at=now) for pk, _ in rows])
        for pk, slurm_job_id in rows:
            logger.warning("job %s: Slurm job %s lost in a controller takeover, sent again", pk, slurm_job_id)
        relay_drain_after_commit()
    return len(rows)


# ---------------------------------------------------------------- the relay drain (group commit)

# The coalescing flag of the drain (portal.outbox.after_commit_coalesced) lives this long unless a
# running drain refreshes it: a drain that died stops holding back new ones after this.
RELAY_DRAIN_SIGNAL_SECONDS = 10
# A drain on a worker that found nothing to claim looks again every RELAY_DRAIN_POLL_SECONDS for
# this long before it ends: the next jobs of a burst join it instead of costing a task each. The
# first job of a burst never waits (its commit publishes the drain).
RELAY_DRAIN_LINGER_SECONDS = 0.25
RELAY_DRAIN_POLL_SECONDS = 0.02
# A lingering drain (a worker's) whose last round claimed fewer than RELAY_DRAIN_GATHER_BELOW jobs
# waits RELAY_DRAIN_GATHER_SECONDS before it claims again, so that under a stream of single-job
# submits a round carries several jobs: each round costs a fixed amount of Python and PostgreSQL
# whatever its size (~3 ms with the ORM's claim, read and bulk write, ~1.5 ms as the two statements of
# the twentieth session: bench/results.md), so rounds of ~3 cost that over 3 per job. A job
# waits that much longer for its Slurm id; the first job of a burst never does.
RELAY_DRAIN_GATHER_BELOW = 2 * RELAY_BATCH_THREADS
RELAY_DRAIN_GATHER_SECONDS = 0.02


def relay_drain_key() -> str:
    """The drain's coalescing flag: one per database (the rows it drains)."""
    return f"jobs-relay-drain:{connection.settings_dict['NAME']}"


def relay_drain_after_commit() -> None:
    """What a single-job submit enqueues: the drain, once its transaction commits, unless a drain is
    already pending or running (it looks again before it ends, so it takes this job)."""
    after_commit_coalesced("jobs.tasks.job_relay_drain", key=relay_drain_key(), ttl=RELAY_DRAIN_SIGNAL_SECONDS)


def _claim_waiting(limit: int) -> tuple[uuid.UUID, list[Job]]:
    """ONE statement claims up to ``limit`` jobs that wait for a relay — ACCEPTED, no Slurm id, no live
    lease, no parent waiting — oldest first, with one token for the run (relay_attempts + 1), and
    returns them with their submitter, profile and cluster (_claim_statement). ``FOR UPDATE SKIP
    LOCKED`` in its sub-select: a row another drain is claiming at this moment is skipped, not waited
    for, and one it has claimed no longer matches (its lease is live)."""
    return _claim_jobs(limit=limit)


def job_relay_drain_run(*, limit: int | None = None, threads: int = RELAY_BATCH_THREADS, linger: float = 0.0) -> dict:
    """Relay every job waiting in ACCEPTED, in batches: the group commit of single-job submissions.
    What the ``job_relay_drain`` task does.

    Each round: _claim_waiting(limit) (ONE statement: the claim, SKIP LOCKED, limit
    JOB_RELAY_DRAIN_BATCH, and the claimed rows), then the batched relay's steps for the claimed jobs
    (_relay_claimed: find-by-tag adoption for repeats, sbatch ``threads`` at a time, ONE statement
    records them): 2 queries per round whatever its size (tests/jobs/test_relay_queries.py). With ``linger`` > 0 a round that claimed fewer than
    RELAY_DRAIN_GATHER_BELOW jobs is followed by a RELAY_DRAIN_GATHER_SECONDS pause (bigger rounds under
    a stream of submits). Rounds go on until a claim comes back empty; then,
    ``linger`` > 0, it looks again every RELAY_DRAIN_POLL_SECONDS for that long; then it clears the
    coalescing flag and claims ONCE more (a job committed while the flag was up is taken here, one
    committed after publishes a new drain). Several drains may run at once: each job is claimed by
    one of them. Exactly once as with job_relay_run: a drain killed after sbatch leaves its claims
    to expire (relay_lease_seconds(): no renewal comes), the sweeper's drain re-claims them and adopts by tag.

    Bounded in time: after RELAY_BATCH_SUBMIT_SECONDS it publishes a fresh drain for what is left and
    returns. SlurmUnavailable: the round's other outcomes are recorded, its unsent claims released,
    the flag cleared, and it is raised for the task to retry. Returns counts (summed over rounds)."""
    limit = limit or settings.JOB_RELAY_DRAIN_BATCH
    key = relay_drain_key()
    deadline = time.monotonic() + RELAY_BATCH_SUBMIT_SECONDS
    totals = _relay_result(0) | {"rounds": 0, "handed_over": 0}
    idle_since = None
    try:
        while True:
            claimed_at = time.monotonic()
            token, jobs = _claim_waiting(limit)
            if not jobs:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since < linger and now < deadline:
                    time.sleep(RELAY_DRAIN_POLL_SECONDS)
                    continue
                coalesced_done(key)
                claimed_at = time.monotonic()
                token, jobs = _claim_waiting(limit)
                if not jobs:
                    return totals
                coalesced_hold(key, RELAY_DRAIN_SIGNAL_SECONDS)  # going on: hold back new drains again
            idle_since = None
            claimed = len(jobs)
            result = _relay_result(claimed)
            totals["rounds"] += 1
            gather = linger > 0 and claimed < RELAY_DRAIN_GATHER_BELOW
            try:
                _relay_claimed(_Lease(token, claimed_at=claimed_at), jobs, result, threads=threads, deadline=deadline)
            finally:
                for name, count in result.items():
                    totals[name] += count
            if result["out_of_time"] == claimed and time.monotonic() < deadline:  # none fitted in the lease: back off
                raise SlurmUnavailable(f"{claimed} jobs not relayed: no time left within the claim's lease")
            if time.monotonic() >= deadline:
                if publish("jobs.tasks.job_relay_drain"):  # the flag stays up: the fresh drain owns it
                    totals["handed_over"] = 1
                else:
                    coalesced_done(key)
                return totals
            coalesced_hold(key, RELAY_DRAIN_SIGNAL_SECONDS)
            if gather:
                time.sleep(RELAY_DRAIN_GATHER_SECONDS)  # let the stream fill the next round
    except BaseException:
        coalesced_done(key)  # the retry (or the next commit) may start a drain at once
        raise
