"""Accounting benchmark: cost-report speed over 1 000 000 usage rows, the same monthly question put
to sreport on the real cluster, and the ingest rate of 100 000 sacct records. Prints figures; no
thresholds.

    DATABASE_URL=postgres://gpuportal@127.0.0.1:5432/gpuportal_bench \
        .venv/bin/python bench/bench_reports.py [--rows 1000000] [--ingest 100000] [--runs 7]

Creates the database when missing, migrates it, and replaces its accounting tables' contents."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")
os.environ.setdefault("DATABASE_URL", "postgres://gpuportal@127.0.0.1:5432/gpuportal_bench")

UTC = dt.timezone.utc
ACCOUNTS = [f"team{i:02d}" for i in range(20)]
USERS = [f"user{i:03d}" for i in range(200)]
TYPES = [("a100", 8), ("h100", 16)]


def ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = psycopg.connect(host=parts.hostname, port=parts.port or 5432, user=parts.username, password=parts.password, dbname="postgres", autocommit=True)
    if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        admin.execute(f'CREATE DATABASE "{name}"')
    admin.close()


def setup_django():
    import django

    if not os.environ["DATABASE_URL"].startswith("postgres"):
        sys.exit("bench_reports needs DATABASE_URL=postgres://…")
    ensure_database(os.environ["DATABASE_URL"])
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed_reference():
    from accounting.models import Rate
    from portal.models import Team

    for account in ACCOUNTS:
        Team.objects.get_or_create(slug=account, defaults={"name": account.title(), "slurm_account": account})
    for gpu_type, price in TYPES:
        Rate.objects.get_or_create(gpu_type=gpu_type, partition="", effective_from=dt.date(2024, 1, 1),
                                   defaults={"price_per_gpu_hour": price})  # fmt: skip
    return dict(Team.objects.values_list("slurm_account", "pk")), {r.gpu_type: r for r in Rate.objects.all()}


def load_rows(count: int) -> float:
    """COPY ``count`` records and one slice each (jobs of 2025, 1 min – 24 h, within one month), in
    time order as the periodic ingestion appends them (a month's rows sit together on disk)."""
    from django.db import connection

    teams, rates = seed_reference()
    rng = random.Random(42)
    year = dt.datetime(2025, 1, 1, tzinfo=UTC)
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE accounting_usageslice, accounting_usagerecord RESTART IDENTITY")
        raw = cursor.cursor  # psycopg cursor
        record_cols = ("id, cluster, job_id, submit_time, start_time, end_time, state, name, account, team_id, unix_user, "
                       "partition, num_nodes, comment, gpus, gpu_type, elapsed_seconds, time_limit_minutes, gpu_seconds, "
                       "gpu_hours, requested_gpu_hours, provisional, known_until, first_seen_at, reservation")  # fmt: skip
        slice_cols = ("record_id, period, slice_start, slice_end, cluster, account, team_id, unix_user, gpu_type, partition, "
                      "gpus, gpu_seconds, requested_gpu_seconds, rate_id, price_per_gpu_hour, cost, provisional")  # fmt: skip
        jobs = []
        offsets = sorted(rng.randrange(0, 365 * 86400 - 90000) for _ in range(count))
        with raw.copy(f"COPY accounting_usagerecord ({record_cols}) FROM STDIN") as copy:
            for i in range(1, count + 1):
                start = year + dt.timedelta(seconds=offsets[i - 1])
                seconds = rng.randrange(60, 86400)
                month_end = dt.datetime(start.year + (start.month == 12), start.month % 12 + 1, 1, tzinfo=UTC)
                end = min(start + dt.timedelta(seconds=seconds), month_end)
                seconds = int((end - start).total_seconds()) or 1
                end = start + dt.timedelta(seconds=seconds)
                gpus = rng.choice((1, 1, 2, 4, 8))
                gpu_type = rng.choice(TYPES)[0]
                account = rng.choice(ACCOUNTS)
                user = rng.choice(USERS)
                limit = seconds // 60 + rng.randrange(1, 600)
                gpu_seconds = gpus * seconds
                copy.write_row((
                    i, "bench", i, start - dt.timedelta(minutes=1), start, end, "COMPLETED", "job", account, teams[account],
                    user, "gpu", 1, "", gpus, gpu_type, seconds, limit, gpu_seconds, round(gpu_seconds / 3600, 6),
                    round(gpus * limit / 60, 6), False, end, end, "",
                ))  # fmt: skip
                jobs.append((i, start, end, account, user, gpu_type, gpus, gpu_seconds, gpus * limit * 60))
        with raw.copy(f"COPY accounting_usageslice ({slice_cols}) FROM STDIN") as copy:
            for i, start, end, account, user, gpu_type, gpus, gpu_seconds, requested in jobs:
                rate = rates[gpu_type]
                copy.write_row((
                    i, start.date().replace(day=1), start, end, "bench", account, teams[account], user, gpu_type, "gpu",
                    gpus, gpu_seconds, requested, rate.pk, rate.price_per_gpu_hour,
                    round(gpu_seconds * rate.price_per_gpu_hour / 3600, 6), False,
                ))  # fmt: skip
        cursor.execute("SELECT setval('accounting_usagerecord_id_seq', %s)", [count])
        cursor.execute("ANALYZE accounting_usagerecord")
        cursor.execute("ANALYZE accounting_usageslice")
    return time.monotonic() - began


def time_reports(runs: int) -> None:
    from accounting.selectors import cost_report

    cases = [
        ("one month, by team", dict(start=dt.date(2025, 6, 1), end=dt.date(2025, 6, 30), group_by="team")),
        ("one month, by user", dict(start=dt.date(2025, 6, 1), end=dt.date(2025, 6, 30), group_by="user")),
        ("whole year, by month", dict(start=dt.date(2025, 1, 1), end=dt.date(2025, 12, 31), group_by="month")),
        ("mid-month range, by gpu_type", dict(start=dt.date(2025, 3, 10), end=dt.date(2025, 4, 20), group_by="gpu_type")),
    ]
    for label, kwargs in cases:
        cost_report(**kwargs)  # warm
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            rows = cost_report(**kwargs)
            times.append(time.perf_counter() - began)
        print(f"cost_report {label:<30} median {statistics.median(times) * 1000:8.1f} ms over {runs} runs "
              f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}; {len(rows)} rows)")  # fmt: skip


