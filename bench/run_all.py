"""Run every benchmark and write bench/results.md (what `make bench` does).

    eval "$(scripts/services up)" && .venv/bin/python bench/run_all.py [--quick] [--keep-db] [--only relay,api,...]

Creates the benchmark's own database from scratch (BENCH_DB, default gpuportal_bench) and drops it
at the end (unless --keep-db); drops nothing else. Cancels every job of the bench account it
submitted, so the cluster is left without bench jobs. Figures are printed as they come and written
to bench/results.md with the machine description; each benchmark is also runnable alone
(bench/bench_*.py --quick). No thresholds: nothing here fails because a figure is low."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ORDER = ("post_profile", "relay", "demo", "api", "sync", "ingest", "pages", "gpu_usage", "gpu_storage", "reports")
RESULTS = common.RESULTS


def reports_section(*, quick: bool) -> common.Section:
    """bench/bench_reports.py (the accounting benchmark, written by the accounting app's owner) in a
    subprocess against the same database; its output goes into the results as it printed it."""
    section = common.Section(
        "Accounting: cost reports over 1 000 000 rows, ingest of 100 000 records (bench_reports.py)"
    )
    common.print_header(section.title)
    script = common.ROOT / "bench" / "bench_reports.py"
    if not script.exists():
        section.note("bench/bench_reports.py does not exist yet: not run.")
        return section
    argv = [sys.executable, str(script)]
    if quick:
        argv += ["--rows", "20000", "--ingest", "5000", "--runs", "3"]
    section.method = f"`{' '.join(['bench/bench_reports.py', *argv[2:]])}` against the benchmark's database; output as printed:"
    began = time.monotonic()
    proc = subprocess.run(argv, cwd=common.ROOT, env=os.environ | {"DATABASE_URL": common.BENCH_DATABASE_URL},
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    print(proc.stdout, end="")
    section.extra_md = "```\n" + proc.stdout.strip() + "\n```"
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        section.note(
            f"bench_reports.py exited with {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
        )
        section.failed = True
    section.note(f"took {time.monotonic() - began:.0f} s")
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes everywhere")
    parser.add_argument(
        "--keep-db", action="store_true", help=f"keep the database {common.BENCH_DB} afterwards"
    )
    parser.add_argument(
        "--only",
        type=lambda s: s.split(","),
        default=list(ORDER),
        help=f"comma-separated subset of {','.join(ORDER)}",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write the results (default bench/results.md)")
    args = parser.parse_args()
    unknown = set(args.only) - set(ORDER)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")

    began = time.monotonic()
    print(f"benchmark database: {common.BENCH_DB} (created from scratch)")
    common.setup(fresh=True)
    import bench_api
    import bench_demo
    import bench_gpu_storage
    import bench_gpu_usage
    import bench_ingest
    import bench_pages
    import bench_post_profile
    import bench_relay
    import bench_sync
    from django.utils import timezone

    machine = common.machine()
    for key, value in machine.items():
        print(f"  {key}: {value}")
    started_at = timezone.now()
    runners = {
        "post_profile": lambda: bench_post_profile.run(quick=args.quick),
        "relay": lambda: bench_relay.run(quick=args.quick),
        "demo": lambda: bench_demo.run(quick=args.quick),
        "api": lambda: bench_api.run(quick=args.quick),
        "sync": lambda: bench_sync.run(quick=args.quick),
        "ingest": lambda: bench_ingest.run(quick=args.quick, since=started_at),
        "pages": lambda: bench_pages.run(quick=args.quick),
        "gpu_usage": lambda: bench_gpu_usage.run(quick=args.quick),
        "gpu_storage": lambda: bench_gpu_storage.run(quick=args.quick),
        "reports": lambda: reports_section(quick=args.quick),
    }
    sections: list[common.Section] = []
    try:
        for name in ORDER:
            if name not in args.only:
                continue
            try:
                sections.append(runners[name]())
            except Exception as exc:  # noqa: BLE001 — one failed benchmark must not lose the others' figures
                traceback.print_exc()
                failed = common.Section(f"{name}: failed")
                failed.note(f"{type(exc).__name__}: {exc}")
                failed.failed = True
                sections.append(failed)
    finally:
        common.stop_all()
        try:
            left = common.drain_cluster()
            if left:
                print(f"cancelled {left} bench jobs left in Slurm")
            common.gpu_limit_set(None)
        except Exception as exc:  # noqa: BLE001
            print(f"! could not check the cluster for bench jobs: {exc}", file=sys.stderr)
        common.clean_workdir()
        seconds = time.monotonic() - began
        common.write_results(sections, machine, quick=args.quick, seconds=seconds, path=args.results)
        if not args.keep_db:
            common.database_drop()
            print(f"database {common.BENCH_DB} dropped")
    print(f"done in {(time.monotonic() - began) / 60:.1f} min")
    failed = [section.title for section in sections if section.failed]
    if failed:  # the figures of the others are written; the exit status says some are missing
        sys.exit(f"failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
