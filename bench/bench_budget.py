"""The budget check of a submission (``accounting.services.budget_holds_place``): its latency and
queries as the team's open holds and usage grow, and how long it holds the lock of the team's
running totals.

    eval "$(scripts/services up)" && BENCH_DB=gpuportal_bench_budget .venv/bin/python bench/bench_budget.py [--runs 200]

Each placement runs in its own transaction, rolled back (so every run sees the same rows). The lock
is taken by the first statement and held until the transaction ends: "lock held" is the time from
that statement's start to the end of the check (the job insert of job_submit comes after it)."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


class _Rollback(Exception):
    pass


def run(*, runs: int = 200, sizes=(0, 10_000, 100_000)) -> common.Section:
    import datetime as dt
    from decimal import Decimal
    from types import SimpleNamespace

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from accounting.models import BudgetHold, BudgetTotal, UsageRecord
    from accounting.services import HoldRequest, budget_holds_place

    section = common.Section(
        "Budget check of a submission",
        method=(
            "`budget_holds_place` for one 1-GPU-h job of the bench team (an approved any-type quota), in a "
            f"transaction rolled back after it; {runs} runs per size, medians. Open holds and usage records of "
            "the team inserted beforehand (COPY-free bulk_create), the team's running total built once."
        ),
    )
    common.print_header(section.title)
    world = common.world(slurm=False)
    team = world.team
    estimate = SimpleNamespace(gpu_hours=Decimal(1), gpu_type="a100", gpu_type_assumed=False, cost=None)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {BudgetHold._meta.db_table}, {BudgetTotal._meta.db_table}, {UsageRecord._meta.db_table} CASCADE")
    present = 0
    for size in sizes:
        BudgetHold.objects.bulk_create(
            [BudgetHold(job_uuid=uuid.uuid4(), team=team, gpu_type="a100", estimated_gpu_hours=Decimal("0.01"),
                        held_gpu_hours=Decimal("0.01"), created_at=now) for _ in range(size - present)],
            batch_size=5000,
        )  # fmt: skip
        UsageRecord.objects.bulk_create(
            [UsageRecord(cluster="bench", job_id=10_000_000 + present + i, submit_time=now - dt.timedelta(hours=2),
                         start_time=now - dt.timedelta(hours=2), end_time=now - dt.timedelta(hours=1), state="COMPLETED",
                         account=team.slurm_account, team=team, unix_user="gpbench", gpus=1, gpu_type="a100",
                         gpu_seconds=36, gpu_hours=Decimal("0.01"), known_until=now, first_seen_at=now)
             for i in range(size - present)],
            batch_size=5000,
        )  # fmt: skip
        present = size
        budget_holds_place(team=team, holds=[HoldRequest(uuid.uuid4(), estimate)])  # builds the total (committed)
        latencies, queries = [], 0
        for _ in range(runs):
            try:
                with transaction.atomic(), CaptureQueriesContext(connection) as captured:
                    began = time.perf_counter()
                    budget_holds_place(team=team, holds=[HoldRequest(uuid.uuid4(), estimate)])
                    latencies.append(time.perf_counter() - began)
                    queries = len(captured)
                    raise _Rollback
            except _Rollback:
                pass
        section.add(f"check with {size:,} open holds and usage records", common.median(latencies) * 1000, "ms",
                    f"median of {runs}; p95 {common.percentile(latencies, 95) * 1000:.2f} ms; {queries} queries, "
                    "the lock held from the first of them to the end")  # fmt: skip
        server = [_locking_statement_ms(team, estimate) for _ in range(max(runs // 10, 5))]
        section.add(f"  its locking statement, server side ({size:,})", common.median(server), "ms",
                    "EXPLAIN ANALYZE execution time (lock the team, insert the hold, lock and add to the totals); "
                    "less dependent on the machine's load than the wall-clock figure")  # fmt: skip
    return section


def _locking_statement_ms(team, estimate) -> float:
    """Execution time (server side) of budget_holds_place's first statement, in a transaction rolled back."""
    import re

    from django.db import connection, transaction
    from django.utils import timezone

    from accounting.services.budget import _increments, _place_sql

    at = timezone.now()
    rows = [(uuid.uuid4(), "a100", None, estimate.gpu_hours, None, estimate.gpu_hours, at)]
    sql, params = _place_sql(rows, _increments([("a100", estimate.gpu_hours)]), team_id=team.pk, at=at)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT TEXT) " + sql, params)
            text = "\n".join(row[0] for row in cursor.fetchall())
            raise _Rollback(text)
    except _Rollback as done:
        return float(re.search(r"Execution Time: ([0-9.]+) ms", str(done)).group(1))


def main() -> None:
    parser = common.arguments(__doc__)
    parser.add_argument("--runs", type=int, default=200)
    common.main(run, parser)


if __name__ == "__main__":
    main()
