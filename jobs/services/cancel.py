"""Cancelling jobs: who may, the cancel in the portal (before Slurm saw the job) or the request
passed on to Slurm by the ``job_cancel_relay`` task."""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter

from django.db import transaction
from django.utils import timezone
from gpuportal_sbatch.directives import parse_array

from accounting.services import budget_holds_release, idle_saving_record, usage_records_upsert
from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState
from jobs.models import Job, JobArrayTask, JobEvent, JobGpuUsage
from jobs.selectors import job_on_kubernetes, kubernetes_namespace
from jobs.services.output import job_logs_keep
from jobs.services.relay import job_relay_run
from portal.exceptions import ApplicationError, Conflict
from portal.outbox import after_commit
from portal.roles import is_admin, is_manager
from portal.services import audit_record
from portal.slurm import SlurmError, SlurmRejected, get_gateway

logger = logging.getLogger(__name__)


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
            budget_holds_release(job_uuids=[job.pk], at=now)
        else:
            requested = Job.objects.filter(pk=job.pk, state__in=LIVE_STATES).update(
                cancel_requested_at=now, cancel_sent_at=None
            )
            if not requested:
                job.refresh_from_db(fields=["state"])
                raise Conflict(f"Job already ended ({job.state}).", errors={"state": [f"Job already ended ({job.state})."]})
            after_commit("jobs.tasks.job_cancel_relay", str(job.pk))
        audit_record(
            actor=user, action="job.cancel", target=job, team=job.team, request=request,
            data={"state": job.state, "slurm_job_id": job.slurm_job_id, "before_slurm": bool(done)},
        )
    job.refresh_from_db()
    return job


def job_cancel_relay_run(job_id) -> str:
    """Pass a requested cancel on to Slurm (what the ``job_cancel_relay`` task does). Safe to repeat:
    scancel of an ended job is not an error. Raises SlurmUnavailable for the task to retry."""
    job = Job.objects.filter(pk=job_id).select_related("cluster").first()
    if job is None or job.is_terminal or job.cancel_requested_at is None:
        return "nothing-to-do"
    gateway = get_gateway(job.cluster.name)
    if job.slurm_job_id is None:
        # Not recorded as submitted. If a relay holds the claim it will pass the cancel on itself;
        # otherwise run the relay, which adopts-and-cancels or cancels in the portal.
        outcome = job_relay_run(job_id)
        if outcome in ("not-claimed", "cancelled", "submit-failed", "already-recorded"):
            return outcome
        return "relayed-then-cancel"  # job_relay_run enqueued the cancel for the recorded id
    if job.cancel_reason:
        # the portal's own cancel (the idle-GPU policy): its reason in Slurm's record first; Slurm
        # refusing it (the portal not root nor SlurmUser) must not keep the job from being cancelled
        try:
            gateway.admin_comment_set(job.slurm_job_id, job.cancel_reason)
        except SlurmRejected as exc:
            logger.warning("AdminComment of Slurm job %s refused: %s", job.slurm_job_id, exc)
    if job_on_kubernetes(job):
        _logs_keep_before_delete(gateway, job)
    ran = gateway.cancel(job.slurm_job_id)
    if ran:  # Kubernetes: no accounting keeps what ran up to the deletion — recorded now, final (an array: a list)
        usage_records_upsert(records=ran if isinstance(ran, list) else [ran], now=timezone.now(), cluster=job.cluster.name)
    Job.objects.filter(pk=job.pk).update(cancel_sent_at=timezone.now())
    return "sent"


def _logs_keep_before_delete(gateway, job: Job, *, task: int | None = None) -> None:
    """Kubernetes: the cancel deletes the job's Jobs, and with their pods go their logs (the job's
    output): kept first, a running job's log so far, each task's for an array — or the one task's
    being cancelled alone (``task``) — (job_logs_keep, as the sync keeps a finished job's). A log that
    cannot be read now (its node's kubelet not answering) is lost and said in the log: a user's
    cancel does not wait for it."""
    what = f"job {job.pk}" + (f" task {task}" if task is not None else "")
    try:
        kept, _ = job_logs_keep(gateway=gateway, cluster=job.cluster.name,
                                jobs=[(kubernetes_namespace(job), job.slurm_job_id)], task=task)  # fmt: skip
    except SlurmError as exc:
        logger.warning("%s: its log not kept before its cancel: %s", what, exc.message)
        return
    if not kept:
        logger.warning("%s: its log could not be read before its cancel: lost with its Kubernetes Job", what)


