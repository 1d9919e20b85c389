"""Pages: the job list (``/jobs/`` page and ``GET /api/v1/jobs/``) with 100 000 jobs in the database.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_pages.py [--quick] [--jobs 100000] [--runs 7]

The jobs (finished, one a minute back in time, all of the bench team) are written with one COPY. The
requests run in this process through Django's test client (no HTTP: the figure is the view, its
queries and its rendering), as the bench user, a plain member of the team (the visibility filter
applies); each case is requested once to warm, then timed ``runs`` times."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_relay import QueryTimer
from bench_sync import history

CASES = [
    ("page", "/jobs/", "job list page, first page"),
    ("page", "/jobs/?cursor={mid}", "job list page, middle page (its keyset cursor)"),
    ("page", "/jobs/?state=RUNNING", "job list page, filtered to a state no row has"),
    ("page", "/jobs/?mine=true&team=gpbench", "job list page, mine + team filters"),
    ("api", "/api/v1/jobs/", "GET /api/v1/jobs/, first page"),
    ("api", "/api/v1/jobs/?cursor={mid}", "GET /api/v1/jobs/, middle page (its keyset cursor)"),
    ("api", "/api/v1/jobs/?state=COMPLETED", "GET /api/v1/jobs/?state=COMPLETED"),
]


def run(*, quick: bool = False, jobs: int | None = None, runs: int | None = None) -> common.Section:
    from django.db import connection
    from django.test import Client

    count = jobs or (10_000 if quick else 100_000)
    runs = runs or (3 if quick else 7)
    section = common.Section(
        f"Pages: job list with {count:,} jobs",
        method=(
            f"{count:,} finished jobs of the bench team written with COPY (then VACUUM (ANALYZE), as autovacuum would). Each URL requested once "
            f"to warm, then {runs} times through Django's test client in this process (no HTTP, DEBUG=0) as a "
            "plain member of the team; median time, and the queries of one request. Pages hold 25 rows (page) or "
            "50 (API)."
        ),
    )
    world = common.begin(section, slurm=False, truncate=True)
    try:
        seconds = 0.0
        for start in range(0, count, 20_000):  # in batches: memory stays small
            seconds += common.copy_jobs(history(world, min(20_000, count - start), start))
        section.note(f"setup: {count:,} jobs written with COPY in {seconds:.1f} s ({count / seconds:,.0f} rows/s)")
        page_client = Client()
        page_client.force_login(world.user)
        api_client = Client(HTTP_AUTHORIZATION=f"Token {world.token}")
        mid = _middle_cursor(world.user)
        for kind, url, label in CASES:
            url = url.format(mid=mid)
            client = page_client if kind == "page" else api_client
            response = client.get(url)
            if response.status_code != 200:
                section.note(f"{url} answered {response.status_code}")
                continue
            timer = QueryTimer()
            with connection.execute_wrapper(timer):
                client.get(url)
            times = []
            for _ in range(runs):
                began = time.perf_counter()
                client.get(url)
                times.append(time.perf_counter() - began)
            section.add(label, common.median(times) * 1000, "ms", f"median of {runs}; {timer.count} queries per request",
                        f"`{url}`")  # fmt: skip
        submit_seconds, submit_queries = _submit_with_history(api_client, runs)
        section.add("POST /api/v1/jobs/ (one job) with these jobs in the team's history", submit_seconds * 1000, "ms",
                    f"median of {runs}; {submit_queries} queries per request",
                    "the budget check under the team lock: its hold query reads jobs in flight, not the history")  # fmt: skip
    finally:
        common.truncate_jobs()
    return section


def _middle_cursor(user) -> str:
    """The cursor after the middle job of the user's list (newest first), as a client paging down holds it."""
    from jobs.selectors import jobs_visible_to
    from portal.paging import cursor_after

    jobs = jobs_visible_to(user).order_by("-created_at", "-id")
    return cursor_after(jobs[jobs.count() // 2], "created_at")


def _submit_with_history(client, runs: int) -> tuple[float, int]:
    """Median seconds and queries of one submission (test client; the relay message stubbed)."""
    from django.db import connection

    from bench_relay import _no_relay, job_body

    def post():
        response = client.post("/api/v1/jobs/", job_body("pages-submit"), content_type="application/json")
        if response.status_code != 201:
            print(f"  ! POST answered {response.status_code}: {response.content[:300]!r}", file=sys.stderr)

    with _no_relay():
        post()  # warm
        timer = QueryTimer()
        with connection.execute_wrapper(timer):
            post()
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            post()
            times.append(time.perf_counter() - began)
    return common.median(times), timer.count


def main() -> None:
    parser = common.arguments(__doc__, quick="10 000 jobs, 3 runs")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--runs", type=int)
    common.main(run, parser)


if __name__ == "__main__":
    main()
