"""Reads for jobs. One visibility rule per model, used by the API, the pages and the CLI alike.

Who sees a job: members (any role) of the job's team, and admins. Finance users do NOT see jobs:
scripts and environments may hold research details or secrets, and finance reads costs through
accounting's reports, which aggregate per team/user without scripts.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from accounting.selectors import jobs_usage
from jobs.choices import STREAM_SUFFIX, TERMINAL_STATES, JobState, OutputStream
from jobs.models import Job, JobEvent, JobLogCopy, JobTemplate
from jobs.output_paths import expand_output_pattern
from jobs.workdirs import cluster_username
from portal.roles import is_admin, member_team_ids
from portal.slurm.parsing import SLURMD_ERROR_SIGNALS, exit_signal_text

OUTPUT_MAX_LENGTH = 1024 * 1024  # one read of job output returns at most 1 MiB
OUTPUT_DEFAULT_LENGTH = 64 * 1024


def jobs_visible_to(user) -> QuerySet[Job]:
    """Jobs of the user's teams (every role), all jobs for admins, none for anyone else (finance
    included). With team and submitter joined, so lists run a constant number of queries."""
    if not user.is_authenticated:
        return Job.objects.none()
    jobs = Job.objects.select_related("team", "submitter", "cluster")
    if is_admin(user):
        return jobs
    return jobs.filter(team_id__in=member_team_ids(user))


def job_detail(*, user, job_id) -> Job:
    """One visible job with its state history prefetched (Http404-style DoesNotExist otherwise)."""
    return jobs_visible_to(user).prefetch_related(
        Prefetch("events", queryset=JobEvent.objects.order_by("at", "pk"))
    ).get(pk=job_id)


def jobs_with_usage(jobs, tasks=()) -> list:
    """The jobs (and array task rows) with what they really used so far: ``job.usage`` is an
    accounting.selectors.JobUsage (GPU-seconds, cost, final) or None (no usage recorded yet), and
    each task row's ``usage`` its (GPU-seconds, cost) by its own Slurm id. One query for any number."""
    jobs = list(jobs)
    usage = jobs_usage([job.pk for job in jobs])  # every job of the page: one query, whatever they are
    for job in jobs:
        job.usage = usage.get(job.pk)
    by_job = {job.pk: job for job in jobs}
    for task in tasks:
        job_usage = getattr(by_job.get(task.job_id), "usage", None)
        task.usage = job_usage.tasks.get(task.slurm_job_id) if job_usage is not None and task.slurm_job_id else None
    return jobs


def job_templates_visible_to(user) -> QuerySet[JobTemplate]:
    """Personal templates of the user, team templates of the user's teams, and site templates
    (everyone logged in). Admins see every template."""
    if not user.is_authenticated:
        return JobTemplate.objects.none()
    templates = JobTemplate.objects.select_related("team", "owner")
    if is_admin(user):
        return templates
    return templates.filter(
        Q(scope="site")
        | Q(scope="personal", owner=user)
        | Q(scope="team", team_id__in=member_team_ids(user))
    )


def job_output_path(job: Job, stream: str, *, array_index: int | None = None, task_job_id: int | None = None) -> str | None:
    """Where Slurm writes the job's stdout/stderr: the patterns the job was submitted with (jobs.spec:
    the script's --output/--error, else the portal's; no stderr pattern: with stdout, as in sbatch);
    for an array job, of task ``array_index`` (default: the first). None before the job has an id,
    or when the pattern needs what is not known yet."""
    if job.slurm_job_id is None:
        return None
    pattern = job.output_pattern if stream == OutputStream.STDOUT else (job.error_pattern or job.output_pattern)
    if job.array and array_index is None:
        array_index = first_array_index(job.array)
    user = cluster_username(job.submitter)
    return expand_output_pattern(
        pattern, job_id=task_job_id or job.slurm_job_id, name=job.name, user=user,
        array_job_id=job.slurm_job_id if job.array else None, array_index=array_index if job.array else None,
    )  # fmt: skip


def first_array_index(array: str) -> int:
    from gpuportal_sbatch.directives import parse_array

    return parse_array(array)[0][0]


@dataclass(frozen=True)
class OutputChunk:
    data: str
    offset: int
    next_offset: int
    size: int
    eof: bool  # read up to the current end of the file
    final: bool  # the job has ended: the file will not grow any more
    message: str

    def as_dict(self) -> dict:
        return {
            "data": self.data, "offset": self.offset, "next_offset": self.next_offset, "size": self.size,
            "eof": self.eof, "final": self.final, "message": self.message,
        }  # fmt: skip


