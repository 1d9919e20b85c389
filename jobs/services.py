"""Writes for jobs: submit (exactly once), quote, cancel, relay to Slurm, sync with Slurm, templates.

Rules every function here follows:
- the row is persisted first (state ACCEPTED) and the relay is enqueued with ``on_commit``;
- every state change is a conditional UPDATE on the row (``filter(pk=…, state=…).update(…)``) or a
  bulk update restricted to live rows, so a terminal state is never left;
- Slurm is called outside any transaction, and in batches (one ``queue()`` per sync cycle).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import re
import time
import uuid
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from accounting.services import budget_hold_check
from jobs.arrays import array_tasks_record, array_view, ended_tasks, group_by_array
from jobs.choices import (
    LIVE_STATES,
    TERMINAL_STATES,
    JobState,
    TemplateScope,
    state_from_slurm,
    transition_allowed,
)
from jobs.estimate import JobQuote, quote_for
from jobs.models import SLURM_TAG_PREFIX, Job, JobEvent, JobTemplate
from jobs.spec import (
    CONTROL_CHARS_RE,
    DEFAULT_SHEBANG,  # noqa: F401 — re-exported (bench/bench_relay.py)
    ENV_NAME_RE,
    MAX_ENV_ENTRIES,
    MAX_SCRIPT_BYTES,
    ValidSpec,
    _as_int,
    validate_job_spec,
)
from portal.db import bulk_update_values
from portal.exceptions import ApplicationError, Conflict
from portal.models import Team
from portal.outbox import after_commit
from portal.roles import is_admin, is_manager, is_member
from portal.services import audit_record
from portal.slurm import JobSpec, SlurmRejected, SlurmUnavailable, get_gateway

logger = logging.getLogger(__name__)

IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces

# A relay's claim on a job expires after this long (longer than the task's hard time limit, so a
# relay whose claim expired is dead for sure and another may take over).
RELAY_LEASE_SECONDS = 120
RELAY_SOFT_TIME_LIMIT = 60
RELAY_HARD_TIME_LIMIT = 90

# ---------------------------------------------------------------- quote


def job_quote(
    *,
    partition: str = "",
    gpu_type: str = "",
    gpus: int | None = None,
    nodes: int | None = None,
    cpus_per_gpu: int | None = None,
    memory_gb: int | None = None,
    time_limit_minutes: int | None = None,
    script: str = "",
    ntasks: int | None = None,
    cpus_per_task: int | None = None,
    exclusive: bool | None = None,
    array: str | None = None,
    at: dt.datetime | None = None,
) -> JobQuote:
    """The most a job of this shape can use: GPU-hours = the GPUs Slurm allocates × time limit × array
    tasks, and its cost at the rate in force (the dearest type of the partition when any type will
    do). ``script``: its #SBATCH directives count, the fields override them, as for job_submit.
    Validates like job_submit (ApplicationError naming the field)."""
    spec = validate_job_spec(
        name=None, script=script or None, partition=partition, gpu_type=gpu_type, gpus=gpus, nodes=nodes,
        cpus_per_gpu=cpus_per_gpu, memory_gb=memory_gb, time_limit_minutes=time_limit_minutes, workdir=None,
        environment=None, ntasks=ntasks, cpus_per_task=cpus_per_task, exclusive=exclusive, array=array,
        check_script=bool(script),
    )  # fmt: skip
    return quote_for(spec, at=at)


def _check_budget(team: Team, estimate: JobQuote, booking_id: uuid.UUID | None = None) -> None:
    """``accounting.services.budget_hold_check`` raises an ApplicationError (409) when the job does not
    fit the team's budget. Must run inside job_submit's transaction (it locks the team row until the
    job is committed)."""
    budget_hold_check(team=team, estimate=estimate, booking_id=booking_id)


# ---------------------------------------------------------------- submit


def request_fingerprint(payload: dict) -> str:
    """SHA-256 of a request's content (canonical JSON), for idempotent replays."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", errors="surrogatepass")).hexdigest()


def _team_for_submit(*, user, team: Team | None) -> Team:
    """The team, when the user may submit to it. Someone who cannot see the team is told it does not
    exist (400 "No such team.", the same answer as for a slug that does not exist)."""
    from portal.selectors import teams_visible_to

    if team is None or not user.is_authenticated:
        raise ApplicationError("No such team.", errors={"team": ["No such team."]})
    if not is_member(user, team):
        if teams_visible_to(user).filter(pk=team.pk).exists():
            raise ApplicationError(
                f"You are not a member of team {team.name}.", errors={"team": [f"You are not a member of team {team.name}."]}
            )
        raise ApplicationError("No such team.", errors={"team": ["No such team."]})
    if not team.active:
        raise ApplicationError(f"Team {team.name} is inactive.", errors={"team": [f"Team {team.name} is inactive."]})
    return team


def _check_booking(booking_id: uuid.UUID, *, team: Team, spec: ValidSpec) -> None:
    """The job may run in the booking (accounting.selectors.booking_check_for_job raises otherwise)."""
    from accounting.selectors import booking_check_for_job

    booking_check_for_job(booking_id=booking_id, team=team, gpu_type=spec.gpu_type, gpus=spec.total_gpus,
                          time_limit_minutes=spec.time_limit_minutes)  # fmt: skip


