"""The portal's own share of one jobs_sync() cycle with many live jobs: squeue's text for them is
written here and read by the real parser (portal.slurm.cli_output.parse_queue), so the figure is the
portal's CPU and its database, not the controller's.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_sync_portal.py [--live 10000] [--cycles 5] [--profile]

bench_sync.py and bench_year_cycles.py measure the whole cycle against real live jobs in Slurm (the
controller's answer included); this one isolates what the portal does with the answer, for
alternating before/after runs of a change to the sync. The jobs are PENDING rows of the bench team
(COPY), each in the written queue with its tag, its Slurm id and an expected start."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


def squeue_line(slurm_job_id: int, tag: str, priority: int) -> str:
    """One line of ``squeue -o QUEUE_FORMAT`` for a pending 1-GPU job of the bench account."""
    from portal.slurm.parsing import FIELD_SEP

    return FIELD_SEP.join([
        str(slurm_job_id), "bench", common.BENCH_TEAM, "debug", "PENDING", "Priority", "", "1", "2026-12-06T19:00:00",
        "2026-12-06T21:00:00", "2026-12-06T21:15:00", "15:00", "gres/gpu:1", "(null)", str(slurm_job_id),
        str(slurm_job_id), "N/A", str(priority), "sync-live", tag,
    ])  # fmt: skip


def run(*, live: int = 10000, cycles: int = 5, profile: bool = False) -> common.Section:
    from django.conf import settings
    from django.utils import timezone

    import jobs.services.sync as sync
    from jobs.choices import JobState
    from portal.slurm.cli_output import parse_queue
    from portal.slurm.tags import slurm_tag

    section = common.Section(f"jobs_sync(): the portal's share with {live:,} live jobs (bench_sync_portal.py)")
    world = common.begin(section, slurm=False, truncate=True)
    now = timezone.now()
    rows, lines = [], []
    for i in range(live):
        job_id = uuid.uuid4()
        rows.append(common.make_job(world, id=job_id, name="sync-live", state=JobState.PENDING, slurm_cluster=settings.SLURM_CLUSTER,
                                    slurm_job_id=100_000 + i, created_at=now, submitted_at=now, started_at=None, ended_at=None,
                                    exit_code=None))  # fmt: skip
        lines.append(squeue_line(100_000 + i, slurm_tag(job_id), 4000 - i % 7))
    common.copy_jobs(rows)
    text = "\n".join(lines) + "\n"

    class Written:  # the gateway's queue(): the real parser over the written text
        def queue(self):
            return parse_queue(text)

    sync.get_gateway = lambda name=None: Written()  # this process only: the benchmark's, never the portal's
    sync.jobs_sync()  # the first cycle writes the outlook; the timed ones change nothing
    walls, cpus = [], []
    for _ in range(cycles):
        wall, cpu = time.perf_counter(), time.process_time()
        sync.jobs_sync()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    began = time.perf_counter()
    parse_queue(text)
    section.add(f"{live:,} live jobs: cycle wall time", statistics.median(walls), "ms", f"median of {cycles}; {min(walls):.0f}–{max(walls):.0f}")
    section.add(f"{live:,} live jobs: cycle CPU (this process)", statistics.median(cpus), "ms", f"median of {cycles}")
    section.add(f"{live:,} live jobs: parse_queue alone", (time.perf_counter() - began) * 1000, "ms", "1 run")
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        sync.jobs_sync()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return section


if __name__ == "__main__":
    parser = common.arguments(__doc__)
    parser.add_argument("--live", type=int, default=10000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    common.main(run, parser)
