"""What the GPUs did: one Prometheus range query per cycle for every job's GPUs (portal/prometheus.py),
folded into one JobGpuUsage row per GPU a job holds (running figures), then the rows of ended jobs
frozen into one JobGpuSummary a job (their figures and one downsampled series, read back from
Prometheus by one more range query for the jobs frozen that cycle), and the idle-GPU alerts checked.
The raw points stay in Prometheus: a running job's chart reads them there (jobs.gpu_report).

A cycle reads from where the last one ended (SyncStatus "gpu-usage", ``data.until``) to now, aligned
to GPU_USAGE_STEP_SECONDS, so each step is read once whatever the schedule; after an outage it
catches up (at most GPU_USAGE_MAX_CATCHUP_HOURS: Prometheus kept the data). Prometheus unreachable:
the failure is recorded, nothing changes, the pages say the figures are late (never an error)."""

from __future__ import annotations

import datetime as dt
import math
import time
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from accounting.models import UsageRecord
from accounting.services import usage_busy_record
from jobs import gpu_summary
from jobs.choices import TERMINAL_STATES
from jobs.gpu_report import SYNC_KIND
from jobs.services.gpu_alerts import job_idle_policies
from jobs.models import Job, JobArrayTask, JobGpuSample, JobGpuSummary, JobGpuUsage
from portal import prometheus
from portal.db import bulk_insert_copy, bulk_update
from portal.models import SyncStatus

# the first cycle ever reads this far back
FIRST_LOOKBACK = dt.timedelta(minutes=10)
# a job's rows are final this many steps after its end (the exporter's last points are in)
FINAL_AFTER_STEPS = 2
# at most this many jobs are frozen a cycle (one range query for all of them; the rest next cycle)
FINALISE_JOBS_PER_CYCLE = 500
_USAGE_FIELDS = ["model_name", "samples", "util_sum", "util_peak", "idle_samples", "mem_sum", "mem_samples",
                 "mem_peak", "first_at", "last_at", "idle_since"]  # fmt: skip


