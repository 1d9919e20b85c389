"""The periodic cycles on a year of a 1 000-GPU site (issue 39 item 3): ``jobs_sync`` following 10 000
live jobs, the GPU sync folding 4 000 GPUs, and usage ingestion of a day, against the database
bench/year_world.py wrote.

    eval "$(scripts/services up)" && eval "$(scripts/cluster env)"
    BENCH_DB=gpuportal_year .venv/bin/python bench/bench_year_cycles.py [--live 10000] [--cycles 5]

The year's rows stay as they are; what this adds (the bench team, its live jobs, the running jobs of
the GPU cycle) is deleted at the end. ``jobs_sync``: ``--live`` real Slurm jobs (``sleep 600``, 1 GPU,
partition debug) submitted through the gateway with the portal's tag on the bench account capped at 2
running GPUs (bench_sync.submit_live), their Job rows copied in, then cycles timed in this process
with the Slurm calls and queries counted (bench_sync.time_cycles): the steady state, and a cycle
right after every live job was cancelled (all of them change state and need accounting). The local
cluster needs MaxJobCount above ``--live`` (scripts/slurm/slurm.conf.in: 30 000). The GPU sync: 1 000
running jobs × 4 GPUs (not in Slurm) and ``jobs.services.gpu_usage_record`` folding one new point
per GPU per cycle (bench_gpu_usage's series), after a first cycle that creates the rows. Ingestion:
bench_year_pages' day read again and a day not ingested yet (rolled back)."""

from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


def _scancel_bench_account() -> None:
    """Every job of the bench account cancelled with one scancel (Slurm's own tool: 10 000 scancels
    through the gateway would take minutes)."""
    subprocess.run(["scancel", f"--account={common.BENCH_TEAM}"], check=False, capture_output=True, text=True)
    deadline = time.monotonic() + 300
    while common.bench_live_jobs() and time.monotonic() < deadline:
        time.sleep(1)


def _jobs_sync(section: common.Section, world, live: int, cycles: int) -> None:
    from bench_sync import _wait_for_accounting, submit_live, time_cycles

    from jobs.models import Job

    _scancel_bench_account()
    common.gpu_limit_set(2)
    began = time.perf_counter()
    rows = submit_live(world, live)
    section.note(f"{live:,} live jobs submitted through the gateway (4 at a time) in {time.perf_counter() - began:.0f} s")
    common.copy_jobs(rows)
    ids = [row.id for row in rows]
    try:
        time_cycles(1)  # settle: the new rows' reasons and expected starts written
        seconds, calls, queries, stats = time_cycles(cycles)
        section.add(
            f"jobs_sync, {stats.get('live', '?'):,} live jobs on the year: cycle time", common.median(seconds) * 1000, "ms",
            f"median of {cycles} cycles; {min(seconds) * 1000:.0f}–{max(seconds) * 1000:.0f} ms",
            f"{max(calls)} Slurm calls and {min(queries)}–{max(queries)} queries per cycle; {stats.get('changed', 0)} changed",
        )  # fmt: skip
        _scancel_bench_account()
        _wait_for_accounting({row.slurm_job_id for row in rows}, timeout=180)
        seconds, calls, queries, stats = time_cycles(1)
        section.add(
            f"jobs_sync, all {live:,} live jobs ended since the last cycle, on the year", seconds[0] * 1000, "ms", "1 cycle",
            f"{calls[0]} Slurm calls, {queries[0]} queries; {stats.get('changed', 0):,} jobs changed; "
            + ", ".join(f"{name} {t * 1000:,.0f} ms" for name, t in stats.get("split", {}).items()),
        )  # fmt: skip
    finally:
        _scancel_bench_account()
        common.gpu_limit_set(None)
        common.clean_workdir()
        deleted = Job.objects.filter(id__in=ids).delete()[0]
        section.note(f"the live jobs' rows deleted afterwards ({deleted:,} rows with their events and holds)")


def _gpu_sync(section: common.Section, world, cycles: int) -> None:
    from bench_gpu_usage import gpu_cycles
    from django.utils import timezone

    from jobs.models import Job

    now = timezone.now().replace(microsecond=0)
    rows = [common.make_job(world, name="year-gpu-cycle", state="RUNNING", gpus=4, ended_at=None, exit_code=None,
                            slurm_cluster="bench", slurm_job_id=30_000_000 + i, started_at=now - dt.timedelta(hours=1))
            for i in range(1000)]  # fmt: skip
    common.copy_jobs(rows)
    try:
        cycle = gpu_cycles(list(Job.objects.filter(id__in=[row.id for row in rows])), now=now, step=60, cycles=cycles)
        section.add(f"GPU sync on the year, first cycle: {cycle.gpus:,} GPUs x 10 points (rows created)",
                    cycle.first_ms, "ms", "1 run", f"{cycle.first_queries} queries")  # fmt: skip
        section.add(f"GPU sync on the year, next cycles: {cycle.gpus:,} GPUs x 1 new point (rows updated)",
                    statistics.median(cycle.times), "ms",
                    f"median of {cycles}; {min(cycle.times):.0f}–{max(cycle.times):.0f} ms",
                    f"{min(cycle.queries)}–{max(cycle.queries)} queries each")  # fmt: skip
    finally:
        Job.objects.filter(id__in=[row.id for row in rows]).delete()


def run(*, quick: bool = False, live: int | None = None, cycles: int | None = None) -> common.Section:
    from django.conf import settings

    from bench_year_pages import _ingestion
    from jobs.models import Job

    live = live or (1000 if quick else 10_000)
    cycles = cycles or (3 if quick else 5)
    section = common.Section(f"The periodic cycles on a year of a 1 000-GPU site ({settings.DATABASES['default']['NAME']}, bench_year_cycles.py)")
    section.method = __doc__.split("\n\n", 2)[2].replace("\n", " ")
    jobs = Job.objects.count()
    if jobs < 10_000:
        raise SystemExit(f"{settings.DATABASES['default']['NAME']} holds {jobs} jobs: write a year first (bench/year_world.py)")
    section.note(f"the year: {jobs:,} portal jobs; load average at the start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    world = common.begin(section, gpu_cap=None)
    _jobs_sync(section, world, live, cycles)
    _gpu_sync(section, world, cycles)
    _ingestion(section, cycles)
    section.note(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="1 000 live jobs, 3 cycles")
    parser.add_argument("--live", type=int)
    parser.add_argument("--cycles", type=int)
    section = common.main(run, parser)
    common.write_section(section)


if __name__ == "__main__":
    main()
