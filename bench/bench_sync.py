"""Sync at scale: time, Slurm calls and database queries of one ``jobs.services.jobs_sync()`` cycle
with 1 000, 5 000 and 10 000 portal jobs in the database, 1 000 of them live in Slurm.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_sync.py [--quick] [--live 1000] [--sizes 1000,5000,10000]

The live jobs are real: ``sleep 600`` (1 GPU, partition debug, 15 min) submitted through the gateway
with the portal's tag, on the bench account capped at 2 running GPUs (GrpTRES), so 2 run and the rest
pend without taking the shared cluster's GPUs. The other rows are finished jobs (COPY). Slurm calls
are counted by a wrapper around the real gateway, queries by an execute wrapper. Every bench job is
cancelled at the end."""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_relay import QueryTimer, _Timed


def submit_live(world, count: int) -> list:
    """Submit ``count`` sleep jobs through the gateway (4 at a time) and return unsaved PENDING Job rows for them."""
    from django.conf import settings
    from django.utils import timezone

    from jobs.choices import JobState
    from portal.slurm import JobSubmission
    from portal.slurm.request import job_request
    from portal.slurm.tags import slurm_tag

    gateway = common.gateway()
    pattern = settings.JOB_OUTPUT_PATTERN

    def one(_):
        job_id = uuid.uuid4()
        workdir = common.BENCH_WORKDIR
        command_line = [
            ("job-name", "sync-live"), ("partition", "debug"), ("chdir", workdir), ("gres", "gpu:1"), ("time", "15"),
            ("output", pattern.format(workdir=workdir, slurm_job_id="%j", stream="out")),
            ("error", pattern.format(workdir=workdir, slurm_job_id="%j", stream="err")),
            ("account", common.BENCH_TEAM), ("comment", slurm_tag(job_id)),
        ]  # fmt: skip
        request = job_request(script="#!/bin/bash\nsleep 600\n", command_line=command_line, workdir=workdir,
                              submit_dir=workdir, gpus=1, time_limit_minutes=15)  # fmt: skip
        return job_id, gateway.submit(JobSubmission(request, uid=world.uid, gid=world.gid)), timezone.now()

    with ThreadPoolExecutor(4) as pool:
        submitted = list(pool.map(one, range(count)))
    return [
        common.make_job(
            world,
            id=job_id,
            name="sync-live",
            script="#!/bin/bash\nsleep 600\n",
            time_limit_minutes=15,
            state=JobState.PENDING,
            slurm_cluster=settings.SLURM_CLUSTER,
            slurm_job_id=slurm_id,
            created_at=at,
            submitted_at=at,
            started_at=None,
            ended_at=None,
            exit_code=None,
        )
        for job_id, slurm_id, at in submitted
    ]


def history(world, count: int, first_id: int) -> list:
    """Finished jobs (not in Slurm any more), one a minute back in time (their budget holds are
    accounting's rows, which the sync never reads)."""
    import datetime as dt

    from django.utils import timezone

    now = timezone.now()
    rows = []
    for i in range(count):
        at = now - dt.timedelta(minutes=first_id + i + 1)
        rows.append(common.make_job(world, slurm_cluster="history", slurm_job_id=10_000_000 + first_id + i,
                                    created_at=at, submitted_at=at, started_at=at, ended_at=at))  # fmt: skip
    return rows


def _wait_for_accounting(slurm_ids: set[int], *, timeout: float = 60.0) -> None:
    """Until sacct has the final records of these jobs (slurmdbd gets them a moment after the
    controller; the sync leaves a job that ended moments ago for the next cycle until then)."""
    import datetime as dt

    from jobs.choices import TERMINAL_STATES, state_from_slurm

    deadline = time.monotonic() + timeout
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    while time.monotonic() < deadline:
        ended = {r.job_id for r in common.gateway().accounting(start, dt.datetime.now(dt.UTC))
                 if r.job_id in slurm_ids and state_from_slurm(r.state) in TERMINAL_STATES}  # fmt: skip
        if ended >= slurm_ids:
            return
        time.sleep(0.5)
    print(f"  ! sacct still lacks {len(slurm_ids - ended)} of the cancelled jobs after {timeout:.0f} s", file=sys.stderr)