def _aligned(at: dt.datetime, step: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(at.timestamp()) // step * step, tz=dt.timezone.utc)


def _owners(series: list[prometheus.GpuSeries]) -> dict[tuple[str, int], tuple[str, int | None]]:
    """(cluster label, Slurm id) -> (job pk, array task index) for the ids the series name: portal jobs
    by their Slurm id, array tasks by their own (two indexed look-ups for the whole cycle)."""
    ids = {int(s.job) for s in series if s.job.isdigit()}
    if not ids:
        return {}
    owners: dict[tuple[str, int], tuple[str, int | None]] = {}
    for pk, slurm_id, cluster in Job.objects.filter(slurm_job_id__in=ids, array="").values_list(
        "pk", "slurm_job_id", "slurm_cluster"
    ):
        owners[(cluster, slurm_id)] = (pk, None)
    for pk, slurm_id, index, cluster in JobArrayTask.objects.filter(slurm_job_id__in=ids).values_list(
        "job_id", "slurm_job_id", "index", "job__slurm_cluster"
    ):
        owners[(cluster, slurm_id)] = (pk, index)
    return owners


def _owner(owners: dict, series: prometheus.GpuSeries):
    slurm_id = int(series.job)
    if settings.GPU_LABEL_CLUSTER:
        return owners.get((series.cluster, slurm_id))
    matches = [v for (cluster, sid), v in owners.items() if sid == slurm_id]
    return matches[0] if len(matches) == 1 else None


def gpu_usage_record(series: list[prometheus.GpuSeries], *, step: int) -> dict:
    """Fold the points into the usage rows (one upsert; a point already counted is skipped; the points
    themselves stay in Prometheus). Returns figures: gpus, points (counted)."""
    owners = _owners(series)
    default_threshold = settings.GPU_IDLE_THRESHOLD_PERCENT
    wanted: dict[tuple, tuple[prometheus.GpuSeries, tuple]] = {}
    for s in series:
        owner = s.job.isdigit() and _owner(owners, s)
        if owner:
            wanted[(owner[0], int(s.job), s.host, s.gpu)] = (s, owner)
    if not wanted:
        return {"gpus": 0, "points": 0}
    job_ids = {key[0] for key in wanted}
    # a job under its team's idle-GPU policy: idle is under the policy's threshold (one query)
    thresholds = {pk: policy.threshold_percent for pk, policy in job_idle_policies(job_ids).items()}
    with transaction.atomic():
        existing = {
            (u.job_id, u.slurm_job_id, u.host, u.gpu): u
            for u in JobGpuUsage.objects.select_for_update().filter(job_id__in=job_ids, final=False)
        }
        # frozen already: late points of an ended job are not counted twice
        frozen = set(JobGpuUsage.objects.filter(job_id__in=job_ids, final=True).values_list("job_id", "slurm_job_id", "host", "gpu"))
        rows, points = [], 0
        for key, (s, (job_pk, task_index)) in wanted.items():
            usage = existing.get(key) or JobGpuUsage(
                job_id=job_pk, task_index=task_index, slurm_job_id=key[1], host=s.host, gpu=s.gpu, step_seconds=step,
                first_at=s.points[0][0], last_at=s.points[0][0] - dt.timedelta(seconds=step),
            )  # fmt: skip
            if key in frozen:
                continue
            usage.model_name = s.model or usage.model_name
            fresh = [(at, util, mem) for at, util, mem in s.points if at > usage.last_at]
            threshold = thresholds.get(job_pk, default_threshold)
            for at, util, mem in fresh:
                usage.samples += 1
                usage.util_sum += util
                usage.util_peak = max(usage.util_peak, util)
                if util < threshold:
                    usage.idle_samples += 1
                    # the idle run starts with the step this sample covers
                    usage.idle_since = usage.idle_since or at - dt.timedelta(seconds=step)
                else:
                    usage.idle_since = None
                if mem is not None:
                    usage.mem_samples += 1
                    usage.mem_sum += mem
                    usage.mem_peak = max(usage.mem_peak, mem)
                usage.last_at = at
            if fresh or usage.pk is None:
                rows.append(usage)
                points += len(fresh)
        # the rows locked above: portal.db.bulk_update (one UPDATE from VALUES or from a COPY); new ones: one COPY
        bulk_update(JobGpuUsage, [u for u in rows if u.pk is not None], _USAGE_FIELDS)
        bulk_insert_copy([u for u in rows if u.pk is None])
    return {"gpus": len(rows), "points": points}


# ended jobs whose usage record has no busy share yet are looked at this long after their end
# (the usage ingestion may bring the final record after the GPU rows were frozen)
BUSY_HANDOVER_WITHIN = dt.timedelta(hours=6)


def gpu_busy_hand_over(*, job_ids, now: dt.datetime) -> int:
    """Give accounting each (job, Slurm id)'s busy share of its GPU-time (accounting.services.
    usage_busy_record): mean utilisation over its GPU rows / 100. For ``job_ids`` (seen this cycle)
    and the ended jobs whose record still has none. Two reads, one bulk update."""
    recent = UsageRecord.objects.filter(
        gpu_busy_fraction__isnull=True, portal_job_uuid__isnull=False, known_until__gte=now - BUSY_HANDOVER_WITHIN
    ).values_list("portal_job_uuid", flat=True)
    rows = (
        JobGpuUsage.objects.filter(job_id__in=set(job_ids) | set(recent), samples__gt=0)
        .values("job_id", "slurm_job_id")
        .annotate(util=Sum("util_sum"), samples=Sum("samples"))
    )
    fractions = {(r["job_id"], r["slurm_job_id"]): Decimal(r["util"]) / Decimal(100 * r["samples"]) for r in rows}
    return usage_busy_record(fractions=fractions)


def _ended_series(rows: list[JobGpuUsage], *, step: int) -> dict[int, list] | None:
    """The points of ``rows`` (GPUs of ended jobs) as Prometheus still has them: one range query at the
    sync's step (coarser when the span would pass Prometheus's 11 000 points a series). Position in
    ``rows`` → points; None when Prometheus did not answer."""
    if not prometheus.enabled():
        return {}
    start = min(r.first_at for r in rows) - dt.timedelta(seconds=step)
    end = max(r.last_at for r in rows)
    span = (end - start).total_seconds()
    query_step = step * max(1, math.ceil(span / step / (prometheus.MAX_POINTS_PER_SERIES - 1)))
    try:
        series = prometheus.gpu_series(start, end, query_step, jobs=[r.slurm_job_id for r in rows])
    except prometheus.PrometheusUnavailable:
        return None
    return gpu_summary.series_of_rows(rows, series)


def gpu_usage_finalise(*, now: dt.datetime, step: int) -> int:
    """Freeze the rows of jobs that ended FINAL_AFTER_STEPS steps ago or more (at most
    FINALISE_JOBS_PER_CYCLE jobs): each job's figures and one downsampled series (from Prometheus,
    one range query for them all) become its JobGpuSummary, for good. Prometheus not answering: the
    rows wait for the next cycle. Three queries (the rows, the records, the freeze). Returns the
    number of rows frozen."""
    done = now - dt.timedelta(seconds=step * FINAL_AFTER_STEPS)
    jobs = (
        JobGpuUsage.objects.filter(final=False, job__state__in=TERMINAL_STATES, job__ended_at__lte=done)
        .order_by("job_id").values("job_id").distinct()[:FINALISE_JOBS_PER_CYCLE]
    )  # fmt: skip
    # every row of each job (an array's tasks too): a job's record is written once, whole
    rows = list(
        JobGpuUsage.objects.filter(job_id__in=jobs, final=False)
        .annotate(ended=F("job__ended_at"), cluster_name=F("job__slurm_cluster"))
        .order_by("job_id", "task_index", "host", "gpu")
    )  # fmt: skip
    if not rows:
        return 0
    points = _ended_series(rows, step=step)
    if points is None:
        return 0
    per_job: dict = {}
    for i, row in enumerate(rows):
        per_job.setdefault(row.job_id, []).append((row, points.get(i, [])))
    records = [
        JobGpuSummary(job_id=job_id, ended_at=mine[0][0].ended, data=gpu_summary.summary_encode(
            [r for r, _ in mine], {i: p for i, (_, p) in enumerate(mine)}, minimum_width=settings.GPU_SERIES_MIN_BUCKET_SECONDS))
        for job_id, mine in per_job.items()
    ]  # fmt: skip
    with transaction.atomic():
        JobGpuSummary.objects.bulk_create(records, ignore_conflicts=True)
        return JobGpuUsage.objects.filter(pk__in=[r.pk for r in rows], final=False).update(final=True)


def gpu_usage_sync(*, now: dt.datetime | None = None) -> dict:
    """One cycle (periodic: portal/project/celery.py, gpu-usage-sync): ONE range query for every GPU a job
    holds since the last cycle, folded in (``gpu_usage_record``), ended jobs frozen, idle alerts
    checked (jobs.services.gpu_alerts). Returns figures; ``error`` when Prometheus failed."""
    from jobs.services.gpu_alerts import gpu_idle_alerts_check
    from portal.services import sync_record_failure, sync_record_success

    if not prometheus.enabled():
        return {"skipped": "PROMETHEUS_URL is not set"}
    started = time.monotonic()
    step = settings.GPU_USAGE_STEP_SECONDS
    now = now or timezone.now()
    end = _aligned(now, step)
    status = SyncStatus.objects.filter(kind=SYNC_KIND).first()
    until = status.data.get("until") if status else None
    start = dt.datetime.fromtimestamp(until, tz=dt.timezone.utc) + dt.timedelta(seconds=step) if until else end - FIRST_LOOKBACK
    start = max(start, end - dt.timedelta(hours=settings.GPU_USAGE_MAX_CATCHUP_HOURS))
    stats: dict = {"queries": 0}
    if start <= end:
        try:
            series = prometheus.gpu_series(start, end, step)
        except prometheus.PrometheusUnavailable as exc:
            sync_record_failure(SYNC_KIND, error=str(exc))
            return stats | {"queries": 1, "error": str(exc)}
        stats["queries"] = 1
        stats |= gpu_usage_record(series, step=step)
        seen = {int(s.job) for s in series if s.job.isdigit()}
    else:
        seen = set()
    stats["final"] = gpu_usage_finalise(now=now, step=step)
    seen_jobs = JobGpuUsage.objects.filter(slurm_job_id__in=seen, final=False).values_list("job_id", flat=True)
    stats["busy_records"] = gpu_busy_hand_over(job_ids=list(seen_jobs), now=now)
    stats["alerts"] = len(gpu_idle_alerts_check(now=now))
    stats["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    sync_record_success(SYNC_KIND, data={"until": end.timestamp(), "duration_ms": stats["duration_ms"]}, at=now)
    return stats



def gpu_samples_compact_batch(*, jobs: int = 200, rows: int = 10_000) -> dict:
    """One batch of the legacy rows' compaction (``manage.py gpu_samples_compact``, issue 39): the
    ended jobs whose rows are frozen but have no JobGpuSummary get one from their JobGpuSample rows
    (at most ``jobs`` jobs; the same record the finalisation writes); once none is left, ``rows``
    sample rows are deleted by primary key. Short statements only: a site runs it on a live database
    (no table lock, no rewrite; VACUUM makes the space reusable, VACUUM FULL or pg_repack gives it
    back to the disk). Returns figures: summaries, deleted (0 and 0: done)."""
    job_ids = list(
        JobGpuUsage.objects.filter(final=True, job__gpu_summary__isnull=True)
        .order_by("job_id").values_list("job_id", flat=True).distinct()[:jobs]
    )  # fmt: skip
    if job_ids:
        ended = dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "ended_at"))
        usage: dict = {}
        for row in JobGpuUsage.objects.filter(job_id__in=job_ids).order_by("job_id", "task_index", "host", "gpu"):
            usage.setdefault(row.job_id, []).append(row)
        points: dict[int, list] = {}
        for usage_id, at, util, mem in JobGpuSample.objects.filter(usage__job_id__in=job_ids).values_list(
            "usage_id", "at", "util", "mem_mib"
        ).iterator(chunk_size=rows):
            points.setdefault(usage_id, []).append((at, util, mem))
        records = [
            JobGpuSummary(job_id=job_id, ended_at=ended.get(job_id) or max(r.last_at for r in mine),
                          data=gpu_summary.summary_encode(mine, {i: points.get(r.pk, []) for i, r in enumerate(mine)},
                                                          minimum_width=settings.GPU_SERIES_MIN_BUCKET_SECONDS))
            for job_id, mine in usage.items()
        ]  # fmt: skip
        JobGpuSummary.objects.bulk_create(records, ignore_conflicts=True)
        return {"summaries": len(records), "deleted": 0}
    pks = list(JobGpuSample.objects.order_by().values_list("pk", flat=True)[:rows])
    if pks:
        JobGpuSample.objects.filter(pk__in=pks).delete()
    return {"summaries": 0, "deleted": len(pks)}
