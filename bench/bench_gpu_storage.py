"""GPU data in PostgreSQL for a year of a 1 000-GPU site (issue 39 item 2: target <= 1 GB a year).

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_gpu_storage.py [--quick]

The raw points stay in Prometheus; the portal keeps per ended job one JobGpuSummary (per GPU its
figures and one series of at most 240 points, buckets >= GPU_SERIES_MIN_BUCKET_SECONDS, compressed:
jobs/gpu_summary.py) and, for RETENTION_GPU_ROWS_DAYS after the end, the per-GPU working rows
(JobGpuUsage). The bench writes a sample of jobs the way the finalisation does (``summary_encode`` of
each job's one-minute points; the working rows by bulk_create), measures ``pg_total_relation_size``
(heap, TOAST and indexes) after VACUUM, and scales to a year. The jobs' shape, stated (no sacct
distribution of a year exists on the local clusters), two mixes (MIXES): a mixed site, GPUs per job 1
(70 %), 2 (10 %), 4 (12 %), 8 (8 %), durations log-uniform in 2-60 min (65 %: array tasks), 1-8 h
(25 %), 8-48 h (10 %); an array-heavy site (about issue 39's 3 M jobs a year): 1/2/4/8 GPUs 85/7/5/3 %,
durations 80/15/5 %; a short job (2-60 min) is a task of an array of 10-200 tasks (log-uniform), one
portal Job and one record for the array, as the portal stores arrays;
utilisation per GPU a level (0, 30, 60 or 95 %) with +-8 % noise each minute and a change of level
at a random point in a third of the GPUs; memory a level with +-2 % noise (real series from a GPU
compress less than constant ones: the noise keeps the figure honest). A year: the whole 525.6 M
GPU-minutes of 1 000 GPUs allocated (an upper bound), so jobs/year = 525.6 M / the sample's mean
GPU-minutes per job."""

from __future__ import annotations

import datetime as dt
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

GPU_MINUTES_A_YEAR = 1000 * 365 * 24 * 60
GIB = 1024**3


# (name, GPUs-per-job weights for 1/2/4/8 GPUs, duration weights for 2-60 min / 1-8 h / 8-48 h)
# (… , short jobs stored as arrays): the last, every Slurm job a portal job of its own, is the worst case
MIXES = (
    ("mixed site", (70, 10, 12, 8), (65, 25, 10), True),
    ("array-heavy site", (85, 7, 5, 3), (80, 15, 5), True),
    ("array-heavy site, no arrays (worst case)", (85, 7, 5, 3), (80, 15, 5), False),
)