def _booking_reservation(job: Job) -> str:
    """The Slurm reservation of the job's booking; SlurmRejected when the booking lost it meanwhile."""
    if job.booking_id is None:
        return ""
    from accounting.models import Booking, BookingStatus, ReservationState

    booking = Booking.objects.filter(pk=job.booking_id).only("status", "reservation_state", "reservation_name").first()
    if booking is None or booking.status != BookingStatus.APPROVED or booking.reservation_state != ReservationState.ACTIVE:
        raise SlurmRejected("The job's booking was cancelled or its reservation is gone.")
    return booking.reservation_name


def _booking_id(booking: Any) -> uuid.UUID | None:
    if booking in (None, ""):
        return None
    value = getattr(booking, "pk", booking)
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        raise ApplicationError("Invalid booking.", errors={"booking": ["Not a booking id."]}) from None


def _job_row(spec: ValidSpec, quote: JobQuote, *, team: Team, user, booking_id, idempotency_key, fingerprint) -> Job:
    """The Job row for a checked spec and its estimate (not saved)."""
    return Job(
        team=team, submitter=user, name=spec.name, script=spec.script, partition=spec.partition,
        gpu_type=spec.gpu_type, gpus=spec.gpus, nodes=spec.nodes, cpus_per_gpu=spec.cpus_per_gpu,
        memory_gb=spec.memory_gb, time_limit_minutes=spec.time_limit_minutes, workdir=spec.workdir,
        environment=spec.environment, booking_id=booking_id, state=JobState.ACCEPTED,
        ntasks=spec.ntasks, cpus_per_task=spec.cpus_per_task, exclusive=spec.exclusive, array=spec.array,
        array_tasks=spec.array_tasks, array_throttle=spec.array_throttle, qos=spec.qos, constraint=spec.constraint,
        output_pattern=spec.output, error_pattern=spec.error, overrides=spec.overrides, directives=spec.directives,
        estimated_gpu_hours=quote.gpu_hours, estimated_cost=quote.cost, currency=quote.currency,
        idempotency_key=idempotency_key, request_fingerprint=fingerprint,
    )  # fmt: skip


def job_submit(
    *,
    user,
    team: Team | None,
    script: str,
    name: str | None = None,
    partition: str = "",
    gpu_type: str = "",
    gpus: int | None = None,
    nodes: int | None = None,
    cpus_per_gpu: int | None = None,
    memory_gb: int | None = None,
    time_limit_minutes: int | None = None,
    workdir: str | None = None,
    environment: dict | None = None,
    ntasks: int | None = None,
    cpus_per_task: int | None = None,
    exclusive: bool | None = None,
    array: str | None = None,
    qos: str | None = None,
    constraint: str | None = None,
    booking: Any = None,
    idempotency_key: str | None = None,
    fingerprint: str | None = None,
    request=None,
) -> tuple[Job, bool]:
    """Validate and store a job (ACCEPTED + first JobEvent); enqueue its relay to Slurm on commit.

    Returns (job, created). With an ``idempotency_key``: the same user sending the same key and the
    same request again gets the first job back (created=False); the same key with another request is
    a ``Conflict`` (409). Race-safe: a unique constraint on (submitter, key) decides, not a lookup.
    ``fingerprint`` defaults to a hash of the arguments as given. A new job is recorded in the audit
    trail (``request``: the client's address).

    The spec is the script's #SBATCH directives with the given fields overriding them (None / "":
    the script decides); see jobs.spec.validate_job_spec."""
    if idempotency_key is not None and not IDEMPOTENCY_KEY_RE.match(idempotency_key):
        raise ApplicationError(
            "Invalid Idempotency-Key.", errors={"idempotency_key": ["1–255 printable ASCII characters, no spaces."]}
        )
    if fingerprint is None:
        fingerprint = request_fingerprint(
            {
                "team": team.pk if team else None, "name": name, "script": script, "partition": partition,
                "gpu_type": gpu_type, "gpus": gpus, "nodes": nodes, "cpus_per_gpu": cpus_per_gpu,
                "memory_gb": memory_gb, "time_limit_minutes": time_limit_minutes, "workdir": workdir,
                "environment": environment, "booking": str(getattr(booking, "pk", booking) or ""),
                "ntasks": ntasks, "cpus_per_task": cpus_per_task, "exclusive": exclusive, "array": array,
                "qos": qos, "constraint": constraint,
            }
        )  # fmt: skip
    if idempotency_key is not None:
        replay = _idempotent_replay(user=user, key=idempotency_key, fingerprint=fingerprint)
        if replay is not None:
            return replay, False

    team = _team_for_submit(user=user, team=team)
    spec = validate_job_spec(
        name=name, script=script, partition=partition, gpu_type=gpu_type, gpus=gpus, nodes=nodes,
        cpus_per_gpu=cpus_per_gpu, memory_gb=memory_gb, time_limit_minutes=time_limit_minutes,
        workdir=workdir, environment=environment, account=team.slurm_account, ntasks=ntasks,
        cpus_per_task=cpus_per_task, exclusive=exclusive, array=array, qos=qos, constraint=constraint,
    )  # fmt: skip
    booking_id = _booking_id(booking)
    if booking_id is not None:
        _check_booking(booking_id, team=team, spec=spec)
    quote = quote_for(spec)
    job = _job_row(spec, quote, team=team, user=user, booking_id=booking_id, idempotency_key=idempotency_key,
                   fingerprint=fingerprint)  # fmt: skip
    try:
        with transaction.atomic():
            # in the transaction that inserts the job: the budget check locks the team row, so the
            # next submission for the team waits and then sees this job's hold
            _check_budget(team, quote, booking_id)
            job.save(force_insert=True)
            JobEvent.objects.create(job=job, state=JobState.ACCEPTED, reason="Accepted by the portal", at=job.created_at)
            audit_record(
                actor=user, action="job.submit", target=job, team=team, request=request,
                data={"name": job.name, "partition": job.partition, "gpu_type": job.gpu_type, "gpus": job.gpus,
                      "time_limit_minutes": job.time_limit_minutes},
            )  # fmt: skip
            from jobs.tasks import job_relay  # jobs.tasks imports this module

            after_commit(job_relay, str(job.pk))
    except IntegrityError:
        # Another request with the same key won the race (the constraint is the only judge).
        if idempotency_key is None:
            raise
        replay = _idempotent_replay(user=user, key=idempotency_key, fingerprint=fingerprint)
        if replay is None:
            raise
        return replay, False
    return job, True


