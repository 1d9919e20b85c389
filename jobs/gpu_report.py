"""Reads of what a job's GPUs did (the rows jobs.services.gpu_usage writes): the per-GPU summary, the
one-line verdict and the chart, the same for the job page and GET /api/v1/jobs/{id}/. No Prometheus
call here: a page never waits for it nor fails with it; ``status`` says how fresh the figures are."""

from __future__ import annotations

import datetime as dt
import math

from decimal import Decimal

from django.conf import settings
from django.db.models import Avg, BigIntegerField, Count, ExpressionWrapper, Func, Min, Q
from django.utils import timezone

from accounting.rates import gpu_hour_price
from jobs.choices import JobState
from jobs.models import Job, JobGpuSample, JobGpuUsage
from portal import money
from portal.models import NodeInfo, SyncStatus

# The chart of a job has at most this many points per GPU (server-side means over equal buckets):
# 8 GPUs x 72 h at one point a minute are 34 560 rows, read as 8 x 240.
GPU_CHART_POINTS = 240
# A GPU idle for at least this share of its samples counts as an idle GPU in the verdict
IDLE_GPU_SHARE = 0.5
SYNC_KIND = "gpu-usage"  # the SyncStatus row of jobs.services.gpu_usage


def gpu_usage_status() -> dict:
    """How fresh the GPU figures are: enabled (PROMETHEUS_URL set), as_of (the end of the last range
    read), failing_since / error while Prometheus does not answer."""
    status = SyncStatus.objects.filter(kind=SYNC_KIND).first()
    until = status.data.get("until") if status else None
    return {
        "enabled": bool(settings.PROMETHEUS_URL),
        "as_of": dt.datetime.fromtimestamp(until, tz=dt.timezone.utc) if until else None,
        "failing_since": status.failing_since if status else None,
        "error": status.last_error if status and status.failing_since else "",
    }


def busy_gpu_hours(usage: JobGpuUsage) -> float:
    """Utilisation-weighted hours: a GPU at 50 % for two hours is one busy GPU-hour."""
    return usage.util_sum / 100 * usage.step_seconds / float(money.HOUR)


def gpu_verdict(rows: list[JobGpuUsage]) -> str:
    """One line: "2 of 4 GPUs idle for 80 % of the run" (idle: under GPU_IDLE_THRESHOLD_PERCENT for at
    least half of its samples), or the mean utilisation when none idled."""
    rows = [r for r in rows if r.samples]
    if not rows:
        return ""
    idle = [r for r in rows if r.idle_fraction >= IDLE_GPU_SHARE]
    noun = "GPU" if len(rows) == 1 else "GPUs"
    if not idle:
        mean = sum(r.util_sum for r in rows) / sum(r.samples for r in rows)
        return f"{'The' if len(rows) == 1 else 'All'} {len(rows)} {noun} busy: mean utilisation {mean:.0f} %"
    share = round(100 * sum(r.idle_samples for r in idle) / sum(r.samples for r in idle))
    who = f"All {len(rows)} {noun}" if len(idle) == len(rows) else f"{len(idle)} of {len(rows)} {noun}"
    return f"{who} idle for {share} % of the run"


class _EpochSeconds(Func):
    """Whole seconds since 1970 of a timestamp, as bigint: buckets of whole seconds group 3x faster on
    integers than EXTRACT(EPOCH)'s numeric (PostgreSQL 14+) or a double (bench/bench_gpu_usage.py:
    34 560 samples, 33 ms against 109 ms and 255 ms on a loaded 2-core machine)."""

    template = "date_part('epoch', %(expressions)s)::bigint"
    output_field = BigIntegerField()


