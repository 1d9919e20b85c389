"""A job's output that outlives its scheduler (issue 41): on Kubernetes a job's output is its pod's log,
served by the API server (pods/log) only while the pod exists, and the portal deletes a finished Job,
its pod with it, GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS after it ended (jobs.services.sync). Before it
does, the log is kept here (jobs.models.JobLogCopy), and jobs.selectors.job_output — the one reader of
a job's output, for the page, the API and the CLI — serves the copy once the pod is gone. On Slurm
the output file stays where the job wrote it: nothing to keep."""

from __future__ import annotations

import logging
from collections.abc import Collection

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from jobs.models import Job, JobLogCopy
from portal.slurm import SlurmUnavailable

logger = logging.getLogger(__name__)
# Jobs whose logs are read and written together: what one batch holds in memory is at most this many
# times GPUPORTAL_K8S_LOG_COPY_MAX_BYTES (64 MiB at the 1 MiB default)
KEEP_BATCH = 64


def job_logs_keep(
    *, gateway, cluster: str, jobs: Collection[tuple[str, int]], task: int | None = None
) -> tuple[list[tuple[str, int]], list[str]]:
    """Keep the pod logs of these Jobs of a Kubernetes cluster, given as (namespace, job number):
    each job's newest started pod's log (what the reader showed while it ran) — for an array job, each
    task's (a Job and a pod of its own) — its first GPUPORTAL_K8S_LOG_COPY_MAX_BYTES (``truncated``
    when there was more), one JobLogCopy per portal job and task; ``task``: that array task's alone.
    The sync calls it for finished Jobs before it deletes them, the cancel for a job's Jobs before it
    deletes them (a running job's log so far; a task cancelled alone: its own). Returns the Jobs that may now be deleted: those whose logs are kept (now or by an
    earlier cycle), that had none (no pod of theirs started), or whose portal job is unknown — never
    one with a log that could not be read (its node's kubelet not answering, the API server down):
    that job's Jobs stay for the next cycle, their logs with them. With the setting 0, no copy is
    kept and every Job may go. Also returns a message per namespace whose logs the portal may not
    read (gateway.job_logs).

    Per batch of KEEP_BATCH jobs: one query of their portal jobs (and their copies' count), one list
    of their pods and one pods/log read a pod (gateway.job_logs), one insert."""
    cap = settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES
    jobs = sorted(set((str(namespace), int(number)) for namespace, number in jobs))
    if not cap or not jobs:
        return jobs, []
    deletable: list[tuple[str, int]] = []
    skipped: list[str] = []
    for i in range(0, len(jobs), KEEP_BATCH):
        batch = jobs[i : i + KEEP_BATCH]
        copied = Count("log_copies", filter=Q(log_copies__task=task)) if task is not None else Count("log_copies")
        rows = (Job.objects.filter(slurm_cluster=cluster, slurm_job_id__in=[n for _, n in batch])
                .annotate(copies=copied).values_list("pk", "slurm_job_id", "ended_at", "array_tasks", "copies"))  # fmt: skip
        # kept: a copy per task (an array's task that never started has none: its tasks are read again)
        known = {number: (pk, ended_at, copies >= (1 if task is not None else tasks)) for pk, number, ended_at, tasks, copies in rows}
        deletable += [(ns, n) for ns, n in batch if n not in known or known[n][2]]
        wanted = [(ns, n) for ns, n in batch if n in known and not known[n][2]]
        if not wanted:
            continue
        try:
            logs, denied = gateway.job_logs(wanted, limit_bytes=cap + 1, task=task)  # one byte more: whether the log went on
        except SlurmUnavailable as exc:
            logger.warning("cluster %s: pod logs not kept, their Jobs not deleted: %s", cluster, exc.message)
            return deletable, skipped
        skipped += [message for message in denied if message not in skipped]
        now = timezone.now()
        copies = [
            JobLogCopy(job_id=known[n][0], task=task, ended_at=known[n][1] or now, saved_at=now, pod=pod, data=data[:cap],
                       truncated=len(data) > cap)
            for _, n in wanted for task, (pod, data) in logs.get(n, {}).items() if pod
        ]  # fmt: skip
        JobLogCopy.objects.bulk_create(copies, ignore_conflicts=True)  # a copy kept meanwhile is the same log
        deletable += [(ns, n) for ns, n in wanted if n in logs]
    return deletable, skipped