MAX_BATCH_JOBS = 100


def _batch_key(key: str, index: int) -> str:
    """The idempotency key stored on job ``index`` of a batch: the client's key on the first job, a
    hash of it with the index on the others (a space: never a client key, and at most 255 chars)."""
    if index == 0:
        return key
    return f"{hashlib.sha256(key.encode()).hexdigest()} {index}"


def _idempotent_replay_batch(*, user, key: str, fingerprint: str) -> list[Job] | None:
    """The jobs an earlier batch with this key created (in the batch's order), or None; Conflict if
    the request differs (also when the key was used for a single job)."""
    keys = [_batch_key(key, i) for i in range(MAX_BATCH_JOBS)]
    jobs = list(Job.objects.filter(submitter=user, idempotency_key__in=keys).select_related("team", "submitter"))
    if not jobs:
        return None
    first = next((j for j in jobs if j.idempotency_key == key), jobs[0])
    if first.request_fingerprint != fingerprint:
        raise Conflict(
            "This Idempotency-Key was already used for a different request.",
            errors={"idempotency_key": [f"Already used for job {first.pk} with a different request body."]},
        )
    order = {k: i for i, k in enumerate(keys)}
    return sorted(jobs, key=lambda j: order[j.idempotency_key])


def job_submit_batch(
    *,
    user,
    team: Team | None,
    jobs: list[dict],
    idempotency_key: str | None = None,
    fingerprint: str | None = None,
    request=None,
) -> tuple[list[Job], bool]:
    """Validate and store up to MAX_BATCH_JOBS jobs of one team at once (all or none).

    ``jobs``: dicts with job_submit's spec fields (name, script, partition, gpu_type, gpus, nodes,
    cpus_per_gpu, memory_gb, time_limit_minutes, workdir, environment, booking). Every spec is
    checked with the same validation as job_submit; the errors come back keyed by the spec's index
    (``{"3": {"gpus": [...]}}``) and nothing is stored. The budget is checked for the sum of the
    estimates under the team row lock (one check per GPU type priced, each seeing the jobs of the
    previous ones as held), then the jobs are bulk-inserted with their ACCEPTED events and one audit
    event ``job.submit_batch``; ONE ``job_relay_batch`` is enqueued on commit.
    Returns (jobs in the given order, created). ``idempotency_key`` covers the whole batch."""
    if not isinstance(jobs, list) or not jobs:
        raise ApplicationError("Give a non-empty list of jobs.", errors={"jobs": ["Give a non-empty list of jobs."]})
    if len(jobs) > MAX_BATCH_JOBS:
        raise ApplicationError(
            f"At most {MAX_BATCH_JOBS} jobs per batch.", errors={"jobs": [f"At most {MAX_BATCH_JOBS} jobs per batch."]}
        )
    if idempotency_key is not None and not IDEMPOTENCY_KEY_RE.match(idempotency_key):
        raise ApplicationError(
            "Invalid Idempotency-Key.", errors={"idempotency_key": ["1–255 printable ASCII characters, no spaces."]}
        )
    if fingerprint is None:
        fingerprint = request_fingerprint(
            {"team": team.pk if team else None, "batch": [{**item, "booking": str(getattr(item.get("booking"), "pk", item.get("booking")) or "")} for item in jobs]}
        )
    if idempotency_key is not None:
        replay = _idempotent_replay_batch(user=user, key=idempotency_key, fingerprint=fingerprint)
        if replay is not None:
            return replay, False

    team = _team_for_submit(user=user, team=team)
    errors: dict[str, dict] = {}
    prepared = []
    cache: dict = {}  # inventory and prices, read once for the whole batch
    at = timezone.now()
    for index, item in enumerate(jobs):
        try:
            spec = validate_job_spec(
                name=item.get("name"), script=item.get("script"), partition=item.get("partition"),
                gpu_type=item.get("gpu_type"), gpus=item.get("gpus"), nodes=item.get("nodes"),
                cpus_per_gpu=item.get("cpus_per_gpu"), memory_gb=item.get("memory_gb"),
                time_limit_minutes=item.get("time_limit_minutes"), workdir=item.get("workdir"),
                environment=item.get("environment"), account=team.slurm_account, ntasks=item.get("ntasks"),
                cpus_per_task=item.get("cpus_per_task"), exclusive=item.get("exclusive"), array=item.get("array"),
                qos=item.get("qos"), constraint=item.get("constraint"), cache=cache,
            )  # fmt: skip
            booking_id = _booking_id(item.get("booking"))
            if booking_id is not None:
                _check_booking(booking_id, team=team, spec=spec)
        except ApplicationError as exc:
            errors[str(index)] = exc.errors or {"non_field_errors": [exc.message]}
            continue
        prepared.append((spec, booking_id, quote_for(spec, at=at, cache=cache)))
    if errors:
        first_index = next(iter(errors))
        first = next(iter(errors[first_index].values()))[0]
        exc = ApplicationError(f"Job {first_index} of the batch cannot be submitted: {first}")
        exc.errors = errors  # keyed by index: {"3": {"gpus": [...]}}
        raise exc

    rows = []
    for index, (spec, booking_id, quote) in enumerate(prepared):
        rows.append(_job_row(
            spec, quote, team=team, user=user, booking_id=booking_id,
            idempotency_key=None if idempotency_key is None else _batch_key(idempotency_key, index), fingerprint=fingerprint,
        ))  # fmt: skip
    # One budget check per kind of estimate (GPU type priced, assumed or not, booking), for the sum
    # of its jobs; the jobs of a group are inserted before the next group's check, so that check
    # sees them as held (the same transaction, under the same team lock).
    groups: dict[tuple, list[int]] = {}
    for index, (_spec, booking_id, quote) in enumerate(prepared):
        groups.setdefault((quote.gpu_type, quote.gpu_type_assumed, booking_id), []).append(index)
    try:
        with transaction.atomic():
            for indexes in groups.values():
                quotes = [prepared[i][2] for i in indexes]
                total = JobQuote(
                    sum((q.gpu_hours for q in quotes), Decimal(0)), quotes[0].gpu_type, quotes[0].gpu_type_assumed,
                    quotes[0].price_per_gpu_hour, None, quotes[0].currency, "",
                )  # fmt: skip
                _check_budget(team, total, prepared[indexes[0]][1])
                Job.objects.bulk_create([rows[i] for i in indexes])
            JobEvent.objects.bulk_create(
                [JobEvent(job=job, state=JobState.ACCEPTED, reason="Accepted by the portal", at=job.created_at) for job in rows]
            )
            audit_record(
                actor=user, action="job.submit_batch", target=rows[0], team=team, request=request,
                data={"count": len(rows), "jobs": [str(job.pk) for job in rows],
                      "gpus": sum(job.gpus for job in rows)},
            )  # fmt: skip
            from jobs.tasks import job_relay_batch  # jobs.tasks imports this module

            after_commit(job_relay_batch, [str(job.pk) for job in rows])
    except IntegrityError:
        if idempotency_key is None:
            raise
        replay = _idempotent_replay_batch(user=user, key=idempotency_key, fingerprint=fingerprint)
        if replay is None:
            raise
        return replay, False
    return rows, True