def _draw_job(rng: random.Random, gpu_weights, duration_weights) -> tuple[int, int]:
    """(GPUs, minutes) of one job, from the distributions stated in the docstring."""
    gpus = rng.choices((1, 2, 4, 8), weights=gpu_weights)[0]
    low, high = rng.choices(((2, 60), (60, 480), (480, 2880)), weights=duration_weights)[0]
    return gpus, max(1, round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def _points(rng: random.Random, *, start: dt.datetime, minutes: int) -> list:
    level = rng.choice((0.0, 30.0, 60.0, 95.0))
    change = rng.randrange(minutes) if rng.random() < 1 / 3 else None
    mem = rng.choice((0.0, 8000.0, 30000.0, 70000.0))
    out = []
    for i in range(minutes):
        if i == change:
            level = rng.choice((0.0, 30.0, 60.0, 95.0))
        util = min(100.0, max(0.0, level + rng.uniform(-8, 8))) if level else 0.0
        out.append((start + dt.timedelta(minutes=i + 1), util, mem * (1 + rng.uniform(-0.02, 0.02))))
    return out


def _size(table: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        return cursor.fetchone()[0]


def _records(rng: random.Random, gpu_weights, duration_weights, *, tasks: int, arrays: bool) -> list[list[tuple[int, int, int]]]:
    """``tasks`` Slurm jobs drawn one by one from the mix, grouped as the portal stores them: the short
    ones (2-60 min) as the tasks of arrays of 10-200 (one portal Job, one record each; tasks of one
    array hold as many GPUs), the others one job each. Each record: [(GPUs, minutes, start offset in
    minutes), ...] per task."""
    shapes = [_draw_job(rng, gpu_weights, duration_weights) for _ in range(tasks)]
    out = [[(g, m, 0)] for g, m in shapes if m > 60 or not arrays]
    if not arrays:
        return out
    for gpus in (1, 2, 4, 8):
        short = [m for g, m in shapes if m <= 60 and g == gpus]
        while short:
            size = round(math.exp(rng.uniform(math.log(10), math.log(200))))
            out.append([(gpus, m, round(i * rng.uniform(0, 3))) for i, m in enumerate(short[:size])])
            short = short[size:]
    return out


def _mix(section, world, rng, *, name: str, gpu_weights, duration_weights, arrays: bool, count: int) -> None:
    from django.conf import settings
    from django.db import connection

    from jobs.gpu_summary import summary_encode
    from jobs.models import Job, JobGpuSummary, JobGpuUsage

    common.truncate_jobs()
    end = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    records = _records(rng, gpu_weights, duration_weights, tasks=count, arrays=arrays)
    jobs = [common.make_job(world, name="gpu-storage", gpus=tasks[0][0], slurm_cluster="bench", slurm_job_id=40_000_000 + i * 1000,
                            array="" if len(tasks) == 1 else f"0-{len(tasks) - 1}", array_tasks=len(tasks),
                            started_at=end - dt.timedelta(minutes=max(m + o for _, m, o in tasks)), ended_at=end)
            for i, tasks in enumerate(records)]  # fmt: skip
    common.copy_jobs(jobs)
    jobs = list(Job.objects.filter(name="gpu-storage").order_by("slurm_job_id"))
    began = time.perf_counter()
    summaries, usage_rows, points_total = [], [], 0
    for job, tasks in zip(jobs, records, strict=True):
        rows, points = [], {}
        for index, (gpus, minutes, offset) in enumerate(tasks):
            task_id = job.slurm_job_id + (index + 1 if len(tasks) > 1 else 0)
            for g in range(gpus):
                series = _points(rng, start=job.started_at + dt.timedelta(minutes=offset), minutes=minutes)
                points_total += len(series)
                util = [u for _, u, _ in series]
                mem = [m for _, _, m in series]
                points[len(rows)] = series
                rows.append(JobGpuUsage(
                    job_id=job.pk, task_index=index if len(tasks) > 1 else None, slurm_job_id=task_id,
                    host=f"gpu-node-{task_id % 250:03d}", gpu=str(g), model_name="NVIDIA A100-SXM4-80GB", step_seconds=60,
                    samples=len(series), util_sum=sum(util), util_peak=max(util), idle_samples=sum(1 for u in util if u < 5),
                    mem_sum=sum(mem), mem_samples=len(mem), mem_peak=max(mem), first_at=series[0][0], last_at=series[-1][0],
                    final=True,
                ))  # fmt: skip
        usage_rows.extend(rows)
        summaries.append(JobGpuSummary(job_id=job.pk, ended_at=job.ended_at, data=summary_encode(
            rows, points, minimum_width=settings.GPU_SERIES_MIN_BUCKET_SECONDS)))  # fmt: skip
    encode_ms = (time.perf_counter() - began) * 1000 / len(records)
    JobGpuSummary.objects.bulk_create(summaries, batch_size=2000)
    JobGpuUsage.objects.bulk_create(usage_rows, batch_size=2000)
    summary_bytes = _size(JobGpuSummary._meta.db_table)
    per_row = _size(JobGpuUsage._meta.db_table) / len(usage_rows)
    slurm_jobs = sum(len(t) for t in records)
    per_job = summary_bytes / slurm_jobs
    gpu_minutes = sum(g * m for tasks in records for g, m, _ in tasks) / slurm_jobs
    jobs_a_year = GPU_MINUTES_A_YEAR / gpu_minutes
    working = per_row * jobs_a_year * len(usage_rows) / slurm_jobs * settings.RETENTION_GPU_ROWS_DAYS / 365
    payload = sum(len(s.data) for s in summaries) / len(records)
    section.add(f"{name}: {slurm_jobs} Slurm jobs as {len(records)} portal jobs (arrays), {len(usage_rows)} GPUs, "
                f"{points_total} one-minute points, mean {gpu_minutes:.0f} GPU-minutes a Slurm job -> "
                f"{jobs_a_year / 1e6:.2f} M Slurm jobs a year", per_job, "bytes a Slurm job", "1 run",
                f"JobGpuSummary (heap + TOAST + primary key + BRIN) {summary_bytes / len(records):.0f} bytes a portal job, "
                f"{payload:.0f} of it the compressed record; {encode_ms:.2f} ms to encode one; "
                f"JobGpuUsage {per_row:.0f} bytes a GPU row")  # fmt: skip
    section.add(f"{name}: GPU data in PostgreSQL after a year (1 000 GPUs fully allocated)",
                (per_job * jobs_a_year + working) / GIB, "GB", "scaled",
                f"summaries {per_job * jobs_a_year / GIB:.3f} GB + working rows ({settings.RETENTION_GPU_ROWS_DAYS} days kept) "
                f"{working / 2**20:.0f} MiB; target <= 1 GB")  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {JobGpuSummary._meta.db_table}, {JobGpuUsage._meta.db_table} CASCADE")


def _compaction(section, world, rng, *, jobs: int) -> None:
    """The legacy rows' compaction (manage.py gpu_samples_compact's batches): ``jobs`` ended jobs of
    2 GPUs x 1 000 one-minute JobGpuSample rows, summarised and deleted; rows a second."""
    from jobs.models import Job, JobGpuSample, JobGpuSummary, JobGpuUsage
    from jobs.services import gpu_samples_compact_batch

    common.truncate_jobs()
    end = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    start = end - dt.timedelta(minutes=1000)
    common.copy_jobs([common.make_job(world, name="gpu-legacy", gpus=2, slurm_cluster="bench", slurm_job_id=50_000_000 + i,
                                      started_at=start, ended_at=end) for i in range(jobs)])  # fmt: skip
    rows = [JobGpuUsage(job_id=job.pk, slurm_job_id=job.slurm_job_id, host="gpu-node-001", gpu=str(g), step_seconds=60,
                        samples=1000, util_sum=50_000, util_peak=60, first_at=start + dt.timedelta(minutes=1), last_at=end,
                        final=True) for job in Job.objects.filter(name="gpu-legacy") for g in range(2)]  # fmt: skip
    JobGpuUsage.objects.bulk_create(rows, batch_size=2000)
    samples = [JobGpuSample(usage_id=row.pk, at=start + dt.timedelta(minutes=m), util=50 + rng.uniform(-5, 5), mem_mib=9000.0)
               for row in rows for m in range(1, 1001)]  # fmt: skip
    JobGpuSample.objects.bulk_create(samples, batch_size=10_000)
    began = time.perf_counter()
    batches = 0
    while True:
        done = gpu_samples_compact_batch()
        batches += 1
        if not done["summaries"] and not done["deleted"]:
            break
    seconds = time.perf_counter() - began
    assert not JobGpuSample.objects.exists() and JobGpuSummary.objects.count() == jobs
    section.add(f"manage.py gpu_samples_compact: {len(samples)} legacy sample rows of {jobs} jobs summarised and deleted",
                len(samples) / seconds, "rows/s", "1 run",
                f"{batches} batches of at most 200 jobs / 10 000 rows, {seconds * 1000 / batches:.0f} ms each on average "
                "(each its own short statements: no table lock)")  # fmt: skip
    common.truncate_jobs()


def run(*, quick: bool = False) -> common.Section:
    from jobs.models import JobGpuSample

    section = common.Section("GPU data in PostgreSQL: a year of a 1 000-GPU site (bench_gpu_storage.py)")
    section.method = __doc__.split("\n\n", 2)[2].replace("\n", " ")
    world = common.begin(section, slurm=False, truncate=True)
    JobGpuSample.objects.all().delete()
    rng = random.Random(39)
    for name, gpu_weights, duration_weights, arrays in MIXES:
        _mix(section, world, rng, name=name, gpu_weights=gpu_weights, duration_weights=duration_weights, arrays=arrays,
             count=2000 if quick else 10_000)  # fmt: skip
    _compaction(section, world, rng, jobs=50 if quick else 200)
    raw = GPU_MINUTES_A_YEAR * 126 / GIB  # issue 39: 108-144 bytes a JobGpuSample row with its indexes
    section.note(f"before (one JobGpuSample row per GPU-minute, 108-144 bytes each): ~{raw:.0f} GB a year for the same GPUs")
    return section


if __name__ == "__main__":
    section = common.main(run, common.arguments(__doc__, quick="2 000 jobs"))
    common.write_section(section)