def job_array_task_cancel(*, user, job: Job, index: int, request=None) -> Job:
    """Cancel one task of a live array job (``scancel <array>_<index>``), for whoever may cancel the
    job. Not an array / not in Slurm yet / unknown index: 400; the job or the task ended: 409. As a
    whole job's cancel: the request is kept on the task's row (``cancel_requested_at``) and
    ``job_array_task_cancel_relay`` enqueued — the web process does not talk to the scheduler —,
    which passes it on (job_array_task_cancel_relay_run); the other tasks go on."""
    if not _may_cancel(user, job):
        raise ApplicationError("Only the submitter, a team manager or an admin may cancel this job.", status_code=403)
    if not job.array:
        raise ApplicationError("Not an array job.", errors={"task": ["This job has no array tasks; cancel the job."]})
    if job.state in TERMINAL_STATES:
        raise Conflict(f"Job already ended ({job.state}).", errors={"state": [f"Job already ended ({job.state})."]})
    if job.slurm_job_id is None:
        raise ApplicationError("The job has not reached Slurm yet.", errors={"task": ["Cancel the whole job until it reaches Slurm."]})
    if index not in parse_array(job.array)[0]:
        raise ApplicationError(f"No task {index}.", errors={"task": [f"The array is {job.array}."]})
    now = timezone.now()
    with transaction.atomic():
        task, _ = JobArrayTask.objects.select_for_update().get_or_create(job=job, index=index)
        if task.state in TERMINAL_STATES:
            message = f"Task {index} already ended ({task.state})."
            raise Conflict(message, errors={"task": [message]})
        task.cancel_requested_at = now
        task.save(update_fields=["cancel_requested_at"])
        after_commit("jobs.tasks.job_array_task_cancel_relay", str(job.pk), index)
        audit_record(actor=user, action="job.cancel_task", target=job, team=job.team, request=request,
                     data={"slurm_job_id": job.slurm_job_id, "index": index})  # fmt: skip
    return job


def job_array_task_cancel_relay_run(job_id, index: int) -> str:
    """Pass a requested cancel of one array task on to the scheduler (what the
    ``job_array_task_cancel_relay`` task does): on Kubernetes the task's pod log is kept first
    (_logs_keep_before_delete, as a whole job's cancel keeps its tasks'), then its Job deleted; the
    task recorded CANCELLED. Safe to repeat. A refusal (the job gone from the scheduler) is logged and
    leaves the task to the sync; raises SlurmUnavailable for the task to retry."""
    task = (JobArrayTask.objects.filter(job_id=job_id, index=index, cancel_requested_at__isnull=False)
            .select_related("job__cluster").first())  # fmt: skip
    if task is None or task.state in TERMINAL_STATES or task.job.is_terminal or task.job.slurm_job_id is None:
        return "nothing-to-do"
    job = task.job
    gateway = get_gateway(job.cluster.name)
    if job_on_kubernetes(job):
        _logs_keep_before_delete(gateway, job, task=index)
    try:
        gateway.cancel_array_task(job.slurm_job_id, index)
    except SlurmRejected as exc:
        logger.warning("job %s: task %s not cancelled: %s", job.pk, index, exc.message)
        return "rejected"
    # the scheduler took it: the task is cancelled (a pending one may never show as a row of its own)
    JobArrayTask.objects.filter(pk=task.pk).exclude(state__in=TERMINAL_STATES).update(state=JobState.CANCELLED)
    return "sent"


IDLE_CANCEL_REASON = "gpuportal: cancelled, idle GPUs"


def _saved_gpu_seconds(job: Job, *, gpus: int, at: dt.datetime) -> int:
    """What the job would still have held had the portal not cancelled it: its GPUs × (its time limit's
    end − ``at``), from its start (an array: each running task's GPU rows from that task's start).
    Whole seconds, never negative."""
    limit = dt.timedelta(minutes=job.time_limit_minutes)
    if job.array:
        starts = dict(JobArrayTask.objects.filter(job=job, state=JobState.RUNNING, started_at__isnull=False)
                      .values_list("index", "started_at"))  # fmt: skip
        per_task = Counter(JobGpuUsage.objects.filter(job=job, final=False, task_index__in=list(starts)).values_list("task_index", flat=True))
        return sum(n * max(0, int((starts[index] + limit - at).total_seconds())) for index, n in per_task.items())
    if job.started_at is None:
        return 0
    return gpus * max(0, int((job.started_at + limit - at).total_seconds()))


def job_idle_cancel(*, job_id, gpus: int, idle_since: dt.datetime, threshold_percent: float, now: dt.datetime) -> bool:
    """Cancel a running job for its team's idle-GPU policy (jobs.services.gpu_alerts decides when):
    once (a conditional update: live, no cancel asked yet, not exempt), with the reason kept on the
    row for Slurm's AdminComment and the CANCELLED event, a history event now, the GPU-seconds saved
    handed to accounting (idle_saving_record), the audit event; the relay task sends it after commit.
    Returns whether this call cancelled it."""
    minutes = max(0, int((now - idle_since).total_seconds() // 60))
    reason = f"{IDLE_CANCEL_REASON} (all {gpus} under {threshold_percent:g} % for {minutes} min; team policy)"
    with transaction.atomic():
        done = Job.objects.filter(
            pk=job_id, state=JobState.RUNNING, cancel_requested_at__isnull=True, idle_exempt=False
        ).update(cancel_requested_at=now, cancel_sent_at=None, cancel_reason=reason[:255])
        if not done:
            return False
        job = Job.objects.select_related("team").get(pk=job_id)
        saved = _saved_gpu_seconds(job, gpus=gpus, at=now)
        JobEvent.objects.create(job=job, state=job.state, reason=f"Cancel requested: idle GPUs — {reason}", at=now)
        idle_saving_record(job_uuid=job.pk, team=job.team, cluster=job.slurm_cluster, gpu_type=job.gpu_type, gpus=gpus,
                           gpu_seconds=saved, idle_since=idle_since, at=now)  # fmt: skip
        audit_record(actor=None, action="job.idle_cancel", target=job, team=job.team,
                     data={"slurm_job_id": job.slurm_job_id, "gpus": gpus, "saved_gpu_seconds": saved, "reason": reason})  # fmt: skip
        after_commit("jobs.tasks.job_cancel_relay", str(job.pk))
    return True
