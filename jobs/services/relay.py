"""Relaying ACCEPTED jobs to Slurm, exactly once: claim / lease / release (a conditional update with a
token), the JobSpec for a stored job, the single relay and the batched relay. Slurm is called outside
any transaction; every state change is a conditional UPDATE on the row."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job, JobEvent
from portal.db import bulk_update_values
from portal.slurm import JobSpec, SlurmRejected, SlurmUnavailable, get_gateway

logger = logging.getLogger(__name__)


# A relay's claim on a job expires after this long (longer than the task's hard time limit, so a
# relay whose claim expired is dead for sure and another may take over).
RELAY_LEASE_SECONDS = 120
RELAY_SOFT_TIME_LIMIT = 60
RELAY_HARD_TIME_LIMIT = 90


def _lease_free() -> Q:
    return Q(relay_started_at__isnull=True) | Q(relay_started_at__lt=timezone.now() - dt.timedelta(seconds=RELAY_LEASE_SECONDS))


def _claim(job_id) -> uuid.UUID | None:
    """Claim an ACCEPTED job for one relay run (a conditional update: two runs cannot both win).
    Returns the claim token, or None when the job is not ACCEPTED any more or another run holds a
    lease that has not expired."""
    token = uuid.uuid4()
    claimed = (
        Job.objects.filter(_lease_free(), pk=job_id, state=JobState.ACCEPTED, slurm_job_id__isnull=True)
        .update(relay_token=token, relay_started_at=timezone.now(), relay_attempts=F("relay_attempts") + 1)
    )
    return token if claimed == 1 else None


def _release(job_id, token: uuid.UUID, error: str = "") -> None:
    """Give the claim back (so a retry can take it at once) and remember why."""
    Job.objects.filter(pk=job_id, relay_token=token).update(relay_token=None, relay_started_at=None, last_relay_error=error[:4000])


def _booking_reservation(job: Job) -> str:
    """The Slurm reservation of the job's booking; SlurmRejected when the booking lost it meanwhile."""
    if job.booking_id is None:
        return ""
    from accounting.models import Booking, BookingStatus, ReservationState

    booking = Booking.objects.filter(pk=job.booking_id).only("status", "reservation_state", "reservation_name").first()
    if booking is None or booking.status != BookingStatus.APPROVED or booking.reservation_state != ReservationState.ACTIVE:
        raise SlurmRejected("The job's booking was cancelled or its reservation is gone.")
    return booking.reservation_name


def _spec_for(job: Job) -> JobSpec:
    """The JobSpec for a stored job. Raises SlurmRejected when the submitter has no Unix account."""
    from portal.unix import unix_account_problem, unix_ids

    uid = gid = None
    if settings.SLURM_SUBMIT_AS_USER:
        profile = getattr(job.submitter, "profile", None)
        username = profile.cluster_username if profile else job.submitter.username
        ids = unix_ids(username)
        if problem := unix_account_problem(username, ids, profile):
            raise SlurmRejected(problem)
        uid, gid = ids
    pattern = settings.JOB_OUTPUT_PATTERN
    slurm_id = "%A_%a" if job.array else "%j"
    stdout = job.output_pattern or pattern.format(workdir=job.workdir, slurm_job_id=slurm_id, stream="out")
    stderr = job.error_pattern or (pattern.format(workdir=job.workdir, slurm_job_id=slurm_id, stream="err") if not job.output_pattern else "")
    # the command line: the job's overrides (jobs.spec), and the portal's output files where the
    # script names none (a script's --output alone sends stderr there too, as sbatch does)
    options = [(option, value) for option, value in job.overrides if option != "account"]
    if not job.output_pattern:
        options.append(("output", stdout))
    if not job.output_pattern and not job.error_pattern:
        options.append(("error", stderr))
    return JobSpec(
        script=job.script,
        # the team's account on the job's cluster, as the spec put it on the command line
        account=next((value for option, value in job.overrides if option == "account"), job.team.slurm_account),
        partition=job.partition,
        name=job.name,
        gpus=job.gpus,
        gpu_type=job.gpu_type,
        nodes=job.nodes,
        cpus_per_gpu=job.cpus_per_gpu or 1,
        memory_mb=job.memory_gb * 1024 if job.memory_gb else None,
        time_limit_minutes=job.time_limit_minutes,
        workdir=job.workdir,
        stdout=stdout,
        stderr=stderr or stdout,
        options=tuple(options),
        environment=dict(job.environment),
        comment=job.slurm_tag,
        reservation=_booking_reservation(job),
        uid=uid,
        gid=gid,
    )