def time_sreport(runs: int) -> None:
    """The same question — GPU usage per account over a month — asked of the portal (PostgreSQL,
    the rows above) and of sreport on the real cluster (slurmdbd's hourly roll-up of whatever the
    local cluster ran: other data, so only the time to answer compares; sreport gives GPU-minutes,
    no money, finished hours only)."""
    from accounting.selectors import account_gpu_seconds, billing_midnight
    from portal.slurm import SlurmError, get_gateway

    start_at, end_at = billing_midnight(dt.date(2025, 6, 1)), billing_midnight(dt.date(2025, 7, 1))
    account_gpu_seconds(start_at=start_at, end_at=end_at)  # warm
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        mine = account_gpu_seconds(start_at=start_at, end_at=end_at)
        times.append(time.perf_counter() - began)
    print(f"portal  GPU-minutes per account, one month   median {statistics.median(times) * 1000:8.1f} ms over {runs} runs "
          f"({len(mine)} accounts, over the rows above)")  # fmt: skip
    gateway = get_gateway()
    end = dt.datetime.now(UTC)
    start = end - dt.timedelta(days=30)
    try:
        gateway.account_gpu_minutes(start, end)  # warm
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            theirs = gateway.account_gpu_minutes(start, end)
            times.append(time.perf_counter() - began)
        jobs = len(gateway.accounting(start, end))
    except SlurmError as exc:
        print(f"sreport GPU-minutes per account, 30 days     not available: {exc.message}")
        return
    print(f"sreport GPU-minutes per account, 30 days     median {statistics.median(times) * 1000:8.1f} ms over {runs} runs "
          f"({len(theirs)} accounts with rolled-up usage; slurmdbd holds {jobs} jobs in the window; "
          f"the real cluster's data, not the rows above)")  # fmt: skip


def sacct_text(count: int) -> str:
    from portal.slurm.parsing import FIELD_SEP
    from portal.slurm.tags import slurm_tag

    rng = random.Random(7)
    lines = []
    base = dt.datetime(2026, 3, 1)
    for i in range(count):
        start = base + dt.timedelta(seconds=rng.randrange(0, 28 * 86400))
        seconds = rng.randrange(60, 2 * 86400)  # some cross into April
        gpus = rng.choice((1, 2, 4))
        gpu_type = rng.choice(TYPES)[0]
        tres = f"billing={gpus},cpu={gpus},gres/gpu:{gpu_type}={gpus},gres/gpu={gpus},mem={gpus * 8}G,node=1"
        fmt = "%Y-%m-%dT%H:%M:%S"
        lines.append(FIELD_SEP.join([
            str(5_000_000 + i), rng.choice(USERS), rng.choice(ACCOUNTS), "gpu", "COMPLETED", "0:0",
            (start - dt.timedelta(minutes=2)).strftime(fmt), start.strftime(fmt),
            (start + dt.timedelta(seconds=seconds)).strftime(fmt), str(seconds), str(seconds // 60 + 60), "1",
            "a100-01", tres, tres, "", "bench", str(5_000_000 + i), "train", slurm_tag(f"{i:08x}-0000-4000-8000-000000000000"),
        ]))  # fmt: skip
    return "\n".join(lines) + "\n"


def time_ingest(count: int) -> None:
    from accounting.models import UsageRecord
    from accounting.services import usage_records_upsert
    from portal.slurm.cli import parse_sacct

    UsageRecord.objects.filter(cluster="bench", job_id__gte=5_000_000).delete()
    text = sacct_text(count)
    for label in ("first ingest (all new)", "re-ingest (nothing changed)"):
        began = time.perf_counter()
        records = parse_sacct(text)
        parsed = time.perf_counter()
        result = usage_records_upsert(records=records)
        done = time.perf_counter()
        print(f"ingest {label:<28} {count / (done - began):10.0f} rows/s  (parse {parsed - began:.2f} s, "
              f"upsert {done - parsed:.2f} s; {result.written} written, {result.slices} slices)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ingest", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip-load", action="store_true", help="reuse the rows already loaded")
    parser.add_argument("--ingest-only", action="store_true", help="only the ingest rate (no cluster needed)")
    args = parser.parse_args()
    setup_django()
    if args.ingest_only:
        time_ingest(args.ingest)
        return
    from django.db import connection

    if not args.skip_load:
        seconds = load_rows(args.rows)
        print(f"loaded {args.rows} usage records + {args.rows} slices by COPY in {seconds:.1f} s")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM accounting_usageslice")
        print(f"usage slices in {connection.settings_dict['NAME']}: {cursor.fetchone()[0]}")
    time_reports(args.runs)
    time_sreport(args.runs)
    time_ingest(args.ingest)


if __name__ == "__main__":
    main()
