"""Job dependencies: a job that waits for other jobs to complete successfully (Slurm's afterok).
The one owner of the rule, from the submission to Slurm and back.

- **Submitted** (``parents_check``): the ``depends_on`` field names portal jobs the submitter may see
  (``jobs_visible_to``: another team's job is "no such job", as everywhere), on the job's own cluster
  (a Slurm dependency names a job of the same controller), none that already ended otherwise than
  COMPLETED (it could never start). The field overrides a script's ``#SBATCH --dependency``, as
  sbatch's command line does (jobs.spec replaces that directive). A script's own ``--dependency``
  keeps working, Slurm ids and all; every job id it names must be a Slurm job of the submitter's
  visible jobs on that cluster (``script_dependency_check``), so a member cannot learn from Slurm
  how another team's job ended.
- **Relayed**: a job is not claimed while a parent still waits for its Slurm id (``relay_ready_sql``:
  the claim's condition; the drain takes it in the round after its parent's); on Kubernetes, which
  has no dependencies, while a parent is still live (the sync publishes the drain when one ends). Its dependency is
  then ``afterok`` on its parents' Slurm ids (``dependency_option``): a parent that COMPLETED is left
  out (Slurm may have forgotten it), one that ended any other way cancels the job in the portal with
  that reason.
- **In Slurm**: a job whose dependency can never be satisfied (a parent failed after it was sent:
  Slurm's pending reason ``DependencyNeverSatisfied``) is cancelled by the sync with that reason
  (``never_satisfied_cancel``): Slurm 22.05 and 25.11 would keep it pending forever, holding its
  budget, unless the site set ``kill_invalid_depend``."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterable

from django.db import transaction
from django.db.models import Case, Value, When

from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState
from jobs.job_fields import FIELDS
from jobs.models import Job, JobArrayTask, JobDependency, JobEvent
from jobs.selectors import jobs_visible_to
from portal.exceptions import ApplicationError
from portal.models import Cluster
from portal.outbox import after_commit
from portal.slurm import JobRequest, SlurmRejected
from portal.slurm.clusters import KUBERNETES

MAX_PARENTS = FIELDS["depends_on"].max_length  # jobs one job may wait for (the API's limit too)
NEVER_SATISFIED = "DependencyNeverSatisfied"  # Slurm's pending reason (WAIT_DEP_INVALID)

# sbatch's --dependency: items joined by ',' (all) or '?' (any); each "singleton" or TYPE:ID[:ID...],
# an ID a job id, an array task (ID_TASK) or, for "after", ID+MINUTES
_DEPENDENCY_TYPES = {"after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok"}
_DEPENDENCY_ID_RE = re.compile(r"^(\d+)(?:_(\d+))?(?:\+(\d+))?\Z")


def _refuse(message: str) -> ApplicationError:
    return ApplicationError(message, errors={"depends_on": [message]})


def parents_check(*, user, ids: Iterable, cluster_id) -> list[Job]:
    """The jobs ``ids`` names (portal job ids, as jobs.spec cleaned them: in order, each once),
    checked for a job of ``user`` on the cluster ``cluster_id``; ApplicationError naming
    ``depends_on`` otherwise. No query when there are none."""
    wanted = [uuid.UUID(str(value)) for value in ids]
    if not wanted:
        return []
    found = {job.pk: job for job in jobs_visible_to(user).select_related(None).filter(pk__in=wanted).only("id", "state", "cluster_id")}
    for job_id in wanted:
        parent = found.get(job_id)
        if parent is None:
            raise _refuse(f"No job {job_id} that you may see.")
        if parent.cluster_id != cluster_id:
            raise _refuse(f"Job {job_id} runs on another cluster: a job can only wait for jobs of its own cluster.")
        if parent.state in TERMINAL_STATES and parent.state != JobState.COMPLETED:
            raise _refuse(f"Job {job_id} ended {parent.state}: a job that waits for its success would never start.")
    return [found[job_id] for job_id in wanted]


def script_dependency_check(*, user, request: JobRequest, cluster_id) -> None:
    """A script's own ``--dependency`` (left in the request: no ``depends_on`` replaced it): its form
    as sbatch reads it, and every job id in it a Slurm job of ``user``'s visible jobs on the cluster
    (a job's id, or one of its array tasks'); ApplicationError naming the script's line otherwise."""
    for (option, value), line in zip(request.options, request.lines, strict=True):
        if option != "dependency":
            continue
        where = f"line {line}: #SBATCH --dependency" if line else "--dependency"
        ids, problem = _dependency_ids(value or "")
        if problem:
            raise ApplicationError(f"{where}: {problem}", errors={"script": [f"{where}: {problem}"]})
        visible = jobs_visible_to(user).filter(cluster_id=cluster_id)
        known = set(visible.filter(slurm_job_id__in=ids).values_list("slurm_job_id", flat=True))
        known |= set(JobArrayTask.objects.filter(job__in=visible, slurm_job_id__in=ids - known).values_list("slurm_job_id", flat=True))
        if unknown := sorted(ids - known):
            message = f"{where}: no job {unknown[0]} of yours on this cluster (name jobs of the portal you may see)."
            raise ApplicationError(message, errors={"script": [message]})