def _record_submitted(job: Job, slurm_job_id: int, *, token: uuid.UUID | None, reason: str) -> bool:
    """ACCEPTED → PENDING with the Slurm id, if nobody (the sync adopting it) got there first."""
    now = timezone.now()
    with transaction.atomic():
        done = Job.objects.filter(pk=job.pk, state=JobState.ACCEPTED, slurm_job_id__isnull=True).update(
            slurm_job_id=slurm_job_id, slurm_cluster=job.cluster.name, state=JobState.PENDING,
            submitted_at=now, relay_token=None, relay_started_at=None, last_relay_error="", unix_uid=job.unix_uid,
        )  # fmt: skip
        if done:
            JobEvent.objects.create(job=job, state=JobState.PENDING, reason=reason, at=now)
    return bool(done)


def _mark_cancelled_locally(job_id, *, token: uuid.UUID | None, reason: str) -> bool:
    now = timezone.now()
    query = Job.objects.filter(pk=job_id, state=JobState.ACCEPTED, slurm_job_id__isnull=True)
    if token is not None:
        query = query.filter(relay_token=token)
    with transaction.atomic():
        done = query.update(state=JobState.CANCELLED, state_reason=reason, ended_at=now, relay_token=None, relay_started_at=None)
        if done:
            JobEvent.objects.create(job_id=job_id, state=JobState.CANCELLED, reason=reason, at=now)
    return bool(done)


def job_relay_run(job_id) -> str:
    """Send one ACCEPTED job to Slurm, exactly once. What the ``job_relay`` task does.

    1. Claim the job (conditional update with a token and a lease).
    2. If an earlier run claimed it before (relay_attempts > 1), it may have crashed between sbatch
       and the database write: ask Slurm for a job carrying the tag ``gpuportal:<uuid>`` first and
       adopt it. (A first attempt cannot have a twin, so it saves the look-up.)
    3. Cancel requested meanwhile → adopt-and-cancel, or cancel in the portal if Slurm never saw it.
    4. Else sbatch (outside any transaction) and record the id: ACCEPTED → PENDING.
    Raises SlurmUnavailable (claim released) for the task to retry. Returns what happened."""
    token = _claim(job_id)
    if token is None:
        return "not-claimed"
    job = Job.objects.select_related("team", "submitter__profile", "cluster").get(pk=job_id)
    gateway = get_gateway(job.cluster.name)
    try:
        spec = _spec_for(job)
    except SlurmRejected as exc:  # no Unix account: nothing Slurm could run
        _submit_failed(job, token, exc.message)
        return "submit-failed"
    job.unix_uid = spec.uid
    try:
        existing = gateway.find_by_comment(job.slurm_tag) if job.relay_attempts > 1 else None
        if existing is None and job.cancel_requested_at is not None:
            _mark_cancelled_locally(job.pk, token=token, reason="Cancelled before it reached Slurm")
            return "cancelled"
        if existing is not None:
            slurm_job_id, reason = existing, "Found in Slurm by its tag after an interrupted relay"
        else:
            slurm_job_id, reason = gateway.submit(spec), "Submitted to Slurm"
    except SlurmRejected as exc:
        _submit_failed(job, token, exc.message)
        return "submit-failed"
    except SlurmUnavailable as exc:
        _release(job.pk, token, f"Slurm unavailable: {exc.message}")
        raise

    if not _record_submitted(job, slurm_job_id, token=token, reason=reason):
        # The sync adopted it by its tag meanwhile (same id), or — never expected — another id.
        job.refresh_from_db(fields=["slurm_job_id", "state"])
        if job.slurm_job_id not in (None, slurm_job_id):
            logger.error("job %s: duplicate Slurm job %s cancelled (kept %s)", job.pk, slurm_job_id, job.slurm_job_id)
            gateway.cancel(slurm_job_id)
        return "already-recorded"
    job.refresh_from_db(fields=["cancel_requested_at"])
    if job.cancel_requested_at is not None:
        # Cancel asked while we were submitting: pass it on now.
        from jobs.tasks import job_cancel_relay

        job_cancel_relay.delay(str(job.pk))
    return "adopted" if existing is not None else "submitted"