def _idempotent_replay(*, user, key: str, fingerprint: str) -> Job | None:
    """The job an earlier request with this key created, or None; Conflict if the request differs."""
    job = Job.objects.filter(submitter=user, idempotency_key=key).select_related("team").first()
    if job is None:
        return None
    if job.request_fingerprint != fingerprint:
        raise Conflict(
            "This Idempotency-Key was already used for a different request.",
            errors={"idempotency_key": [f"Already used for job {job.pk} with a different request body."]},
        )
    return job


# ---------------------------------------------------------------- relay to Slurm


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
        account=job.team.slurm_account,
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
            slurm_job_id=slurm_job_id, slurm_cluster=settings.SLURM_CLUSTER, state=JobState.PENDING,
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
    job = Job.objects.select_related("team", "submitter__profile").get(pk=job_id)
    gateway = get_gateway()
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
    jobs = list(Job.objects.filter(relay_token=token).select_related("team", "submitter__profile"))
    gateway = get_gateway()

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
                job.slurm_job_id, job.slurm_cluster, job.state, job.submitted_at = value, settings.SLURM_CLUSTER, JobState.PENDING, now
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
                gateway.cancel(lost[pk])
    # Cancels asked while we were submitting: pass them on now.
    recorded_ids = [job.pk for job in updates if job.state == JobState.PENDING]
    if recorded_ids:
        from jobs.tasks import job_cancel_relay

        for pk in Job.objects.filter(pk__in=recorded_ids, cancel_requested_at__isnull=False).values_list("pk", flat=True):
            job_cancel_relay.delay(str(pk))
    if released:
        raise SlurmUnavailable(f"{len(released)} of {len(jobs)} jobs not relayed: {unavailable[0] if unavailable else 'time budget spent'}")
    return result


