"""Pages, reports and the job list on a year of a 1 000-GPU site (issue 39 item 3).

    eval "$(scripts/services up)"
    BENCH_DB=gpuportal_year .venv/bin/python bench/year_world.py          # the year, once
    BENCH_DB=gpuportal_year .venv/bin/python bench/bench_year_pages.py [--quick] [--runs 15]

Against the database bench/year_world.py wrote (BENCH_DB, default gpuportal_year; migrated first if a
migration is missing; the closed months rolled up first, as beat's usage-rollup keeps them on a site;
nothing else is written). Each URL is requested once to warm, then ``runs``
times through Django's test client in this process (no HTTP: the view, its queries and its
rendering; DEBUG=0): median and p95 (nearest rank) of the wall time, and the queries of one
request. As a manager of the busiest team (team-01, its own jobs: the visibility filter applies), an
admin (every job), and the finance user (reports). A deep page is the one after the middle job of the
list (its cursor, as a client paging down would hold it); "before" is the same depth read as the
list read it before keyset pages (OFFSET, and the count the page showed), on the same database."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("BENCH_DB", "gpuportal_year")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

BUDGET_SECONDS = (
    40  # at most about this long for one URL's runs: fewer runs of a slow one (said in its figure)
)


def _timed(client, url: str, runs: int, headers=None) -> tuple[list[float], int, int, int]:
    """(seconds of each run, queries of one request, status, bytes) of GET ``url``; the request that
    counts the queries is the first timed run."""
    from django.db import connection

    statements = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    response = client.get(url, headers=headers)
    if response.status_code != 200:
        return [], 0, response.status_code, 0
    began = time.perf_counter()
    with connection.execute_wrapper(count):
        client.get(url, headers=headers)
    first = time.perf_counter() - began
    runs = max(1, min(runs - 1, int(BUDGET_SECONDS / max(first, 1e-3))))
    times = [first]
    for _ in range(runs):
        began = time.perf_counter()
        client.get(url, headers=headers)
        times.append(time.perf_counter() - began)
    return times, len(statements), response.status_code, len(response.content)


def _add(section, label: str, client, url: str, runs: int, headers=None) -> float:
    """Time GET ``url`` and add the figure; its median in seconds (nan when it did not answer 200)."""
    times, queries, status, size = _timed(client, url, runs, headers)
    if status != 200:
        section.note(f"{label}: `{url}` answered {status}")
        return float("nan")
    section.add(f"{label}", common.median(times) * 1000, "ms",
                f"median of {len(times)}; p95 {common.percentile(times, 95) * 1000:.1f} ms; {queries} queries",
                f"`{url}` ({size / 1024:,.0f} kB)")  # fmt: skip
    return common.median(times)


def _deep_cursor(user, *, field: str = "created_at", **filters) -> tuple[str, int]:
    """The cursor after the middle job of ``user``'s list (ordered by ``field`` descending), and the depth."""
    from jobs.selectors import jobs_visible_to
    from portal.paging import cursor_after

    jobs = jobs_visible_to(user).filter(**filters).order_by(f"-{field}", "-id")
    depth = jobs.count() // 2
    return cursor_after(jobs[depth], field), depth


def _offset_page(section, user, depth: int, runs: int, size: int = 25) -> None:
    """The list's read at ``depth`` as it was before keyset pages: the count, then OFFSET."""
    from jobs.selectors import jobs_visible_to
    from jobs.views import JOBS_PER_PAGE

    jobs = jobs_visible_to(user).defer("script", "environment").order_by("-created_at")
    times = []
    for _ in range(runs + 1):
        began = time.perf_counter()
        jobs.count()
        list(jobs[depth : depth + JOBS_PER_PAGE])
        times.append(time.perf_counter() - began)
    times = times[1:]
    section.add(f"before (OFFSET): the count and the page at row {depth:,}", common.median(times) * 1000, "ms",
                f"median of {runs}; p95 {common.percentile(times, 95) * 1000:.1f} ms; 2 queries",
                "the two queries of the old page alone, without rendering")  # fmt: skip


