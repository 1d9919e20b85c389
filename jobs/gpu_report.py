"""Reads of what a job's GPUs did (the rows and records jobs.services.gpu_usage writes): the per-GPU
summary, the one-line verdict and the chart, the same for the job page and GET /api/v1/jobs/{id}/.
Only a running job's chart asks Prometheus (a short timeout; down, the page shows the figures without
the chart and says so); ``status`` says how fresh the figures are."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, Min, Q
from django.utils import timezone

from accounting.rates import gpu_hour_price
from jobs import gpu_summary
from jobs.choices import LIVE_STATES, JobState
from jobs.gpu_summary import GPU_CHART_POINTS  # noqa: F401 — re-exported: the chart's bound, named where the chart is read
from jobs.models import Job, JobGpuSummary, JobGpuUsage
from portal import money, prometheus
from portal.models import NodeInfo, SyncStatus

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


# a page waits at most this long for Prometheus (a running job's chart); then shows the figures without it
CHART_TIMEOUT_SECONDS = 3


def _live_chart(rows: list[JobGpuUsage], *, cluster: str) -> dict | None:
    """The chart of a job still growing, from the raw points in Prometheus: one range query for the
    job's GPUs at the chart's bucket width (each point the mean over its bucket). None when nothing
    was sampled or Prometheus does not answer (the status says so)."""
    rows = [r for r in rows if r.samples]
    if not rows or not prometheus.enabled():
        return None
    origin, width, count = gpu_summary.chart_frame(rows)
    start = dt.datetime.fromtimestamp(origin + width, tz=dt.UTC)
    end = dt.datetime.fromtimestamp(origin + width * count, tz=dt.UTC)
    timeout = min(settings.PROMETHEUS_TIMEOUT, CHART_TIMEOUT_SECONDS)
    try:
        series = prometheus.gpu_series(start, end, width, jobs=[r.slurm_job_id for r in rows], timeout=timeout)
    except prometheus.PrometheusUnavailable:
        return None
    for r in rows:
        r.cluster_name = cluster
    points = gpu_summary.series_of_rows(rows, series)
    if not any(points.values()):
        return None  # Prometheus no longer (or not yet) has them
    lists = {i: gpu_summary.buckets(p, origin=origin, width=width, count=count) for i, p in points.items()}
    return gpu_summary.chart(rows, lists, origin=origin, width=width, count=count)


def job_gpu_report(job: Job, *, chart: bool = True) -> dict:
    """The job's GPUs as the sync recorded them: per GPU (array: per task and GPU) mean and peak
    utilisation and memory, idle share and busy GPU-hours; the verdict; the chart (at most 240 points
    per GPU); the figures' freshness. An ended job's from its stored record (jobs.gpu_summary, no
    Prometheus call); a job still growing from its rows, its chart from Prometheus (one range query,
    CHART_TIMEOUT_SECONDS at most). Three queries (record, rows, status)."""
    record = JobGpuSummary.objects.filter(job=job).only("data").first()
    if record is not None:
        rows, stored_chart = gpu_summary.summary_decode(record.data, job_id=job.pk)
    else:
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
        "chart": (stored_chart if record is not None else _live_chart(rows, cluster=job.slurm_cluster)) if chart else None,
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


def team_idle_exempt_jobs(team) -> list[Job]:
    """The team's live jobs submitted exempt from its idle-GPU policy, newest first (its managers' view
    on the team page). One query (the live-state index)."""
    return list(Job.objects.filter(team=team, idle_exempt=True, state__in=sorted(LIVE_STATES)).select_related("submitter").order_by("-created_at")[:200])