def _submit_failed(job: Job, token: uuid.UUID, message: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        done = Job.objects.filter(pk=job.pk, relay_token=token, state=JobState.ACCEPTED).update(
            state=JobState.SUBMIT_FAILED, state_reason=message[:1024], last_relay_error=message[:4000],
            ended_at=now, relay_token=None, relay_started_at=None,
        )  # fmt: skip
        if done:
            JobEvent.objects.create(job=job, state=JobState.SUBMIT_FAILED, reason=message[:1024], at=now)


RELAY_BATCH_THREADS = 4
# A batched relay stops starting sbatch calls after this long (the rest is released for the retry),
# well inside RELAY_SOFT_TIME_LIMIT and the lease.
RELAY_BATCH_SUBMIT_SECONDS = 40


def job_relay_batch_run(job_ids: list, *, threads: int = RELAY_BATCH_THREADS) -> dict:
    """Send many ACCEPTED jobs to Slurm, each exactly once. What the ``job_relay_batch`` task does.

    Same rules as job_relay_run, in a constant number of queries:
    1. ONE conditional UPDATE claims every job among ``job_ids`` that is ACCEPTED, has no Slurm id
       and no live lease (one token for the run; relay_attempts + 1). Jobs not claimed are left to
       their current holder, the sweeper or the single relay.
    2. ONE query reads the claimed jobs. Their sbatch calls run ``threads`` at a time (Slurm is
       called outside any transaction); a job claimed before (relay_attempts > 1) is first looked up
       by its tag (find_by_comment) and adopted if an interrupted run submitted it already. A job
       whose cancel was requested and that Slurm never saw is cancelled in the portal.
    3. ONE transaction records the outcomes: the still-claimed rows are locked (conditional on the
       token, ACCEPTED, no Slurm id), ONE bulk UPDATE writes PENDING + Slurm id / SUBMIT_FAILED with
       Slurm's message (SlurmRejected: that job only) / CANCELLED, ONE bulk INSERT adds the events.
    4. SlurmUnavailable for some jobs: their claims are released (one UPDATE) and SlurmUnavailable is
       raised after the others are recorded, for the task to retry with backoff (the retry claims
       only the jobs still ACCEPTED).
    Returns counts by outcome."""
    from concurrent.futures import ThreadPoolExecutor

    token = uuid.uuid4()
    claimed = Job.objects.filter(
        _lease_free(), pk__in=list(job_ids), state=JobState.ACCEPTED, slurm_job_id__isnull=True
    ).update(relay_token=token, relay_started_at=timezone.now(), relay_attempts=F("relay_attempts") + 1)
    result = {"claimed": claimed, "not_claimed": len(set(map(str, job_ids))) - claimed, "submitted": 0, "adopted": 0,
              "submit_failed": 0, "cancelled": 0, "unavailable": 0, "already_recorded": 0}  # fmt: skip
    if not claimed:
        return result
    jobs = list(Job.objects.filter(relay_token=token).select_related("team", "submitter__profile", "cluster"))
    gateways = {job.cluster.name: get_gateway(job.cluster.name) for job in jobs}  # each job to its cluster

    # Specs in this thread (a booked job's reservation is a query); Slurm calls in the pool.
    outcomes: dict[Any, tuple[str, Any]] = {}  # job pk -> (kind, slurm id or message)
    todo = []
    for job in jobs:
        try:
            spec = _spec_for(job)
        except SlurmRejected as exc:
            outcomes[job.pk] = ("rejected", exc.message)
            continue
        job.unix_uid = spec.uid
        todo.append((job, spec))

    deadline = time.monotonic() + RELAY_BATCH_SUBMIT_SECONDS
    unavailable = []  # set once Slurm does not answer: the remaining jobs are not tried

    def relay_one(item):
        job, spec = item
        gateway = gateways[job.cluster.name]
        if unavailable or time.monotonic() > deadline:
            return job.pk, ("unavailable", unavailable[0] if unavailable else "batch time budget spent")
        try:
            existing = gateway.find_by_comment(job.slurm_tag) if job.relay_attempts > 1 else None
            if existing is not None:
                return job.pk, ("adopted", existing)
            if job.cancel_requested_at is not None:
                return job.pk, ("cancel", None)
            return job.pk, ("submitted", gateway.submit(spec))
        except SlurmRejected as exc:
            return job.pk, ("rejected", exc.message)
        except SlurmUnavailable as exc:
            unavailable.append(exc.message)
            return job.pk, ("unavailable", exc.message)

    with ThreadPoolExecutor(max(1, min(threads, len(todo) or 1))) as pool:
        outcomes.update(pool.map(relay_one, todo))

    now = timezone.now()
    by_pk = {job.pk: job for job in jobs}
    events, updates, slurm_ids = [], [], {}
    released = [pk for pk, (kind, _) in outcomes.items() if kind == "unavailable"]
    with transaction.atomic():
        held = set(
            Job.objects.select_for_update()
            .filter(pk__in=[pk for pk in outcomes if pk not in released], relay_token=token,
                    state=JobState.ACCEPTED, slurm_job_id__isnull=True)
            .values_list("pk", flat=True)
        )  # fmt: skip
        for pk, (kind, value) in outcomes.items():
            if kind == "unavailable":
                continue
            if kind in ("submitted", "adopted"):
                slurm_ids[pk] = value
            if pk not in held:
                if kind in ("submitted", "adopted"):
                    result["already_recorded"] += 1
                continue
            job = by_pk[pk]
            job.relay_token = job.relay_started_at = None
            if kind in ("submitted", "adopted"):
                job.slurm_job_id, job.slurm_cluster, job.state, job.submitted_at = value, job.cluster.name, JobState.PENDING, now
                job.last_relay_error = ""
                reason = "Submitted to Slurm" if kind == "submitted" else "Found in Slurm by its tag after an interrupted relay"
                result[kind] += 1
            elif kind == "rejected":
                job.state, job.state_reason, job.last_relay_error, job.ended_at = (
                    JobState.SUBMIT_FAILED, value[:1024], value[:4000], now
                )
                reason = value[:1024]
                result["submit_failed"] += 1
            else:  # cancel requested and Slurm never saw the job
                job.state, job.state_reason, job.ended_at = JobState.CANCELLED, "Cancelled before it reached Slurm", now
                reason = "Cancelled before it reached Slurm"
                result["cancelled"] += 1
            updates.append(job)
            events.append(JobEvent(job=job, state=job.state, reason=reason, at=now))
        if updates:
            bulk_update_values(
                Job.objects.filter(relay_token=token, state=JobState.ACCEPTED),
                updates,
                ["slurm_job_id", "slurm_cluster", "state", "submitted_at", "relay_token", "relay_started_at",
                 "last_relay_error", "unix_uid", "state_reason", "ended_at"],
            )  # fmt: skip
            JobEvent.objects.bulk_create(events)
    if released:
        Job.objects.filter(pk__in=released, relay_token=token).update(
            relay_token=None, relay_started_at=None, last_relay_error=f"Slurm unavailable: {unavailable[0] if unavailable else 'time budget'}"[:4000]
        )
        result["unavailable"] = len(released)

    # Submitted but recorded by someone else (the sync adopting it by its tag): a different id there
    # would be a duplicate (never expected) and is cancelled, as job_relay_run does.
    lost = {pk: sid for pk, sid in slurm_ids.items() if pk not in held}
    if lost:
        for pk, recorded in Job.objects.filter(pk__in=list(lost)).values_list("pk", "slurm_job_id"):
            if recorded not in (None, lost[pk]):
                logger.error("job %s: duplicate Slurm job %s cancelled (kept %s)", pk, lost[pk], recorded)
                gateways[by_pk[pk].cluster.name].cancel(lost[pk])
    # Cancels asked while we were submitting: pass them on now.
    recorded_ids = [job.pk for job in updates if job.state == JobState.PENDING]
    if recorded_ids:
        from jobs.tasks import job_cancel_relay

        for pk in Job.objects.filter(pk__in=recorded_ids, cancel_requested_at__isnull=False).values_list("pk", flat=True):
            job_cancel_relay.delay(str(pk))
    if released:
        raise SlurmUnavailable(f"{len(released)} of {len(jobs)} jobs not relayed: {unavailable[0] if unavailable else 'time budget spent'}")
    return result
