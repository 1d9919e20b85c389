"""Ingestion: a real accounting read (``get_gateway().accounting()``, i.e. sacct) of the jobs the
benchmarks ran, recorded by the accounting app's ingest service (``accounting.services.usage_ingest``).

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_ingest.py [--quick] [--minutes 60] [--runs 3]

The window is the last ``--minutes`` (run_all passes the time it started), so it holds every job of
the bench account and whatever else ran on the shared cluster meanwhile (sacct -a). Before each run
the usage tables of the benchmark's database are emptied, so every run ingests all records anew.
The 100 000-record synthetic ingest rate and the 1 000 000-row cost report are bench/bench_reports.py."""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_relay import _Timed


def run(*, quick: bool = False, since: dt.datetime | None = None, runs: int | None = None) -> common.Section:
    from django.db import connection
    from django.utils import timezone

    import portal.slurm
    from accounting.models import UsageRecord, UsageSlice
    from accounting.services import usage_ingest

    runs = runs or (2 if quick else 3)
    since = since or timezone.now() - dt.timedelta(hours=1)
    section = common.Section(
        "Ingestion: real accounting read of the jobs run",
        method=(
            f"`accounting.services.usage_ingest(since=…)` over the window since {since:%H:%M:%S} UTC (the "
            f"benchmarks' jobs and any other job of the shared cluster in it): one `gateway.accounting()` (sacct -X "
            f"--parsable2) per window, then the bulk upsert of records and slices. {runs} runs, the usage tables "
            "emptied before each; medians."
        ),
    )
    common.print_header(section.title)
    common.world()
    real = portal.slurm.get_gateway()
    gateways = contextlib.ExitStack()  # portal.slurm.use_gateway for the timed wrappers
    totals, reads, upserts = [], [], []
    result = None
    try:
        for _ in range(runs):
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {UsageSlice._meta.db_table}, {UsageRecord._meta.db_table} CASCADE")
            timed = _Timed(real)
            gateways.enter_context(portal.slurm.use_gateway(timed))
            began = time.perf_counter()
            result = usage_ingest(since=since)
            total = time.perf_counter() - began
            sacct = timed.seconds.get("accounting", 0.0)
            totals.append(total)
            reads.append(sacct)
            upserts.append(total - sacct)
    finally:
        gateways.close()
    n = result.read
    runs_text = (
        f"median of {runs} runs; {n} allocations read, {result.started} started, {result.written} written"
    )
    section.add("ingest, sacct read + upsert", n / common.median(totals), "rows/s", runs_text)
    section.add(
        "  sacct read (gateway.accounting)",
        common.median(reads) * 1000,
        "ms",
        f"median of {runs} runs, {n} rows",
    )
    section.add("  upsert of records and slices", common.median(upserts) * 1000, "ms",
                f"median of {runs} runs, {result.started} records")  # fmt: skip
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="2 runs")
    parser.add_argument("--minutes", type=int, default=60, help="window: the last N minutes (default 60)")
    parser.add_argument("--runs", type=int)
    args = parser.parse_args()
    common.setup()
    from django.utils import timezone

    run(quick=args.quick, since=timezone.now() - dt.timedelta(minutes=args.minutes), runs=args.runs)


if __name__ == "__main__":
    main()