def _dependency_ids(value: str) -> tuple[set[int], str]:
    """The Slurm job ids a --dependency value names, or a problem in words."""
    ids: set[int] = set()
    for item in re.split(r"[,?]", value.strip()):
        kind, _, rest = item.partition(":")
        if kind == "singleton" and not rest:
            continue
        if kind not in _DEPENDENCY_TYPES or not rest:
            return set(), f"{item!r} is not a dependency sbatch knows (TYPE:JOBID[:JOBID…] or singleton)."
        for word in rest.split(":"):
            match = _DEPENDENCY_ID_RE.match(word)
            if match is None or (match.group(3) and kind != "after"):
                return set(), f"{word!r} is not a job id."
            ids.add(int(match.group(1)))
    return ids, ""


def depends_on_clean(value, errors) -> tuple[str, ...]:
    """The ``depends_on`` field as given (a list of job ids; None or empty: not given) as the
    request keeps it: each id once, in order, as text; a problem added to ``errors`` (jobs.spec)."""
    if value in (None, "", (), []):
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        errors.add("depends_on", "Give a list of job ids.")
        return ()
    cleaned: list[str] = []
    for item in value:
        try:
            job_id = str(item if isinstance(item, uuid.UUID) else uuid.UUID(str(item)))
        except ValueError:
            errors.add("depends_on", f"{str(item)[:40]!r} is not a job id.")
            return ()
        if job_id not in cleaned:
            cleaned.append(job_id)
    if len(cleaned) > MAX_PARENTS:
        errors.add("depends_on", f"At most {MAX_PARENTS} jobs.")
        return ()
    return tuple(cleaned)


def dependencies_record(*, jobs: list[Job], parents: dict) -> None:
    """The dependency rows of new jobs (``parents``: job pk -> its checked parents), one insert."""
    rows = [JobDependency(job=job, parent=parent) for job in jobs for parent in parents.get(job.pk, ())]
    if rows:
        JobDependency.objects.bulk_create(rows)


def relay_ready_sql(job: str) -> str:
    """The relay's claim condition, as SQL on the jobs_job row aliased ``job`` (the claim is one
    statement of its own text: jobs.services.relay): no parent of the job still waits for its Slurm
    id; on a scheduler that has no dependencies (Kubernetes), no parent still live: the portal holds
    the job until each has ended (dependency_option then sends it, or fails it)."""
    states = [JobState.ACCEPTED, *LIVE_STATES]
    if not all(re.fullmatch(r"[A-Z_]+", state) for state in states) or not re.fullmatch(r"[a-z]+", KUBERNETES):
        raise ValueError("relay_ready_sql: a state or kind is not a plain SQL literal")
    live = ", ".join(f"'{state}'" for state in LIVE_STATES)
    dependencies, jobs, clusters = JobDependency._meta.db_table, Job._meta.db_table, Cluster._meta.db_table
    return (
        f"NOT EXISTS (SELECT 1 FROM {dependencies} d JOIN {jobs} p ON p.id = d.parent_id WHERE d.job_id = {job}.id "
        f"AND (p.state = '{JobState.ACCEPTED}' OR (p.state IN ({live}) AND EXISTS (SELECT 1 FROM {clusters} k "
        f"WHERE k.id = {job}.cluster_id AND k.kind = '{KUBERNETES}'))))"
    )


