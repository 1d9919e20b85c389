"""Cost reports and invoices on a year of a 1 000-GPU site, read from the slices and from the closed
months' totals (issue 39 item 3; accounting.services.usage_rollup).

    eval "$(scripts/services up)"
    BENCH_DB=gpuportal_year .venv/bin/python bench/year_world.py [--scale 0.25]   # the year, once
    BENCH_DB=gpuportal_year .venv/bin/python bench/bench_year_reports.py [--quick] [--runs 11] [--modes totals]

Against the database bench/year_world.py wrote (BENCH_DB; migrated first if a migration is missing).
First the closed months are rolled up as the periodic task would (``usage_rollup``; those rolled
already are rolled again: timed, what closing a year of months costs). Then each URL is timed as bench_year_pages.py times it (one
request to warm, then ``runs`` through Django's test client in this process, DEBUG=0: median, p95,
the queries of one request) in two modes, alternating, ``rounds`` times: "slices" (every month
marked stale: the reports read the slices, as before the roll-up, and the invoice lists every job as
before) and "totals" (the months rolled: the reports read the totals; an invoice of more than
INVOICE_JOB_LINES_MAX jobs lists users × GPU types × rates, its jobs are the CSV). The figures of the
last round are kept; both modes' results are compared (they must be equal, to the cent)."""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("BENCH_DB", "gpuportal_year")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_year_pages import _add


def _mode(name: str) -> None:
    from django.conf import settings

    from accounting.models import UsageMonth

    if name == "slices":
        UsageMonth.objects.update(stale=True)
        settings.INVOICE_JOB_LINES_MAX = 10**9
    else:
        UsageMonth.objects.filter(rolled_at__isnull=False).update(stale=False)
        settings.INVOICE_JOB_LINES_MAX = _DEFAULT_LINES


def _csv(section, label: str, client, url: str, runs: int) -> None:
    times, size = [], 0
    for i in range(runs + 1):
        began = time.perf_counter()
        response = client.get(url)
        body = b"".join(response.streaming_content)
        if i:
            times.append(time.perf_counter() - began)
        size = len(body)
    rows = body.count(b"\n") - 1
    section.add(label, common.median(times) * 1000, "ms", f"median of {len(times)}; p95 {common.percentile(times, 95) * 1000:.1f} ms",
                f"`{url}` ({size / 1024:,.0f} kB, {rows:,} rows)")  # fmt: skip


def _urls(team, first, last, last_day) -> list[tuple[str, str, str]]:
    """(label, client, url) of what is timed in both modes."""
    out = [(f"team-01's invoice for {last:%Y-%m}, HTML", "manager", f"/accounting/invoices/{team.slug}/{last:%Y-%m}/")]
    for label, start, stop in (("a month", last, last_day), ("the year", first, last_day)):
        query = f"start={start}&end={stop}"
        out += [
            (f"cost report page, {label}", "finance", f"/accounting/reports/?{query}"),
            (f"GET /api/v1/reports/cost/, {label}", "finance_api", f"/api/v1/reports/cost/?{query}"),
            (f"cost report CSV, {label}", "finance_api", f"/api/v1/reports/cost/?{query}&format=csv"),
            (f"cost report by user, {label}", "finance_api", f"/api/v1/reports/cost/?{query}&group_by=user"),
        ]
    return out