def _chart(rows: list[JobGpuUsage]) -> dict | None:
    rows = [r for r in rows if r.samples]
    if not rows:
        return None
    step = max(r.step_seconds for r in rows)
    start = min(r.first_at for r in rows) - dt.timedelta(seconds=step)
    end = max(r.last_at for r in rows)
    width = max(step, math.ceil((end - start).total_seconds() / GPU_CHART_POINTS))
    origin = int(start.timestamp())
    buckets = math.ceil((end - start).total_seconds() / width) or 1
    points = (
        JobGpuSample.objects.filter(usage__in=[r.pk for r in rows])
        .annotate(bucket=ExpressionWrapper((_EpochSeconds("at") - origin) / width, output_field=BigIntegerField()))
        .values("usage_id", "bucket")
        .annotate(util=Avg("util"), mem=Avg("mem_mib"))
        .order_by()
    )
    index = {r.pk: i for i, r in enumerate(rows)}
    util = [[None] * buckets for _ in rows]
    mem = [[None] * buckets for _ in rows]
    for p in points:
        b = min(max(int(p["bucket"]), 0), buckets - 1)
        util[index[p["usage_id"]]][b] = round(p["util"], 1)
        mem[index[p["usage_id"]]][b] = None if p["mem"] is None else round(p["mem"])
    labels = [dt.datetime.fromtimestamp(origin + width * (b + 1), tz=dt.UTC).isoformat() for b in range(buckets)]
    return {
        "labels": labels,
        "bucket_seconds": width,
        "series": [{"label": _gpu_label(r), "util": util[i], "mem_mib": mem[i]} for i, r in enumerate(rows)],
    }


def _gpu_label(row: JobGpuUsage) -> str:
    task = f"task {row.task_index} · " if row.task_index is not None else ""
    return f"{task}{row.host} GPU {row.gpu}"


def job_gpu_report(job: Job, *, chart: bool = True) -> dict:
    """The job's GPUs as the sync recorded them: per GPU (array: per task and GPU) mean and peak
    utilisation and memory, idle share and busy GPU-hours; the verdict; the chart (downsampled);
    the figures' freshness. Three queries (rows, samples, status)."""
    rows = list(JobGpuUsage.objects.filter(job=job).order_by("task_index", "host", "gpu"))
    gpus = [
        {
            "task_index": r.task_index, "host": r.host, "gpu": r.gpu, "model": r.model_name,
            "util_mean": round(r.util_mean, 1), "util_peak": round(r.util_peak, 1),
            "mem_mean_mib": round(r.mem_mean), "mem_peak_mib": round(r.mem_peak),
            "idle_percent": round(100 * r.idle_fraction), "samples": r.samples,
            "busy_gpu_hours": busy_gpu_hours(r), "first_at": r.first_at, "last_at": r.last_at,  # shown rounded
            "final": r.final,
        }  # fmt: skip
        for r in rows
    ]
    return {
        "gpus": gpus,
        "verdict": gpu_verdict(rows),
        "chart": _chart(rows) if chart else None,
        "status": gpu_usage_status(),
    }


def job_cost_so_far(job: Job, *, gpus: int, now: dt.datetime) -> tuple[Decimal | None, str]:
    """What the job's allocation cost since it started: GPUs held × hours × the rate in force for its
    GPU type on its partition (rounded once, to cents). (None, "") when no rate applies."""
    gpu_type = job.gpu_type or (
        NodeInfo.objects.filter(cluster_id=job.cluster_id, gpu_type__gt="").values_list("gpu_type", flat=True).first() or ""
    )
    price = gpu_hour_price(gpu_type=gpu_type, partition=job.partition, at=now)
    if price is None or job.started_at is None:
        return None, ""
    seconds = int((now - job.started_at).total_seconds())
    return money.display(money.cost(gpu_seconds=gpus * seconds, price=price[0])), price[1]


def team_idle_allocations(team, *, now: dt.datetime | None = None) -> list[dict]:
    """The team's running jobs with GPUs idle now (the last sample under GPU_IDLE_THRESHOLD_PERCENT),
    most idle GPUs first: the job, its idle and monitored GPUs, since when the longest-idle one idles,
    and the allocation's cost so far. For the team's managers (the team page). Two queries + prices."""
    now = now or timezone.now()
    rows = (
        JobGpuUsage.objects.filter(final=False, job__team=team, job__state=JobState.RUNNING)
        .values("job_id")
        .annotate(gpus=Count("id"), idle=Count("id", filter=Q(idle_since__isnull=False)), idle_since=Min("idle_since"))
        .filter(idle__gt=0)
    )
    rows = {r["job_id"]: r for r in rows}
    jobs = Job.objects.filter(pk__in=list(rows)).select_related("submitter")
    out = []
    for job in jobs:
        row = rows[job.pk]
        cost, currency = job_cost_so_far(job, gpus=row["gpus"], now=now)
        out.append({"job": job, "gpus": row["gpus"], "idle_gpus": row["idle"], "idle_since": row["idle_since"],
                    "cost_so_far": cost, "currency": currency})  # fmt: skip
    return sorted(out, key=lambda r: (-r["idle_gpus"], r["idle_since"]))