def dependents_waiting(parent_ids: list) -> bool:
    """Whether a job waits in the portal for one of ``parent_ids`` (which just ended or got their
    Slurm ids): its relay is due now, not at the next sweep (one query)."""
    return JobDependency.objects.filter(parent__in=parent_ids, job__state=JobState.ACCEPTED).exists()


def parents_of(job_ids: list) -> dict:
    """Each job's parents as the relay needs them (one query): job pk -> [(parent pk, state, Slurm id)]."""
    found: dict = {}
    rows = JobDependency.objects.filter(job__in=job_ids).values_list("job_id", "parent_id", "parent__state", "parent__slurm_job_id")
    for job_id, parent_id, state, slurm_job_id in rows:
        found.setdefault(job_id, []).append((parent_id, state, slurm_job_id))
    return found


def dependency_option(parents: list) -> str:
    """The --dependency value of a job whose parents are ``parents`` (parents_of): afterok on the
    Slurm ids of those not COMPLETED ("" when every one has). SlurmRejected, with the reason, when
    one ended otherwise: the job can never start."""
    waiting = []
    for parent_id, state, slurm_job_id in sorted(parents, key=lambda p: p[2] or 0):
        if state == JobState.COMPLETED:
            continue
        if state in TERMINAL_STATES:
            raise SlurmRejected(f"Job {parent_id}, which this job waits for, ended {state}: it can never start.")
        waiting.append(str(slurm_job_id))
    return f"afterok:{':'.join(waiting)}" if waiting else ""


def never_satisfied_cancel(*, job_ids: list, now: dt.datetime) -> int:
    """Cancel, through the relay, the live jobs among ``job_ids`` that Slurm says can never start
    (reason DependencyNeverSatisfied), recording why in their history. Returns how many."""
    with transaction.atomic():
        ids = list(
            Job.objects.select_for_update()
            .filter(pk__in=job_ids, state__in=LIVE_STATES, cancel_requested_at__isnull=True)
            .values_list("pk", flat=True)
        )
        if not ids:
            return 0
        failed = dict(
            JobDependency.objects.filter(job__in=ids, parent__state__in=TERMINAL_STATES - {JobState.COMPLETED})
            .values_list("job_id", "parent_id")
        )  # fmt: skip
        why = {pk: _never_why(failed.get(pk)) for pk in ids}
        # the reason kept on the row goes into Slurm's AdminComment before the scancel, as for the
        # idle-GPU policy's cancel (jobs.services.cancel.job_cancel_relay_run): one UPDATE
        Job.objects.filter(pk__in=ids).update(
            cancel_requested_at=now, cancel_sent_at=None,
            cancel_reason=Case(*(When(pk=pk, then=Value(f"gpuportal: cancelled, {reason}"[:255])) for pk, reason in why.items())),
        )  # fmt: skip
        JobEvent.objects.bulk_create([
            JobEvent(job_id=pk, state=JobState.PENDING, at=now, reason=f"Cancelled by the portal: {why[pk]}")
            for pk in ids
        ])  # fmt: skip
        for pk in ids:
            after_commit("jobs.tasks.job_cancel_relay", str(pk))
    return len(ids)


def _never_why(parent_id) -> str:
    if parent_id is None:
        return "Slurm says its dependency can never be satisfied."
    return f"job {parent_id}, which it waits for, did not complete successfully; it can never start."