# ---------------------------------------------------------------- cancel


def _may_cancel(user, job: Job) -> bool:
    if is_admin(user) or job.submitter_id == user.pk:
        return True
    return is_manager(user, job.team_id)


def job_cancel(*, user, job: Job, request=None) -> Job:
    """Cancel a job. Allowed to its submitter, the team's managers and admins (others: 403).

    - Never relayed (ACCEPTED, no relay ever claimed it): CANCELLED in the portal, Slurm untouched.
    - Finished: Conflict 409 "Job already ended (STATE)".
    - Otherwise: cancel requested (kept on the row) and ``job_cancel_relay`` enqueued; the relay of a
      job in flight passes it on after sbatch; the sync then sees CANCELLED."""
    if not _may_cancel(user, job):
        raise ApplicationError("Only the submitter, a team manager or an admin may cancel this job.", status_code=403)
    now = timezone.now()
    with transaction.atomic():
        # Only a job no relay ever claimed can be cancelled without asking Slurm: one that was
        # claimed may sit in Slurm already (crash after sbatch) and needs the find-by-tag path.
        done = Job.objects.filter(
            pk=job.pk, state=JobState.ACCEPTED, slurm_job_id__isnull=True, relay_attempts=0
        ).update(state=JobState.CANCELLED, state_reason="Cancelled before it reached Slurm", ended_at=now, cancel_requested_at=now)
        if done:
            JobEvent.objects.create(job=job, state=JobState.CANCELLED, reason=f"Cancelled by {user} before it reached Slurm", at=now)
        else:
            requested = Job.objects.filter(pk=job.pk, state__in=LIVE_STATES).update(
                cancel_requested_at=now, cancel_sent_at=None
            )
            if not requested:
                job.refresh_from_db(fields=["state"])
                raise Conflict(f"Job already ended ({job.state}).", errors={"state": [f"Job already ended ({job.state})."]})
            from jobs.tasks import job_cancel_relay  # jobs.tasks imports this module

            after_commit(job_cancel_relay, str(job.pk))
        audit_record(
            actor=user, action="job.cancel", target=job, team=job.team, request=request,
            data={"state": job.state, "slurm_job_id": job.slurm_job_id, "before_slurm": bool(done)},
        )
    job.refresh_from_db()
    return job