def run(*, quick: bool = False, runs: int | None = None) -> common.Section:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.test import APIClient

    from accounting.models import UsageSlice
    from jobs.models import Job
    from portal.models import Team

    runs = runs or (3 if quick else 15)
    section = common.Section(f"Pages on a year of a 1 000-GPU site ({common.BENCH_DB}, bench_year_pages.py)",
                             method=__doc__.split("\n\n", 2)[2].replace("\n", " "))  # fmt: skip
    common.print_header(section.title)
    users = get_user_model().objects
    manager, admin, finance = (
        users.get(username="user000"),
        users.get(username="year-admin"),
        users.get(username="year-finance"),
    )
    team = Team.objects.get(slug="team-01")
    jobs = Job.objects.count()
    section.note(f"the database: {jobs:,} portal jobs, {UsageSlice.objects.count():,} usage slices, "
                 f"{Job.objects.filter(team=team).count():,} jobs of team-01")  # fmt: skip
    # the closed months as a site has them: rolled up by beat's usage-rollup (hourly) — the reports and
    # invoices read their totals (bench_year_reports.py times both ways)
    from accounting.services import usage_rollup

    began = time.perf_counter()
    rolled = usage_rollup()
    section.note(f"closed months rolled up first, as beat's usage-rollup does: {len(rolled)} not rolled yet, "
                 f"in {time.perf_counter() - began:.1f} s")  # fmt: skip
    page, api = Client(), APIClient()
    page.force_login(manager)
    api.force_authenticate(manager)
    admin_page, admin_api = Client(), APIClient()
    admin_page.force_login(admin)
    admin_api.force_authenticate(admin)
    finance_page, finance_api = Client(), APIClient()
    finance_page.force_login(finance)
    finance_api.force_authenticate(finance)

    cursor, depth = _deep_cursor(manager)
    admin_cursor, admin_depth = _deep_cursor(admin)
    ended_cursor, _ = _deep_cursor(admin, field="ended_at")
    failed_cursor, _ = _deep_cursor(manager, state="FAILED")
    _add(section, "job list page, first page (team-01's manager)", page, "/jobs/", runs)
    _add(
        section,
        f"job list page, deep page (row {depth:,} of team-01's)",
        page,
        f"/jobs/?cursor={cursor}",
        runs,
    )
    _offset_page(section, manager, depth, runs)
    _add(section, "job list page, filtered: state FAILED", page, "/jobs/?state=FAILED", runs)
    _add(
        section,
        "job list page, filtered: state FAILED, deep page",
        page,
        f"/jobs/?state=FAILED&cursor={failed_cursor}",
        runs,
    )
    _add(section, "job list page, filtered: mine", page, "/jobs/?mine=true", runs)
    _add(section, "job list page, first page (admin: every job)", admin_page, "/jobs/", runs)
    _add(
        section,
        f"job list page, deep page (admin, row {admin_depth:,})",
        admin_page,
        f"/jobs/?cursor={admin_cursor}",
        runs,
    )
    _offset_page(section, admin, admin_depth, runs)
    _add(section, "GET /api/v1/jobs/, first page", api, "/api/v1/jobs/", runs)
    _add(section, "GET /api/v1/jobs/, deep page", api, f"/api/v1/jobs/?cursor={cursor}", runs)
    _add(section, "GET /api/v1/jobs/?state=FAILED", api, "/api/v1/jobs/?state=FAILED", runs)
    _add(section, "GET /api/v1/jobs/?ordering=-ended_at (admin), deep page", admin_api,
         f"/api/v1/jobs/?ordering=-ended_at&cursor={ended_cursor}", runs)  # fmt: skip
    _job_pages(section, page, api, team, runs)
    _accounting_pages(section, page, finance_page, finance_api, team, runs=runs, quick=quick)
    _add(section, "dashboard (team-01's manager)", page, "/", runs)
    _add(section, "dashboard (admin)", admin_page, "/", runs)
    _ingestion(section, 3 if quick else 5)
    return section


def _job_pages(section, page, api, team, runs: int) -> None:
    """A job's page, its GPU section (the chart's data from the stored record) and its API answer:
    the largest array of team-01 and an ended 8-GPU job."""
    from jobs.models import Job

    array = (
        Job.objects.filter(team=team, gpu_summary__isnull=False, array_tasks__gt=1)
        .order_by("-array_tasks")
        .first()
    )
    eight = Job.objects.filter(team=team, gpu_summary__isnull=False, gpus=8).order_by("-ended_at").first()
    for label, job in ((f"array of {array.array_tasks} tasks", array), ("8-GPU job", eight)):
        _add(section, f"job page, {label}", page, f"/jobs/{job.pk}/", runs)
        _add(
            section,
            f"job page's GPU section (chart data), {label}",
            page,
            f"/jobs/{job.pk}/gpu/",
            runs,
            headers={"HX-Request": "true"},
        )  # the page's htmx request
        _add(section, f"GET /api/v1/jobs/<id>/, {label}", api, f"/api/v1/jobs/{job.pk}/", runs)


