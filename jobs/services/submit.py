"""Submitting jobs: the quote, the budget holds (accounting.services.budget_holds_place, inside the
submit's transaction), submit and batch submit (exactly once: Idempotency-Key and request fingerprint).
The row is persisted first (ACCEPTED) and its relay is enqueued with ``on_commit``."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounting.services import HoldRequest, budget_holds_place
from jobs.choices import JobState
from jobs.dependencies import dependencies_record, parents_check, script_dependency_check
from jobs.estimate import JobQuote, quote_for
from jobs.job_fields import SHAPE_FIELD_NAMES, SPEC_FIELD_NAMES, STORED_FIELDS, given_fields
from jobs.models import Job, JobEvent
from jobs.services.relay import relay_drain_after_commit
from jobs.spec import ParsedScript, ValidSpec, spec_accounts, validate_job_spec
from jobs.workdirs import default_submit_dir
from portal.db import rows_insert
from portal.exceptions import ApplicationError, Conflict
from portal.models import Team
from portal.roles import is_member
from portal.services import audit_event
from portal.slurm.tags import slurm_tag

IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}\Z")  # printable ASCII, no spaces

T = TypeVar("T")


def job_quote(*, at: dt.datetime | None = None, parsed: ParsedScript | None = None, **shape: Any) -> JobQuote:
    """The most a job of this shape (the fields jobs.job_fields.SHAPE_FIELD_NAMES; another name is a
    TypeError) can use: GPU-hours = the GPUs Slurm allocates × time limit × array tasks, and its cost
    at the rate in force (the dearest type of the partition when any type will do). ``script``: its #SBATCH directives count, the fields override
    them, as for job_submit (``parsed``: its parse, when the caller has it). Validates like job_submit
    (ApplicationError naming the field)."""
    fields = given_fields(SHAPE_FIELD_NAMES, shape, what="job_quote")
    script = fields.pop("script")
    spec = validate_job_spec(name=None, script=script or None, workdir=None, environment=None,
                             check_script=bool(script), parsed=parsed, **fields)  # fmt: skip
    return quote_for(spec, at=at)


def _hold_budget(team: Team, jobs: list[Job], quotes: list[JobQuote]) -> None:
    """The jobs' budget holds (``accounting.services.budget_holds_place``, which raises Conflict, 409,
    when they do not fit the team's budget). Must run inside the transaction that inserts the jobs:
    a refusal or a failing insert leaves no hold."""
    budget_holds_place(team=team, holds=[HoldRequest(job.pk, quote, job.booking_id, tasks=job.array_tasks) for job, quote in zip(jobs, quotes, strict=True)])


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
                          time_limit_minutes=spec.time_limit_minutes, cluster=spec.capacity.cluster)  # fmt: skip


def _check_parents(user, spec: ValidSpec) -> list[Job]:
    """The jobs the job waits for, and a script's own --dependency, checked for ``user`` on the
    job's cluster (jobs.dependencies; no query for a job that names none)."""
    cluster_id = spec.capacity.cluster_id
    if any(option == "dependency" for option, _value in spec.request.options):
        script_dependency_check(user=user, request=spec.request, cluster_id=cluster_id)
    return parents_check(user=user, ids=spec.request.depends_on, cluster_id=cluster_id)


def _booking_id(booking: Any) -> uuid.UUID | None:
    if booking in (None, ""):
        return None
    value = getattr(booking, "pk", booking)
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        raise ApplicationError("Invalid booking.", errors={"booking": ["Not a booking id."]}) from None