def job_cancel_relay_run(job_id) -> str:
    """Pass a requested cancel on to Slurm (what the ``job_cancel_relay`` task does). Safe to repeat:
    scancel of an ended job is not an error. Raises SlurmUnavailable for the task to retry."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None or job.is_terminal or job.cancel_requested_at is None:
        return "nothing-to-do"
    gateway = get_gateway()
    if job.slurm_job_id is None:
        # Not recorded as submitted. If a relay holds the claim it will pass the cancel on itself;
        # otherwise run the relay, which adopts-and-cancels or cancels in the portal.
        outcome = job_relay_run(job_id)
        if outcome in ("not-claimed", "cancelled", "submit-failed", "already-recorded"):
            return outcome
        return "relayed-then-cancel"  # job_relay_run enqueued the cancel for the recorded id
    gateway.cancel(job.slurm_job_id)
    Job.objects.filter(pk=job.pk).update(cancel_sent_at=timezone.now())
    return "sent"


# ---------------------------------------------------------------- sync with Slurm


# Fields the sync reads and may write.
_SYNC_FIELDS = [
    "id", "state", "state_reason", "slurm_cluster", "slurm_job_id", "submitted_at", "started_at", "ended_at",
    "exit_code", "created_at", "array", "array_tasks",
]  # fmt: skip
# A job that ended in the queue but is not in accounting yet (slurmdbd lags a little) is left
# live for this long, so its final state and exit code come from accounting next cycle.
ACCOUNTING_GRACE_SECONDS = 120
# The sync asks sacct for the jobs that ended by id (-j) up to this many; beyond, for the whole
# window (one call either way; an argv of 5 000 ids is ~40 KB)
ACCOUNTING_BY_ID_MAX = 5000


def jobs_sync() -> dict:
    """Bring every live job in line with Slurm, in a constant number of queries and Slurm calls.

    One ``gateway.queue()``; at most one ``gateway.accounting(start, end)`` — only when a live job
    has left the queue or ended in it (for its final state and exit code), window = earliest
    submission among them .. now. Matching by Slurm id (checked against the tag, so a reused id
    after a cluster reset is not taken for ours) and, for ACCEPTED jobs whose relay crashed after
    sbatch, by tag (the id is adopted). Changes are computed in Python and written with one
    conditional bulk update (live rows only) and one bulk insert of events.

    Slurm unavailable: the failure is recorded (SyncStatus "jobs") and nothing changes; the next
    cycle catches up. Returns figures: live, changed, queue_calls, accounting_calls, duration_ms."""
    from portal.services import sync_record_failure, sync_record_success

    started = time.monotonic()
    live = list(Job.objects.filter(state__in=LIVE_STATES).only(*_SYNC_FIELDS))
    stats: dict[str, Any] = {"live": len(live), "changed": 0, "queue_calls": 0, "accounting_calls": 0}
    gateway = get_gateway()
    followed = [j for j in live if j.slurm_job_id is not None or j.state == JobState.ACCEPTED]
    try:
        queue = gateway.queue() if followed else []
    except SlurmUnavailable as exc:
        sync_record_failure("jobs", error=f"squeue: {exc}")
        return stats | {"error": str(exc)}
    stats["queue_calls"] = 1 if followed else 0
    in_queue = {e.job_id: e for e in queue if e.array_job_id is None}
    in_arrays = group_by_array(queue)  # array jobs: their rows folded into one (jobs.arrays)
    tagged = {e.comment: e for e in queue if e.comment.startswith(SLURM_TAG_PREFIX)}
    array_tasks: dict[uuid.UUID, dict] = {}
    array_ended = ended_tasks([j.id for j in followed if j.array and j.slurm_job_id is not None])

    # Pair each live job with its queue entry.
    entries: dict[uuid.UUID, Any] = {}
    need_accounting: list[Job] = []
    for job in followed:
        tag = f"{SLURM_TAG_PREFIX}{job.id}"
        if job.slurm_job_id is None:
            entry = tagged.get(tag)  # ACCEPTED, relay crashed after sbatch: adopt the id
            if entry is not None and entry.array_job_id is not None:
                entry = dataclasses.replace(entry, job_id=entry.array_job_id)
        else:
            tasks_missing = False
            if job.array:
                rows = [r for r in in_arrays.get(job.slurm_job_id, []) if r.comment in (tag, "")]
                entry, array_tasks[job.id] = array_view(job, rows, kind="queue", known=array_ended.get(job.id))
                # tasks the queue no longer shows (cancelled while pending, or ended long ago): accounting has them
                tasks_missing = len(set(array_tasks[job.id]) | set(array_ended.get(job.id, {}))) < job.array_tasks
            else:
                entry = in_queue.get(job.slurm_job_id)
            if entry is not None and entry.comment not in (tag, ""):
                entry = None  # a reused id (cluster reset): not ours
            if entry is None or tasks_missing or state_from_slurm(entry.state) in TERMINAL_STATES:
                need_accounting.append(job)
        if entry is not None:
            entries[job.id] = entry

    records: dict[int, Any] = {}
    accounting_ok = False
    if need_accounting:
        start = min((j.submitted_at or j.created_at) for j in need_accounting) - dt.timedelta(minutes=5)
        ids = {j.slurm_job_id for j in need_accounting if j.slurm_job_id is not None}
        stats["accounting_calls"] = 1
        try:
            # these jobs only (sacct -j), unless so many that the window read is the cheaper one
            by_id = ids if len(ids) <= ACCOUNTING_BY_ID_MAX else None
            rows = gateway.accounting(start, timezone.now(), job_ids=by_id)
            records = {r.job_id: r for r in rows if r.array_job_id is None}
            for job in need_accounting:
                if job.array and job.slurm_job_id is not None:
                    array_rows = group_by_array(rows).get(job.slurm_job_id, [])
                    record, done = array_view(job, array_rows, kind="accounting", known=array_ended.get(job.id))
                    array_tasks.setdefault(job.id, {}).update(done)
                    # one task's raw row is not the array's; the array has ended once every task has
                    records.pop(job.slurm_job_id, None)
                    if record is not None and state_from_slurm(record.state) in TERMINAL_STATES:
                        records[job.slurm_job_id] = record
            accounting_ok = True
        except SlurmUnavailable as exc:  # slurmdbd down: apply what the queue says, record the rest later
            stats["accounting_error"] = str(exc)

    now = timezone.now()
    planned: dict[uuid.UUID, dict] = {}
    for job in followed:
        record = records.get(job.slurm_job_id) if job.slurm_job_id is not None else None
        if record is not None and record.comment not in (f"{SLURM_TAG_PREFIX}{job.id}", ""):
            record = None
        values = _plan_job(job, entries.get(job.id), record, now, accounting_ok=accounting_ok)
        if values:
            planned[job.id] = values

    stats["changed"] = _apply_plan(planned, now) if planned else 0
    stats["array_tasks"] = array_tasks_record(array_tasks) if array_tasks else 0
    stats["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    data = {"duration_ms": stats["duration_ms"], "live": stats["live"], "changed": stats["changed"]}
    if "accounting_error" in stats:
        sync_record_failure("jobs", error=f"sacct: {stats['accounting_error']}")
    else:
        sync_record_success("jobs", data=data)
    return stats


def _clean_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    return "" if reason in ("None", "(null)") else reason[:1024]


def _plan_job(job: Job, entry, record, now: dt.datetime, *, accounting_ok: bool) -> dict:
    """The field values to write for one job, from its queue entry and/or accounting record
    (empty dict: nothing changes). Accounting wins once the job has ended (final state, exit code)."""
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
    if new_state is not None and transition_allowed(job.state, new_state):
        values["state"] = new_state
    state = values.get("state", job.state)
    if state != job.state or new_state == job.state:  # the source speaks about the current state
        reason = _clean_reason(entry.reason) if source is entry and state in (JobState.PENDING, JobState.REQUEUED, JobState.SUSPENDED) else ""
        if reason != job.state_reason:
            values["state_reason"] = reason
    if source.start_time and state not in (JobState.ACCEPTED, JobState.PENDING, JobState.REQUEUED) and job.started_at != source.start_time:
        values["started_at"] = source.start_time
    if state in TERMINAL_STATES:
        if job.ended_at is None:
            values["ended_at"] = source.end_time or now
        exit_code = getattr(source, "exit_code", None)
        if exit_code is not None and job.exit_code != exit_code:
            values["exit_code"] = exit_code
    return values


def _apply_plan(planned: dict[uuid.UUID, dict], now: dt.datetime) -> int:
    """Write planned changes. The rows are locked and re-read in one query so a concurrent change
    (a relay recording its id, a local cancel) is neither overwritten nor contradicted; then one bulk
    update restricted to live rows (the filter is part of its WHERE) and one bulk insert of events."""
    with transaction.atomic():
        fresh = {
            job.id: job
            for job in Job.objects.select_for_update().filter(pk__in=list(planned), state__in=LIVE_STATES).only(*_SYNC_FIELDS)
        }
        to_update: list[Job] = []
        events: list[JobEvent] = []
        ended: list[str] = []
        update_fields: set[str] = set()
        for job_id, values in planned.items():
            current = fresh.get(job_id)
            if current is None:
                continue  # ended meanwhile
            if "slurm_job_id" in values:
                if current.slurm_job_id is not None:
                    values = {k: v for k, v in values.items() if k not in ("slurm_job_id", "submitted_at")}
                else:
                    values["slurm_cluster"] = settings.SLURM_CLUSTER
            if "state" in values and not transition_allowed(current.state, values["state"]):
                values = {k: v for k, v in values.items() if k != "state"}
            if not values:
                continue
            for key, value in values.items():
                setattr(current, key, value)
            update_fields.update(values)
            to_update.append(current)
            if "state" in values:
                events.append(JobEvent(job_id=job_id, state=values["state"], reason=values.get("state_reason", ""), at=now))
                if values["state"] in TERMINAL_STATES:
                    ended.append(str(job_id))
        if to_update:
            bulk_update_values(Job.objects.filter(state__in=LIVE_STATES), to_update, sorted(update_fields))
            JobEvent.objects.bulk_create(events, batch_size=1000)
        if ended:
            from jobs.tasks import job_end_notify  # jobs.tasks imports this module

            after_commit(job_end_notify, ended)
    return len(to_update)


def job_end_notify_send(*, job_ids: list[str]) -> int:
    """Email the submitters who opted in (Profile.notify_job_end) that their jobs ended. Two queries
    and one SMTP connection for the whole batch; returns the number of emails sent."""
    from django.core.mail import send_mass_mail

    jobs = list(
        Job.objects.filter(pk__in=job_ids, state__in=TERMINAL_STATES, submitter__profile__notify_job_end=True)
        .exclude(submitter__email="")
        .select_related("submitter", "team")
        .only("id", "name", "state", "state_reason", "exit_code", "slurm_job_id", "started_at", "ended_at",
              "estimated_gpu_hours", "submitter__email", "submitter__username", "team__name")
    )  # fmt: skip
    messages = []
    for job in jobs:
        elapsed = ""
        if job.started_at and job.ended_at:
            elapsed = f"Ran for {job.ended_at - job.started_at}.\n"
        body = (
            f"Your job {job.name} (team {job.team.name}, Slurm job {job.slurm_job_id}) ended: {job.state}"
            + (f" with exit code {job.exit_code}" if job.exit_code is not None else "")
            + ".\n"
            + (f"Reason: {job.state_reason}\n" if job.state_reason else "")
            + elapsed
            + f"\nDetails and output: /jobs/{job.pk}/\n"
            + "You get this email because job-end emails are on in your profile (/account/profile/).\n"
        )
        messages.append((f"[gpuportal] {job.name}: {job.state}", body, settings.DEFAULT_FROM_EMAIL, [job.submitter.email]))
    return send_mass_mail(messages, fail_silently=False) if messages else 0


# ---------------------------------------------------------------- sweeper


def jobs_sweep() -> dict:
    """Re-enqueue work that got stuck: relays of jobs ACCEPTED for longer than
    JOB_ACCEPTED_SWEEP_SECONDS (the relay's claim and find-by-tag make a repeat harmless), and
    cancels requested but not yet passed on to Slurm. Two queries, then one enqueue per job."""
    from jobs.tasks import job_cancel_relay, job_relay

    now = timezone.now()
    cutoff = now - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS)
    relay_ids = list(
        Job.objects.filter(_lease_free(), state=JobState.ACCEPTED, created_at__lt=cutoff, cancel_requested_at__isnull=True)
        .values_list("pk", flat=True)[:1000]
    )
    cancel_ids = list(
        Job.objects.filter(state__in=LIVE_STATES, cancel_requested_at__lt=cutoff)
        .filter(Q(cancel_sent_at__isnull=True) | Q(cancel_sent_at__lt=cutoff))
        .values_list("pk", flat=True)[:1000]
    )
    for job_id in relay_ids:
        job_relay.delay(str(job_id))
    for job_id in cancel_ids:
        job_cancel_relay.delay(str(job_id))
    return {"relays": len(relay_ids), "cancels": len(cancel_ids)}


# ---------------------------------------------------------------- templates


def job_template_create(
    *,
    user,
    scope: str,
    name: str,
    script: str,
    team: Team | None = None,
    description: str = "",
    partition: str = "",
    gpu_type: str = "",
    gpus: int = 1,
    nodes: int = 1,
    cpus_per_gpu: int | None = None,
    memory_gb: int | None = None,
    time_limit_minutes: int | None = None,
    workdir: str = "",
    environment: dict | None = None,
) -> JobTemplate:
    """Save a template. Personal: for the user. Team: members of the team (a team the user cannot
    see: "No such team."). Site: admins only (403). The spec is checked like a submission except
    against the inventory (templates outlive partitions)."""
    if scope not in TemplateScope.values:
        raise ApplicationError("Unknown scope.", errors={"scope": [f"Use one of: {', '.join(TemplateScope.values)}."]})
    owner = None
    if scope == TemplateScope.PERSONAL:
        owner, team = user, None
    elif scope == TemplateScope.TEAM:
        if team is None or not is_member(user, team):
            raise ApplicationError("No such team.", errors={"team": ["No such team (or you are not a member)."]})
    else:
        team = None
        if not is_admin(user):
            raise ApplicationError("Only admins may create site templates.", errors={"scope": ["Admins only."]}, status_code=403)
    errors: dict[str, list[str]] = {}
    name = (name or "").strip()
    if not name or len(name) > 128:
        errors["name"] = ["Required, at most 128 characters."]
    if not isinstance(script, str) or not script.strip() or "\x00" in script or len(script.encode()) > MAX_SCRIPT_BYTES:
        errors["script"] = ["A non-empty script without NUL bytes, at most 1 MiB."]
    for key, value, required in (
        ("gpus", gpus, True), ("nodes", nodes, True), ("cpus_per_gpu", cpus_per_gpu, False),
        ("memory_gb", memory_gb, False), ("time_limit_minutes", time_limit_minutes, False),
    ):  # fmt: skip
        _as_int(value, key, errors, required=required)
    if workdir and (not os.path.isabs(workdir) or "%" in workdir or CONTROL_CHARS_RE.search(workdir)):
        errors["workdir"] = ["Give an absolute path without '%' or control characters."]
    environment = environment or {}
    if not isinstance(environment, dict) or len(environment) > MAX_ENV_ENTRIES or any(
        not isinstance(k, str) or not ENV_NAME_RE.match(k) or not isinstance(v, str) or "\x00" in v for k, v in environment.items()
    ):
        errors["environment"] = ["NAME: value pairs (names of letters, digits and '_'; string values without NUL)."]
    if gpu_type and (len(gpu_type) > 32 or CONTROL_CHARS_RE.search(gpu_type)):
        errors["gpu_type"] = ["At most 32 characters."]
    if partition and (len(partition) > 64 or CONTROL_CHARS_RE.search(partition)):
        errors["partition"] = ["At most 64 characters."]
    if errors:
        raise ApplicationError(f"The template cannot be saved: {next(iter(errors.values()))[0]}", errors=errors)
    template = JobTemplate(
        scope=scope, owner=owner, team=team, created_by=user, name=name, description=description or "",
        script=script, partition=partition or "", gpu_type=gpu_type or "", gpus=int(gpus), nodes=int(nodes),
        cpus_per_gpu=int(cpus_per_gpu) if cpus_per_gpu not in (None, "") else None, memory_gb=memory_gb, time_limit_minutes=time_limit_minutes,
        workdir=workdir or "", environment=environment,
    )  # fmt: skip
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError:
        raise Conflict("A template with this name exists already.", errors={"name": ["Already used in this scope."]}) from None
    return template


def job_template_delete(*, user, template: JobTemplate) -> None:
    """Delete a template: personal by its owner; team by its creator or a team manager; site by
    admins. Admins may delete any. Others: 403."""
    allowed = is_admin(user)
    if template.scope == TemplateScope.PERSONAL:
        allowed = allowed or template.owner_id == user.pk
    elif template.scope == TemplateScope.TEAM:
        allowed = allowed or template.created_by_id == user.pk or is_manager(user, template.team_id)
    if not allowed:
        raise ApplicationError("You may not delete this template.", status_code=403)
    template.delete()