def _accounting_pages(section, page, finance_page, finance_api, team, *, runs: int, quick: bool) -> None:
    """The team's budget page (this period), its last whole month's invoice (HTML, PDF), the cost
    report for that month and for the twelve whole months (page, API, CSV)."""
    import datetime as dt

    from year_world import MONTHS, month

    first, last = month(0).date(), month(MONTHS - 1).date()  # the year's first and last whole months
    last_day = (month(MONTHS) - dt.timedelta(days=1)).date()
    _add(
        section,
        "team budget page (team-01, this period)",
        page,
        f"/accounting/budget/?team={team.slug}",
        runs,
    )
    _add(
        section, "GET /api/v1/teams/team-01/budget/", finance_api, f"/api/v1/teams/{team.slug}/budget/", runs
    )
    html = _add(
        section,
        f"team-01's invoice for {last:%Y-%m}, HTML",
        page,
        f"/accounting/invoices/{team.slug}/{last:%Y-%m}/",
        runs,
    )
    if html < 1:  # WeasyPrint takes ~30 x the HTML's time: a PDF of minutes is not timed here
        _add(
            section,
            f"team-01's invoice for {last:%Y-%m}, PDF",
            page,
            f"/accounting/invoices/{team.slug}/{last:%Y-%m}.pdf",
            3,
        )
    else:
        section.note(f"team-01's invoice PDF for {last:%Y-%m} not timed: its HTML alone takes {html:.1f} s (one line a "
                     "usage record; WeasyPrint took ~30 x the HTML's time on 1 % of this year)")  # fmt: skip
    for label, start, stop in (("a month", last, last_day), ("the year", first, last_day)):
        query = f"start={start}&end={stop}"
        _add(section, f"cost report page, {label}", finance_page, f"/accounting/reports/?{query}", runs)
        _add(
            section,
            f"GET /api/v1/reports/cost/, {label}",
            finance_api,
            f"/api/v1/reports/cost/?{query}",
            runs,
        )
        _add(
            section,
            f"cost report CSV, {label}",
            finance_api,
            f"/api/v1/reports/cost/?{query}&format=csv",
            runs,
        )
        _add(
            section,
            f"cost report by user, {label}",
            finance_api,
            f"/api/v1/reports/cost/?{query}&group_by=user",
            runs,
        )


class _RolledBack(Exception):
    pass


def _day_records(day, *, new: bool) -> list:
    """A day's allocations as sacct gives them (portal.slurm.types.AccountingRecord), read back from
    the year's usage records that started that day; ``new``: the same allocations under unused job ids
    (a day not ingested yet)."""
    import datetime as dt

    from accounting.models import UsageRecord
    from portal.slurm.types import AccountingRecord

    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    rows = UsageRecord.objects.filter(start_time__gte=start, start_time__lt=start + dt.timedelta(days=1))
    shift = 900_000_000 if new else 0
    return [AccountingRecord(
        job_id=r.job_id + shift, name=r.name, user=r.unix_user, account=r.account, partition=r.partition, state=r.state,
        exit_code=0, submit_time=r.submit_time, start_time=r.start_time, end_time=r.end_time,
        elapsed_seconds=r.elapsed_seconds, time_limit_minutes=r.time_limit_minutes, num_nodes=r.num_nodes,
        nodes="a100-001", alloc_tres={"gres/gpu": r.gpus, f"gres/gpu:{r.gpu_type}": r.gpus},
        req_tres={"gres/gpu": r.gpus}, comment=r.comment, cluster=r.cluster,
    ) for r in rows]  # fmt: skip


def _ingestion(section, runs: int) -> None:
    """Usage ingestion of a day (accounting.services.usage_records_upsert, what each cycle does with
    sacct's answer; sacct itself is bench_ingest.py's): the day read again (every record known: the
    steady state) and a day not seen yet (written, then rolled back: the year stays as it was)."""
    import datetime as dt

    from django.db import connection, transaction
    from year_world import MONTHS, month

    from accounting.services.ingestion import usage_records_upsert

    day = (month(MONTHS) - dt.timedelta(days=10)).date()
    statements: list[str] = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    for label, new in (
        ("the day again (known records)", False),
        ("a day not ingested yet (rolled back)", True),
    ):
        records = _day_records(day, new=new)
        times, result = [], None
        for _ in range(runs):
            statements.clear()
            began = time.perf_counter()
            try:
                with transaction.atomic(), connection.execute_wrapper(count):
                    result = usage_records_upsert(records=records)
                    times.append(time.perf_counter() - began)
                    raise _RolledBack
            except _RolledBack:
                pass
        section.add(
            f"usage ingestion of a day, {label}: {len(records):,} allocations", common.median(times) * 1000, "ms",
            f"median of {runs}; p95 {common.percentile(times, 95) * 1000:.1f} ms; {len(statements)} queries",
            f"{result.written:,} records written, {result.slices:,} slices",
        )  # fmt: skip


def main() -> None:
    parser = common.arguments(__doc__, quick="3 runs a URL")
    parser.add_argument("--runs", type=int)
    args = parser.parse_args()
    common.setup()
    section = run(**vars(args))
    section.note(
        f"load average at the end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
    )
    common.write_section(section)


if __name__ == "__main__":
    main()
