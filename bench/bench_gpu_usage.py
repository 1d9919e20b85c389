"""GPU usage at scale: one sync cycle for 1 000 running jobs x 4 GPUs, and the page of an 8-GPU x 72 h job.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_gpu_usage.py [--quick]

The cycle: ``jobs.services.gpu_usage_record`` folding 4 000 series (one per GPU a job holds, as the one
range query returns them) into the usage rows (the raw points stay in Prometheus since issue 39), timed and its queries counted, for a
first cycle (rows created) and the next ones (rows updated, one new point per GPU). Prometheus's side
of that one query is timed against the local Prometheus when PROMETHEUS_URL answers (its real
series: the local clusters' GPUs). The page: an ended job with 8 GPUs whose 72 h of one-minute points
(34 560) are kept as its JobGpuSummary (at most 240 points per GPU), its report (jobs.gpu_report.
job_gpu_report, no Prometheus call) and the whole job page rendered through Django's test client."""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_relay import QueryTimer


def _series(jobs, *, start, points: int, step: int):
    from portal import prometheus

    out = []
    for n, job in enumerate(jobs):
        for gpu in range(job.gpus):
            util = float((n + gpu) % 3 * 45)  # 0, 45, 90: a third of the GPUs idle
            rows = [(start + dt.timedelta(seconds=step * i), util, 1000.0 * gpu) for i in range(points)]
            out.append(prometheus.GpuSeries(cluster="bench", job=str(job.slurm_job_id), host=f"node-{n // 2:04d}",
                                            gpu=str(gpu), model="NVIDIA A100-SXM4-80GB", points=rows))  # fmt: skip
    return out


@dataclasses.dataclass
class GpuCycles:
    gpus: int  # GPUs in each cycle's series
    first_ms: float  # the first cycle: 10 points per GPU, the rows created
    first_queries: int
    times: list[float]  # the next cycles: 1 new point per GPU, the rows updated (ms)
    queries: list[int]


def gpu_cycles(jobs, *, now, step: int, cycles: int) -> GpuCycles:
    """The GPU sync's recording (gpu_usage_record) for ``jobs`` (4 GPUs each): a first cycle of 10
    points per GPU, then ``cycles`` cycles of one new point, each timed with its queries counted.
    Shared with bench_year_cycles.py (the same cycle on a year's database)."""
    from django.db import connection

    from jobs.services import gpu_usage_record

    def timed(series):
        timer = QueryTimer()
        began = time.perf_counter()
        with connection.execute_wrapper(timer):
            result = gpu_usage_record(series, step=step)
        return result, (time.perf_counter() - began) * 1000, timer.count

    first, first_ms, first_queries = timed(_series(jobs, start=now - dt.timedelta(minutes=10), points=10, step=step))
    times, queries = [], []
    for c in range(cycles):
        _, ms, count = timed(_series(jobs, start=now + dt.timedelta(seconds=step * c), points=1, step=step))
        times.append(ms)
        queries.append(count)
    return GpuCycles(first["gpus"], first_ms, first_queries, times, queries)


def run(*, quick: bool = False) -> common.Section:
    from django.conf import settings
    from django.test import Client
    from django.utils import timezone

    from jobs.gpu_report import job_gpu_report
    from jobs.gpu_summary import summary_encode
    from jobs.models import Job, JobGpuSample, JobGpuSummary, JobGpuUsage
    from jobs.services import gpu_usage_record
    from portal import prometheus

    section = common.Section(
        "GPU usage: one sync cycle for 1 000 running jobs x 4 GPUs; the page of an 8-GPU x 72 h job (bench_gpu_usage.py)"
    )
    section.method = __doc__.split("\n\n", 2)[2].replace("\n", " ")
    world = common.begin(section, slurm=False, truncate=True)
    JobGpuSample.objects.all().delete()
    JobGpuUsage.objects.all().delete()
    JobGpuSummary.objects.all().delete()
    step = 60
    now = timezone.now().replace(microsecond=0)
    count = 200 if quick else 1000
    jobs = [common.make_job(world, name="gpu-bench", state="RUNNING", gpus=4, ended_at=None, exit_code=None,
                            slurm_cluster="bench", slurm_job_id=30_000_000 + i, started_at=now - dt.timedelta(hours=1))
            for i in range(count)]  # fmt: skip
    common.copy_jobs(jobs)
    jobs = list(Job.objects.filter(name="gpu-bench"))
    cycles = 3 if quick else 5
    # the series carry cluster="bench", the jobs' slurm_cluster (GPU_LABEL_CLUSTER=cluster)
    cycle = gpu_cycles(jobs, now=now, step=step, cycles=cycles)
    section.add(f"first cycle: {cycle.gpus} GPUs x 10 points folded in (rows created)", cycle.first_ms, "ms", "1 run",
                f"{cycle.first_queries} queries")  # fmt: skip
    section.add(f"next cycles: {cycle.gpus} GPUs x 1 new point (rows updated)", statistics.median(cycle.times), "ms",
                f"median of {cycles}", f"{max(cycle.queries)} queries each")  # fmt: skip

    if settings.PROMETHEUS_URL:
        try:
            times = []
            for _ in range(5):
                began = time.perf_counter()
                got = prometheus.gpu_series(now - dt.timedelta(minutes=10), now, 2)
                times.append((time.perf_counter() - began) * 1000)
            section.add(f"the one range query against the local Prometheus (10 min at 2 s, {len(got)} GPU series)",
                        statistics.median(times), "ms", "median of 5")  # fmt: skip
        except prometheus.PrometheusUnavailable as exc:
            section.note(f"Prometheus at {settings.PROMETHEUS_URL} not answering: {exc}")

    # The page of an 8-GPU x 72 h job
    big = common.make_job(world, name="gpu-bench-72h", state="COMPLETED", gpus=8, ended_at=now, exit_code=0,
                          slurm_cluster="bench", slurm_job_id=31_000_000, started_at=now - dt.timedelta(hours=72))  # fmt: skip
    common.copy_jobs([big])
    big = Job.objects.get(name="gpu-bench-72h")
    hours = 12 if quick else 72
    series = _series([big], start=now - dt.timedelta(hours=hours), points=hours * 60, step=step)
    gpu_usage_record(series, step=step)
    rows = list(JobGpuUsage.objects.filter(job=big).order_by("task_index", "host", "gpu"))
    by_gpu = {s.gpu: s.points for s in series}
    JobGpuSummary.objects.create(job=big, ended_at=now, data=summary_encode(
        rows, {i: by_gpu[r.gpu] for i, r in enumerate(rows)}, minimum_width=settings.GPU_SERIES_MIN_BUCKET_SECONDS))  # fmt: skip
    samples = sum(len(s.points) for s in series)
    times = []
    for _ in range(5):
        began = time.perf_counter()
        report = job_gpu_report(big)
        times.append((time.perf_counter() - began) * 1000)
    section.add(f"job_gpu_report: 8 GPUs x {hours} h ({samples} points -> its record, {len(report['chart']['labels'])} points each)",
                statistics.median(times), "ms", "median of 5")  # fmt: skip
    client = Client()
    client.force_login(world.user)
    times = []
    for _ in range(5):
        began = time.perf_counter()
        response = client.get(f"/jobs/{big.pk}/")
        times.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, response.status_code
    section.add(f"the job page (GET /jobs/<id>/, whole page) of the 8-GPU x {hours} h job", statistics.median(times), "ms", "median of 5")
    for figure in section.figures:
        print(figure.line())
    return section


if __name__ == "__main__":
    section = common.main(run, common.arguments(__doc__, quick="200 jobs, a 12 h job"))
    common.write_section(section)