def _job_row(spec: ValidSpec, quote: JobQuote, *, team: Team, user, booking_id, idempotency_key, fingerprint,
             job_id: uuid.UUID) -> Job:  # fmt: skip
    """The Job row for a checked spec and its estimate (not saved): the job's fields as the spec has
    them (jobs.job_fields.STORED_FIELDS), what the spec derived from them, the estimate."""
    return Job(
        id=job_id, team=team, submitter=user, **{name: getattr(spec, name) for name in STORED_FIELDS},
        booking_id=booking_id, state=JobState.ACCEPTED, array_tasks=spec.array_tasks, array_throttle=spec.array_throttle,
        output_pattern=spec.output, error_pattern=spec.error, request=spec.request.to_json(),
        estimated_gpu_seconds=quote.gpu_seconds, estimated_gpu_hours=quote.gpu_hours, estimated_cost=quote.cost,
        currency=quote.currency,
        idempotency_key=idempotency_key, request_fingerprint=fingerprint, cluster=spec.capacity.cluster_for_job(),
    )  # fmt: skip


def _check_idempotency_key(key: str | None) -> None:
    """An Idempotency-Key (None: none given) is 1-255 printable ASCII characters without spaces."""
    if key is not None and not IDEMPOTENCY_KEY_RE.match(key):
        raise ApplicationError(
            "Invalid Idempotency-Key.", errors={"idempotency_key": ["1–255 printable ASCII characters, no spaces."]}
        )


def _key_conflict(job: Job) -> Conflict:
    """The 409 of a key that ``job``'s request already used with another request body."""
    return Conflict(
        "This Idempotency-Key was already used for a different request.",
        errors={"idempotency_key": [f"Already used for job {job.pk} with a different request body."]},
    )


def _replay(find: Callable[..., T | None], *, user, key: str | None, fingerprint: str) -> T | None:
    """What an earlier request with this key created (``find``: _idempotent_replay), or None (also
    without a key); Conflict if the request differs."""
    if key is None:
        return None
    return find(user=user, key=key, fingerprint=fingerprint)


def _insert_once(insert: Callable[[], T], find: Callable[..., T | None], *, user, key: str | None,
                 fingerprint: str) -> tuple[T, bool]:  # fmt: skip
    """(what ``insert`` stores in its transaction, True); or, when another request with the same key
    won the race (the unique constraint on (submitter, key) is the only judge), (what that request
    created, False), found by ``find`` as in _replay."""
    try:
        return insert(), True
    except IntegrityError:
        replay = _replay(find, user=user, key=key, fingerprint=fingerprint)
        if replay is None:
            raise
        return replay, False


def job_submit(
    *,
    user,
    team: Team | None,
    script: str,
    booking: Any = None,
    idempotency_key: str | None = None,
    fingerprint: str | None = None,
    request=None,
    parsed: ParsedScript | None = None,
    idle_exempt: bool = False,
    **spec_fields: Any,
) -> tuple[Job, bool]:
    """Validate and store a job (ACCEPTED + first JobEvent); enqueue its relay to Slurm on commit: a
    batch of one (job_submit_batch's write path and relay), with a single job's errors and audit.

    Returns (job, created). With an ``idempotency_key``: the same user sending the same key and the
    same request again gets the first job back (created=False); the same key with another request is
    a ``Conflict`` (409). Race-safe: a unique constraint on (submitter, key) decides, not a lookup.
    ``fingerprint`` defaults to a hash of the arguments as given. A new job is recorded in the audit
    trail (``request``: the client's address).

    ``spec_fields``: the job's fields besides the script (jobs.job_fields; an unknown name is a
    TypeError). The spec is the script's #SBATCH directives with the given fields overriding them
    (None / "": the script decides); see jobs.spec.validate_job_spec. ``cluster``: where it runs when
    its partition's name is on several clusters (else the partition decides). ``parsed``: the
    script's parse when the caller has it (jobs.spec_fields.parse_script: once per request).
    ``idle_exempt``: exempt from the team's idle-GPU policy (a debugger session; its managers see it)."""
    fields = given_fields(SPEC_FIELD_NAMES, {"script": script, **spec_fields}, what="job_submit")
    if fingerprint is None:
        # every field as given (None: the script decides), as the API hashes the body it understood
        fingerprint = request_fingerprint(
            {"team": team.pk if team else None, **fields, "booking": str(getattr(booking, "pk", booking) or ""), "idle_exempt": idle_exempt}
        )
    jobs, created = _submit(user=user, team=team, items=[{**fields, "booking": booking, "parsed": parsed, "idle_exempt": idle_exempt}], idempotency_key=idempotency_key,
                            fingerprint=fingerprint, request=request, single=True)  # fmt: skip
    return jobs[0], created