class _TimedCall:
    """Within ``with``: ``module.name`` timed (``seconds``), and the queries it ran (``query_seconds``)."""

    def __init__(self, module, name: str):
        self.module, self.name, self.seconds, self.query_seconds = module, name, 0.0, 0.0

    def __enter__(self):
        from django.db import connection

        real = self.real = getattr(self.module, self.name)

        def timed(*args, **kwargs):
            timer, began = QueryTimer(), time.perf_counter()
            try:
                with connection.execute_wrapper(timer):
                    return real(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - began
                self.query_seconds += timer.seconds

        setattr(self.module, self.name, timed)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


def time_cycles(cycles: int) -> tuple[list[float], list[int], list[int], dict]:
    """Run jobs_sync ``cycles`` times; per cycle: seconds, Slurm calls, queries. And the last stats,
    with ``split``: the seconds of the last cycle in each Slurm call, in queries, and the rest."""
    from django.db import connection

    import jobs.services
    import portal.slurm
    from jobs.services import jobs_sync

    real = portal.slurm.get_gateway()
    gateways = contextlib.ExitStack()  # portal.slurm.use_gateway for the timed wrappers
    seconds, calls, queries = [], [], []
    stats: dict = {}
    try:
        for _ in range(cycles):
            timed = _Timed(real)
            gateways.enter_context(portal.slurm.use_gateway(timed))
            timer = QueryTimer()
            notify = _TimedCall(jobs.services, "job_end_notify_send")  # a worker's task, run inline here (eager)
            began = time.perf_counter()
            with connection.execute_wrapper(timer), notify:
                stats = jobs_sync()
            seconds.append(time.perf_counter() - began)
            calls.append(sum(timed.calls.values()))
            queries.append(timer.count)
            # where the last cycle's time went: each Slurm call's, the queries', the rest (Python)
            # (the job-end notice: a worker's task, which the bench's eager Celery runs inside the cycle)
            stats["split"] = {**{f"{name} (Slurm)": t for name, t in timed.seconds.items()},
                              "job_end_notify task (inline)": notify.seconds, "queries": timer.seconds - notify.query_seconds,
                              "the rest": seconds[-1] - sum(timed.seconds.values()) - timer.seconds - notify.seconds + notify.query_seconds}  # fmt: skip
    finally:
        gateways.close()
    return seconds, calls, queries, stats


def run(
    *, quick: bool = False, live: int | None = None, sizes: list[int] | None = None, cycles: int | None = None
) -> common.Section:
    live = live or (100 if quick else 1000)
    sizes = sorted(sizes or ([200, 500, 1000] if quick else [1000, 5000, 10000]))
    cycles = cycles or (3 if quick else 5)
    end_runs = 1 if quick else 3
    if sizes[0] < live:
        raise SystemExit(f"the smallest size ({sizes[0]}) must hold the {live} live jobs")
    section = common.Section(
        "Sync at scale: one jobs_sync() cycle",
        method=(
            f"{live} jobs live in Slurm (`sleep 600`, 1 GPU, debug; the bench account capped at 2 running GPUs, so "
            f"2 run and {live - 2} pend), the rest of the rows finished jobs. Per size: one cycle to settle "
            f"(states and reasons of the new rows), then {cycles} timed cycles of `jobs.services.jobs_sync()` in "
            "this process. Slurm calls counted by a wrapper around the real gateway; queries by a database "
            "execute wrapper. The controller also holds whatever else runs on the shared cluster. Then, at the "
            f"largest size, {end_runs} cycle(s) right after every live job was cancelled (the write path: all "
            f"{live} change state in one cycle), each with a fresh set of live jobs."
        ),
    )
    world = common.begin(section, truncate=True, gpu_cap=2)
    rows = ["| portal jobs | live in Slurm | cycle median (ms) | min–max (ms) | Slurm calls / cycle | queries / cycle | changed in last cycle |",
            "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    try:
        began = time.perf_counter()
        live_rows = submit_live(world, live)
        section.note(f"setup: {live} live jobs submitted through the gateway (4 at a time) in {time.perf_counter() - began:.1f} s")
        common.copy_jobs(live_rows)
        present = live
        for size in sizes:
            common.copy_jobs(history(world, size - present, present))
            present = size
            time_cycles(1)  # settle
            seconds, calls, queries, stats = time_cycles(cycles)
            runs = f"median of {cycles} cycles"
            section.add(f"{size} jobs ({live} live): cycle time", common.median(seconds) * 1000, "ms", runs)
            section.add(
                f"{size} jobs ({live} live): Slurm calls per cycle",
                max(calls),
                "calls",
                f"max of {cycles} cycles",
            )
            section.add(
                f"{size} jobs ({live} live): queries per cycle",
                max(queries),
                "queries",
                f"max of {cycles} cycles",
            )
            rows.append(f"| {size:,} | {stats.get('live', '?')} | {common.median(seconds) * 1000:.1f} | "
                        f"{min(seconds) * 1000:.1f}–{max(seconds) * 1000:.1f} | {min(calls)}–{max(calls)} | "
                        f"{min(queries)}–{max(queries)} | {stats.get('changed', '?')} |")  # fmt: skip
        section.extra_md = "\n".join(rows)
        # The write path: a cycle in which every live job has ended since the last one (scancel of
        # all of them; squeue still lists them as CANCELLED): one bulk UPDATE, one event insert.
        ended_seconds, ended_calls, ended_queries, ended_changed = [], [], [], []
        for _ in range(end_runs):
            common.drain_cluster()
            _wait_for_accounting({job.slurm_job_id for job in live_rows})  # as 30 s later in production
            seconds, calls, queries, stats = time_cycles(1)
            ended_seconds += seconds
            ended_calls += calls
            ended_queries += queries
            ended_changed.append(stats.get("changed", 0))
            if len(ended_seconds) < end_runs:  # live jobs again for the next run
                live_rows = submit_live(world, live)
                common.copy_jobs(live_rows)
                time_cycles(1)  # settle
        runs = f"median of {end_runs} cycles; {min(ended_changed)}–{max(ended_changed)} jobs changed per cycle"
        section.add(f"{sizes[-1]} jobs, all {live} live jobs ended since the last cycle: cycle time",
                    common.median(ended_seconds) * 1000, "ms", runs)  # fmt: skip
        section.add(f"{sizes[-1]} jobs, all {live} live jobs ended: Slurm calls per cycle", max(ended_calls), "calls",
                    f"max of {end_runs} cycles")  # fmt: skip
        section.add(f"{sizes[-1]} jobs, all {live} live jobs ended: queries per cycle", max(ended_queries), "queries",
                    f"max of {end_runs} cycles")  # fmt: skip
    finally:
        common.leave_cluster()
        common.truncate_jobs()
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="100 live jobs; 200, 500 and 1000 rows")
    parser.add_argument("--live", type=int)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--cycles", type=int)
    common.main(run, parser)


if __name__ == "__main__":
    main()
