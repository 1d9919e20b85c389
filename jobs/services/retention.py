"""What the portal keeps how long (README "Retention"; settings RETENTION_*; Celery beat "retention",
portal/project/celery.py): a job's detail expires a number of days after the job ended, the audit
trail by its age; 0 keeps a kind for ever (a site that must keep seven years sets 2557, or 0).

| kind | setting | default | what goes |
|---|---|---|---|
| GPU working rows | RETENTION_GPU_ROWS_DAYS | 7 | JobGpuUsage (and legacy JobGpuSample) of jobs whose JobGpuSummary is stored |
| GPU summary + series | RETENTION_GPU_SUMMARY_DAYS | 0 | JobGpuSummary (the figures and chart of an ended job) |
| job events | RETENTION_JOB_EVENTS_DAYS | 0 | JobEvent (the state history on the job page) |
| output references | RETENTION_JOB_OUTPUT_DAYS | 0 | the job page stops reading the output files (jobs.selectors.job_output); the copies of Kubernetes jobs' logs (JobLogCopy) go |
| audit | RETENTION_AUDIT_DAYS | 0 | AuditEvent older than that |

Never touched: the Job row itself (accounting and budgets refer to it), and everything accounting
charged: usage records and slices, holds, rates, quotas — the invoices and cost reports read only
those, so an invoice already issued and a closed month's report stay what they were
(tests/jobs/test_retention.py). Deletes go in batches of RETENTION_BATCH rows by primary key (short
transactions, no table lock, no rewrite; VACUUM makes the space reusable), at most MAX_BATCHES a kind
a run: a backlog drains over the next runs."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.choices import TERMINAL_STATES
from jobs.models import Job, JobEvent, JobGpuSummary, JobGpuUsage, JobLogCopy
from portal.models import AuditEvent, SyncStatus
from portal.services import sync_record_success

MAX_BATCHES = 20
SYNC_KIND = "retention"  # its SyncStatus row: data.events_done_after, the job events' watermark (end, id)


def _cut(days: int, now: dt.datetime) -> dt.datetime | None:
    return now - dt.timedelta(days=days) if days else None


def _delete_in_batches(queryset, *, batch: int) -> int:
    """Delete the rows of ``queryset`` RETENTION_BATCH primary keys at a time (each its own short
    statement). Returns how many went."""
    model = queryset.model
    deleted = 0
    for _ in range(MAX_BATCHES):
        pks = list(queryset.order_by().values_list("pk", flat=True)[:batch])
        if not pks:
            break
        model.objects.filter(pk__in=pks).delete()
        deleted += len(pks)
        if len(pks) < batch:
            break
    return deleted


def _job_events_expire(cut: dt.datetime, *, batch: int) -> int:
    """Events of jobs ended before ``cut``, walking the jobs by (end, id) from the last run's watermark
    (keyset; the Job BRIN index on ended_at): each run reads only the jobs that ended since."""
    status = SyncStatus.objects.filter(kind=SYNC_KIND).first()
    mark = (status.data if status else {}).get("events_done_after") or [0, ""]
    since, since_pk = dt.datetime.fromtimestamp(mark[0], tz=dt.UTC), mark[1]
    deleted = 0
    for _ in range(MAX_BATCHES):
        after = Q(ended_at__gt=since) | Q(ended_at=since, pk__gt=since_pk) if since_pk else Q(ended_at__gte=since)
        jobs = list(
            Job.objects.filter(after, state__in=TERMINAL_STATES, ended_at__lt=cut)
            .order_by("ended_at", "pk").values_list("pk", "ended_at")[:batch]
        )  # fmt: skip
        if not jobs:
            break
        deleted += JobEvent.objects.filter(job_id__in=[pk for pk, _ in jobs]).delete()[0]
        since, since_pk = jobs[-1][1], str(jobs[-1][0])
        if len(jobs) < batch:
            break
    sync_record_success(SYNC_KIND, data={"events_done_after": [since.timestamp(), since_pk]})
    return deleted


def retention_apply(*, now: dt.datetime | None = None) -> dict:
    """One run: each kind's expired rows deleted (batches). Returns how many rows of each went."""
    now = now or timezone.now()
    batch = settings.RETENTION_BATCH
    out = {}
    cut = _cut(settings.RETENTION_GPU_ROWS_DAYS, now)
    out["gpu_rows"] = _delete_in_batches(
        JobGpuUsage.objects.filter(final=True, job__gpu_summary__isnull=False, job__ended_at__lt=cut), batch=batch
    )  # fmt: skip
    cut = _cut(settings.RETENTION_GPU_SUMMARY_DAYS, now)
    out["gpu_summaries"] = _delete_in_batches(JobGpuSummary.objects.filter(ended_at__lt=cut), batch=batch) if cut else 0
    cut = _cut(settings.RETENTION_JOB_OUTPUT_DAYS, now)
    out["log_copies"] = _delete_in_batches(JobLogCopy.objects.filter(ended_at__lt=cut), batch=batch) if cut else 0
    cut = _cut(settings.RETENTION_JOB_EVENTS_DAYS, now)
    out["job_events"] = _job_events_expire(cut, batch=batch) if cut else 0
    cut = _cut(settings.RETENTION_AUDIT_DAYS, now)
    out["audit_events"] = _delete_in_batches(AuditEvent.objects.filter(at__lt=cut), batch=batch) if cut else 0
    return out
