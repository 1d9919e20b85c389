"""Usage ingestion of a day on a year of a 1 000-GPU site: bench_year_pages.py's ingestion alone, for
alternating before/after runs (issue 39 item 3: a day's ingestion < 1 s).

    eval "$(scripts/services up)"
    BENCH_DB=gpuportal_year .venv/bin/python bench/year_world.py               # a year, once
    BENCH_DB=gpuportal_year .venv/bin/python bench/bench_year_ingest.py [--runs 5] [--label before]

``accounting.services.usage_records_upsert`` of the year's day ten days before the current month (what
each cycle does with sacct's answer; sacct itself is bench_ingest.py's) in this process, DEBUG=0: the day
read again (every record known: the steady state) and the same allocations under unused job ids (a day
not ingested yet: written, then rolled back, so the year stays as it was); median and p95 of ``runs``,
the queries of one run. ``--label`` names the side in the section's title, so that alternating runs of
two checkouts land side by side in bench/results.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("BENCH_DB", "gpuportal_year")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_year_pages
import common


def run(*, quick: bool = False, runs: int | None = None, label: str = "") -> common.Section:
    runs = runs or (3 if quick else 5)
    title = f"Usage ingestion of a day on a year ({common.BENCH_DB}, bench_year_ingest.py{', ' + label if label else ''})"
    section = common.Section(title, method=__doc__.split("\n\n", 2)[2].replace("\n", " "))
    common.print_header(section.title)
    section.note("load average at the start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    bench_year_pages._ingestion(section, runs)
    section.note("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return section


if __name__ == "__main__":
    parser = common.arguments(__doc__, quick="3 runs")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--label", default="")
    common.write_section(common.main(run, parser))