MAX_BATCH_JOBS = 100


def _batch_key(key: str, index: int) -> str:
    """The idempotency key stored on job ``index`` of a batch: the client's key on the first job, a
    hash of it with the index on the others (a space: never a client key, and at most 255 chars)."""
    if index == 0:
        return key
    return f"{hashlib.sha256(key.encode()).hexdigest()} {index}"


def _idempotent_replay(*, user, key: str, fingerprint: str, count: int = MAX_BATCH_JOBS) -> list[Job] | None:
    """The jobs an earlier batch (or single job: a batch of one) with this key created, in the batch's
    order, or None; Conflict if the request differs. ``count``: the jobs of the request (a replay of
    the same request has as many; another one's first job, with the key itself, is found whatever its
    count)."""
    keys = [_batch_key(key, i) for i in range(count)]
    jobs = list(Job.objects.filter(submitter=user, idempotency_key__in=keys).select_related("team", "submitter"))
    if not jobs:
        return None
    first = next((j for j in jobs if j.idempotency_key == key), jobs[0])
    if first.request_fingerprint != fingerprint:
        raise _key_conflict(first)
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

    ``jobs``: dicts with job_submit's spec fields (jobs.job_fields, booking and idle_exempt; a missing
    one is None, other keys are not read). Every spec is
    checked with the same validation as job_submit; the errors come back keyed by the spec's index
    (``{"3": {"gpus": [...]}}``) and nothing is stored. The budget holds of all the jobs are placed at
    once (each quota checked for the sum of the jobs it covers), then the jobs are bulk-inserted with
    their ACCEPTED events and one audit event ``job.submit_batch``; the relay drain is enqueued on
    commit, as for one job (the drain relays the batch with the batched relay's machinery).
    Returns (jobs in the given order, created). ``idempotency_key`` covers the whole batch."""
    if not isinstance(jobs, list) or not jobs:
        raise ApplicationError("Give a non-empty list of jobs.", errors={"jobs": ["Give a non-empty list of jobs."]})
    if len(jobs) > MAX_BATCH_JOBS:
        raise ApplicationError(
            f"At most {MAX_BATCH_JOBS} jobs per batch.", errors={"jobs": [f"At most {MAX_BATCH_JOBS} jobs per batch."]}
        )
    if fingerprint is None:
        fingerprint = request_fingerprint(
            {"team": team.pk if team else None, "batch": [{**item, "booking": str(getattr(item.get("booking"), "pk", item.get("booking")) or "")} for item in jobs]}
        )
    return _submit(user=user, team=team, items=jobs, idempotency_key=idempotency_key, fingerprint=fingerprint,
                   request=request, single=False)  # fmt: skip


def _checked(items: list[dict], *, user, team: Team, single: bool) -> tuple[list[tuple], dict]:
    """Every item validated (jobs.spec, one inventory and price read for the batch), its booking and
    the jobs it waits for checked, its estimate made: ([(spec, booking id, quote, job id)], {job id:
    its parents}). ``single``: the first error is raised as it is; else all of them, keyed by index."""
    errors: dict[str, dict] = {}
    prepared = []
    cache: dict = {}  # inventory and prices, read once for the whole batch
    parents: dict[uuid.UUID, list[Job]] = {}  # the jobs each waits for (jobs.dependencies)
    at = timezone.now()
    accounts = spec_accounts(team)
    for index, item in enumerate(items):
        job_id = uuid.uuid4()
        try:
            spec = validate_job_spec(**{name: item.get(name) for name in SPEC_FIELD_NAMES}, **accounts, cache=cache,
                                     parsed=item.get("parsed"), tag=slurm_tag(job_id),
                                     default_submit_dir=default_submit_dir(user=user, team=team, job_id=job_id))  # fmt: skip
            booking_id = _booking_id(item.get("booking"))
            if booking_id is not None:
                _check_booking(booking_id, team=team, spec=spec)
            parents[job_id] = _check_parents(user, spec)
        except ApplicationError as exc:
            if single:
                raise
            errors[str(index)] = exc.errors or {"non_field_errors": [exc.message]}
            continue
        prepared.append((spec, booking_id, quote_for(spec, at=at, cache=cache), job_id))
    if errors:
        first_index = next(iter(errors))
        first = next(iter(errors[first_index].values()))[0]
        exc = ApplicationError(f"Job {first_index} of the batch cannot be submitted: {first}")
        exc.errors = errors  # keyed by index: {"3": {"gpus": [...]}}
        raise exc

    return prepared, parents


def _submit(*, user, team: Team | None, items: list[dict], idempotency_key: str | None, fingerprint: str, request,
            single: bool) -> tuple[list[Job], bool]:  # fmt: skip
    """The one write path of job_submit (``single``: a batch of one, its errors by field and audited as
    ``job.submit``) and job_submit_batch (errors by index, ``job.submit_batch``): replay, checks,
    then one transaction that bulk-inserts the jobs, their ACCEPTED events and the audit event and
    places their budget holds; the relay drain (group commit) is enqueued on commit."""
    _check_idempotency_key(idempotency_key)
    find = functools.partial(_idempotent_replay, count=len(items))
    replay = _replay(find, user=user, key=idempotency_key, fingerprint=fingerprint)
    if replay is not None:
        return replay, False

    team = _team_for_submit(user=user, team=team)
    prepared, parents = _checked(items, user=user, team=team, single=single)

    rows = [
        _job_row(spec, quote, team=team, user=user, booking_id=booking_id, job_id=job_id, fingerprint=fingerprint,
                 idempotency_key=None if idempotency_key is None else _batch_key(idempotency_key, index))
        for index, (spec, booking_id, quote, job_id) in enumerate(prepared)
    ]  # fmt: skip
    for job, item in zip(rows, items, strict=True):  # not a spec field: nothing Slurm gets
        job.idle_exempt = bool(item.get("idle_exempt"))
    if single:
        job = rows[0]
        audit = {"action": "job.submit", "data": {"name": job.name, "partition": job.partition, "gpu_type": job.gpu_type,
                                                  "gpus": job.gpus, "time_limit_minutes": job.time_limit_minutes}}  # fmt: skip
    else:
        audit = {"action": "job.submit_batch",
                 "data": {"count": len(rows), "jobs": [str(job.pk) for job in rows], "gpus": sum(job.gpus for job in rows)}}  # fmt: skip

    @transaction.atomic
    def insert() -> list[Job]:
        # the jobs, their first events and the audit event, in one statement (portal.db.rows_insert),
        # before the budget lock (the new rows are this transaction's own; nobody waits for them)
        created_at = timezone.now()
        for job in rows:
            job.created_at = created_at
        events = [JobEvent(job=job, state=JobState.ACCEPTED, reason="Accepted by the portal", at=created_at) for job in rows]
        rows_insert(rows, events, [audit_event(actor=user, target=rows[0], team=team, request=request, **audit)])
        dependencies_record(jobs=rows, parents=parents)
        # last (the budget lock is held from here to COMMIT): one placement for all the jobs, every
        # quota checked for the sum of its jobs, so the next submission for the team waits for one
        # statement or two and then sees them
        _hold_budget(team, rows, [quote for _spec, _booking_id, quote, _job_id in prepared])
        relay_drain_after_commit()  # the group commit: a burst of submits (or a batch), about one drain
        return rows

    return _insert_once(insert, find, user=user, key=idempotency_key, fingerprint=fingerprint)