def _utf8_cut(raw: bytes) -> bytes:
    """Drop an incomplete UTF-8 sequence at the end of a chunk (the next read starts with it)."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte & 0x80 == 0:  # ASCII: complete
            return raw
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return raw if back >= needed else raw[:-back]
    return raw


def job_output_owner_uid(job: Job) -> int | None:
    """The uid a job's output files must belong to, for every job: the Unix user it ran as (recorded
    by the relay, or by the sync from Slurm's UserId when it adopts a job by its tag), else the
    submitter's Unix account on this host, as the relay resolves it (a job recorded before either
    existed); with SLURM_SUBMIT_AS_USER off, the portal's own uid (sbatch runs the job as its caller).
    None: no such account, and no output is shown."""
    if job.unix_uid is not None:
        return job.unix_uid
    if not settings.SLURM_SUBMIT_AS_USER:
        return os.geteuid()
    from portal.unix import unix_ids

    profile = getattr(job.submitter, "profile", None)
    ids = unix_ids(profile.cluster_username if profile else job.submitter.username)
    return ids[0] if ids else None


def job_on_kubernetes(job: Job) -> bool:
    """The job was relayed to a Kubernetes cluster (its recorded cluster's kind in the settings: no query)."""
    from portal.slurm import configured_clusters

    return bool(job.slurm_cluster) and any(c.name == job.slurm_cluster and c.is_kubernetes for c in configured_clusters())


def kubernetes_namespace(job: Job) -> str:
    """The namespace a job's Jobs are in on a Kubernetes cluster: the account its request names (the
    team's account on that cluster, portal.slurm.kube_job.job_manifests); "" when it names none."""
    from portal.slurm.types import JobRequest

    return dict(JobRequest.from_json(job.request).options).get("account") or ""


def _scheduler_output(job: Job, stream: str, *, offset: int, length: int, empty, task: int | None = None) -> OutputChunk:
    """A chunk of the output of a job on a cluster whose scheduler serves it (Kubernetes: the pod's
    log through pods/log, stdout and stderr as one), as job_output returns a file's. Once the pod is
    gone (the sync deleted the finished Job, or a cancel the running one) the copy kept before it
    (jobs.services.output; an array task's: its own, ``task``):
    read first when it is whole (an ended job's log does not change), else only when the pod's log
    cannot be had any more (a task cancelled alone while its array goes on: its own copy). One more
    query, for a job that has ended or is an array."""
    from portal.slurm import SlurmError, get_gateway
    from portal.slurm.kube_job import array_indexes

    if stream != OutputStream.STDOUT:
        return empty("On Kubernetes a job's stdout and stderr are one log: see stdout.")
    if job.slurm_job_id is None:
        return empty("The job has not reached the cluster yet; output appears once it runs.")
    final = job.state in TERMINAL_STATES
    if job.array and task is None:
        task = next(iter(array_indexes(job.array)), None)  # the first task's, as on Slurm
    # an array task's log is its own pod's, and so is its copy (task: null for a job that is not an array); a task
    # cancelled alone has its copy while its array goes on: read once its pod's log cannot be had
    copy = (JobLogCopy.objects.filter(job=job, task=task if job.array else None).only("data", "truncated").first()
            if final or job.array else None)  # fmt: skip
    if final and copy is not None and not copy.truncated:
        return _log_chunk(bytes(copy.data), offset=offset, length=length, final=True, whole=True)
    account = kubernetes_namespace(job)
    try:
        kwargs = {"task": task} if job.array else {}
        raw = get_gateway(job.slurm_cluster).job_log(job.slurm_job_id, account=account, limit_bytes=offset + length, **kwargs)
    except SlurmError as exc:
        if copy is not None:
            return _log_chunk(bytes(copy.data), offset=offset, length=length, final=True, whole=not copy.truncated)
        return empty(f"The job's log cannot be read ({exc.message}).")
    raw = raw or b""
    if not raw and copy is not None:  # its pod is gone: the copy (cut short, or a task's cancelled alone)
        return _log_chunk(bytes(copy.data), offset=offset, length=length, final=True, whole=not copy.truncated)
    if not raw and job.state in (JobState.PENDING, JobState.ACCEPTED):
        return empty("The job has not started yet; output appears once it runs.")
    return _log_chunk(raw, offset=offset, length=length, final=final, whole=None)


def _log_chunk(raw: bytes, *, offset: int, length: int, final: bool, whole: bool | None) -> OutputChunk:
    """The chunk at ``offset`` of a log read from its start (``raw``: as much as was asked for, or all
    of a kept copy). ``whole``: None for the pod's own log (it may go on past what was read), True
    for a whole copy, False for a copy cut at GPUPORTAL_K8S_LOG_COPY_MAX_BYTES, which says so at its end."""
    chunk = raw[offset : offset + length]
    more = len(raw) >= offset + length if whole is None else offset + length < len(raw)
    if more or not final:
        chunk = _utf8_cut(chunk) or chunk
    next_offset = offset + len(chunk)
    eof = not more and next_offset >= len(raw)
    message = ""
    if whole is False and eof:
        message = (f"The log was longer than the first {len(raw)} bytes the portal kept of it "
                   "(GPUPORTAL_K8S_LOG_COPY_MAX_BYTES) before its Kubernetes Job was deleted; the rest went with it.")  # fmt: skip
    return OutputChunk(chunk.decode("utf-8", errors="replace"), offset, next_offset, max(len(raw), next_offset), eof,
                       final, message)  # fmt: skip


def job_output(
    *, job: Job, stream: str = OutputStream.STDOUT, offset: int = 0, length: int = OUTPUT_DEFAULT_LENGTH,
    task: int | None = None,
) -> OutputChunk:
    """A chunk of the job's stdout or stderr from byte ``offset`` (at most ``length``, capped at
    1 MiB), decoded as UTF-8 (invalid bytes replaced; a character cut at the end is left for the
    next read). Never raises for a missing or unreadable file: ``message`` says why there is no data.
    ``task``: the array index whose output to read (array jobs; default: the first task).

    The file lives in a directory the job's user controls and the portal may run as root, so it is
    opened without following a symlink, must be a regular file, and must belong to the Unix user
    the job ran as; otherwise it is not shown."""
    if stream not in STREAM_SUFFIX:
        raise ValueError(f"unknown stream {stream!r}")
    offset = max(int(offset), 0)
    length = min(max(int(length), 1), OUTPUT_MAX_LENGTH)
    final = job.state in TERMINAL_STATES

    def empty(message: str, size: int = 0) -> OutputChunk:
        return OutputChunk("", offset, offset, size, True, final, message)

    days = settings.RETENTION_JOB_OUTPUT_DAYS
    if days and job.ended_at and job.ended_at < timezone.now() - dt.timedelta(days=days):
        return empty(f"The job ended more than {days} days ago: its output is no longer shown here (RETENTION_JOB_OUTPUT_DAYS).")
    if job_on_kubernetes(job):
        return _scheduler_output(job, stream, offset=offset, length=length, empty=empty, task=task)
    task_job_id = None
    if task is not None and job.array:
        task_job_id = job.array_task_rows.filter(index=task).values_list("slurm_job_id", flat=True).first()
    path = job_output_path(job, stream, array_index=task, task_job_id=task_job_id)
    if path is None:
        if job.state == JobState.SUBMIT_FAILED:
            return empty(f"The job never reached Slurm: {job.state_reason or 'submission failed'}.")
        if job.state == JobState.CANCELLED:
            return empty("The job was cancelled before it reached Slurm; there is no output.")
        return empty("The job has not reached Slurm yet; output appears once it runs.")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if job.state in (JobState.PENDING, JobState.ACCEPTED, JobState.REQUEUED):
            return empty("The job has not started yet; output appears once it runs.")
        if job.exit_signal in SLURMD_ERROR_SIGNALS:  # Slurm ended it before the script ran (sacct's 0:53)
            return empty(f"No output file {os.path.basename(path)} in {job.workdir}: {exit_signal_text(job.exit_signal)}")
        return empty(f"No output file {os.path.basename(path)} in {job.workdir} (not written yet, or removed).")
    except OSError as exc:
        return empty(f"The output file cannot be read ({exc.strerror or exc}).")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return empty("The output path is not a regular file; not shown.")
        owner = job_output_owner_uid(job)
        if owner is None or info.st_uid != owner:
            return empty("The output file does not belong to the job's user; not shown.")
        size = info.st_size
        if offset >= size:
            return OutputChunk("", offset, offset, size, True, final, "")
        os.lseek(fd, offset, os.SEEK_SET)
        raw = os.read(fd, length)
    except OSError as exc:
        return empty(f"The output file cannot be read ({exc.strerror or exc}).")
    finally:
        os.close(fd)
    if offset + len(raw) < size or not final:
        raw = _utf8_cut(raw) or raw  # never return nothing when something is there
    next_offset = offset + len(raw)
    return OutputChunk(raw.decode("utf-8", errors="replace"), offset, next_offset, size, next_offset >= size, final, "")
