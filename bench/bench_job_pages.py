"""The job page of the largest array of a year's busiest team, and of an 8-GPU job: the slowest page of
bench_year_pages.py alone, for alternating before/after runs (issue 39 item 3: pages p95 < 300 ms).

    eval "$(scripts/services up)"
    BENCH_DB=gpuportal_year .venv/bin/python bench/year_world.py [--scale 0.05]   # a year, once
    BENCH_DB=gpuportal_year .venv/bin/python bench/bench_job_pages.py [--runs 30] [--label before]

As bench_year_pages.py times a URL (Django's test client in this process, DEBUG=0, one warm-up
request, median and p95 of ``runs``, the queries of one request), as team-01's manager. ``--label``
names the side in the section's title, so that alternating runs of two checkouts land side by side in
bench/results.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("BENCH_DB", "gpuportal_year")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_year_pages
import common


def run(*, quick: bool = False, runs: int | None = None, label: str = "") -> common.Section:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from jobs.models import Job
    from portal.models import Team

    runs = runs or (5 if quick else 30)
    title = f"Job pages on a year ({common.BENCH_DB}, bench_job_pages.py{', ' + label if label else ''})"
    section = common.Section(title, method=__doc__.split("\n\n", 2)[2].replace("\n", " "))
    common.print_header(section.title)
    page = Client()
    page.force_login(get_user_model().objects.get(username="user000"))
    team = Team.objects.get(slug="team-01")
    array = Job.objects.filter(team=team, array_tasks__gt=1).order_by("-array_tasks").first()
    eight = Job.objects.filter(team=team, gpus=8).order_by("-ended_at").first()
    for name, job in ((f"array of {array.array_tasks} tasks", array), ("8-GPU job", eight)):
        bench_year_pages._add(section, f"job page, {name}", page, f"/jobs/{job.pk}/", runs)
    load = os.getloadavg()
    section.note(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="5 runs a URL")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    common.setup()
    common.write_section(run(**vars(args)))


if __name__ == "__main__":
    main()