def run(*, quick: bool = False, runs: int | None = None, rounds: int = 2,
        modes: tuple[str, ...] = ("slices", "totals")) -> common.Section:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from rest_framework.test import APIClient

    from accounting.models import UsageMonth, UsageMonthTotal, UsageSlice
    from accounting.services import usage_month_roll, usage_rollup
    from portal.models import Team
    from year_world import MONTHS, month

    global _DEFAULT_LINES
    _DEFAULT_LINES = settings.INVOICE_JOB_LINES_MAX
    runs = runs or (3 if quick else 11)
    section = common.Section(f"Cost reports and invoices on a year: slices or closed months' totals ({common.BENCH_DB}, bench_year_reports.py)",
                             method=__doc__.split("\n\n", 2)[2].replace("\n", " "))  # fmt: skip
    common.print_header(section.title)
    load = os.getloadavg()
    section.note(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    began = time.perf_counter()
    rolled = usage_rollup()  # the months never rolled; the others are rolled again, to time it
    for month_ in UsageMonth.objects.filter(rolled_at__isnull=False).exclude(period__in=rolled).values_list("period", flat=True):
        usage_month_roll(period=month_)
        rolled.append(month_)
    took = time.perf_counter() - began
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s), pg_total_relation_size(%s)",
                       [UsageMonthTotal._meta.db_table, UsageSlice._meta.db_table])  # fmt: skip
        totals_size, slices_size = cursor.fetchone()
    section.note(f"the roll-up: {len(rolled)} months rolled in {took:.1f} s ({took / max(len(rolled), 1):.1f} s a month) -> "
                 f"{UsageMonthTotal.objects.count():,} rows, {totals_size / 2**20:.1f} MiB, for {UsageSlice.objects.count():,} slices "
                 f"({slices_size / 2**20:.0f} MiB)")  # fmt: skip

    users = get_user_model().objects
    team = Team.objects.get(slug="team-01")
    clients = {"manager": Client(), "finance": Client(), "finance_api": APIClient()}
    clients["manager"].force_login(users.get(username="user000"))
    clients["finance"].force_login(users.get(username="year-finance"))
    clients["finance_api"].force_authenticate(users.get(username="year-finance"))
    first, last = month(0).date(), month(MONTHS - 1).date()
    last_day = (month(MONTHS) - dt.timedelta(days=1)).date()
    urls = _urls(team, first, last, last_day)

    answers = {}
    for round_ in range(rounds):
        for mode in modes:
            _mode(mode)
            keep = round_ == rounds - 1
            target = section if keep else common.Section("warm-up round")
            for label, who, url in urls:
                client = clients[who]
                if mode == "slices" and "invoice" in label and not keep:
                    continue  # the slow one: timed once, in the kept round
                _add(target, f"{label} [{mode}]", client, url, runs)
                if keep:
                    answers.setdefault(url, {})[mode] = _content(client.get(url))
            if mode == "totals" and keep:
                _add(section, f"team-01's invoice for {last:%Y-%m}, PDF [totals]", clients["manager"],
                     f"/accounting/invoices/{team.slug}/{last:%Y-%m}.pdf", 3)  # fmt: skip
                _csv(section, f"team-01's invoice for {last:%Y-%m}, the jobs' CSV", clients["manager"],
                     f"/accounting/invoices/{team.slug}/{last:%Y-%m}-jobs.csv", 3)
    _mode("totals")
    if len(modes) > 1:  # one mode alone has nothing to be compared with
        same = [url for url, by in answers.items() if by.get("slices") == by.get("totals")]
        section.note(f"the same answer in both modes (API JSON, CSV): {len([u for u in same if '/api/' in u])} of "
                     f"{len([u for u in answers if '/api/' in u])} API URLs")  # fmt: skip
    else:
        section.note(f"modes: {', '.join(modes)} only (--modes)")
    load = os.getloadavg()
    section.note(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return section


_DEFAULT_LINES = 500


def _content(response) -> bytes:
    return response.content if response.get("Content-Type", "").startswith(("application/json", "text/csv")) else b""


def main() -> None:
    parser = common.arguments(__doc__, quick="3 runs a URL")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="slices,totals",
                        help="slices,totals (default) or one of them: at --scale 1 the slices mode of a year takes minutes")
    args = parser.parse_args()
    args.modes = tuple(args.modes.split(","))
    common.setup()
    section = run(**vars(args))
    common.write_section(section)


if __name__ == "__main__":
    main()
