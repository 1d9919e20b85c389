"""Where the milliseconds of one single-job ``POST /api/v1/jobs/`` go: queries, Python, locks.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_post_profile.py [--quick] [--requests 200] [--top 20]

In this process (Django test client: no HTTP, no gunicorn), token-authenticated as the bench user,
the relay enqueue stubbed (no message, nothing reaches Slurm). After warm-up requests it prints:
  - every query one POST runs, in order, with its time (``connection.execute_wrapper``);
  - the median, p90 and p99 time of one POST over ``--requests`` requests, split into database and
    the rest (Python), and the median CPU time of this thread per POST (PostgreSQL's and Redis's
    own CPU not included: steadier than wall time when the machine is shared);
  - how long the team row lock (``SELECT … FOR UPDATE``, the budget check) is held: from the lock
    query to the commit of the job's transaction;
  - cProfile's top functions by own time and by cumulative time over the same requests.
Also the same for a batch POST of 10 jobs (queries only), so the count per batch is seen."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_relay import job_body


class QueryLog:
    """connection.execute_wrapper: every query's SQL and time; the lock hold (FOR UPDATE → commit)."""

    def __init__(self):
        self.queries: list[tuple[str, float]] = []
        self.lock_holds: list[float] = []
        self._locked_at: float | None = None

    def __call__(self, execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.queries.append((sql, time.perf_counter() - began))
            if "FOR UPDATE" in sql and self._locked_at is None:
                from django.db import transaction

                self._locked_at = began
                transaction.on_commit(self._committed)

    def _committed(self) -> None:
        if self._locked_at is not None:
            self.lock_holds.append(time.perf_counter() - self._locked_at)
            self._locked_at = None

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.queries)


def _short(sql: str, width: int = 150) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= width else sql[: width - 1] + "…"


def run(*, quick: bool = False, requests: int | None = None, top: int = 20, stats: Path | None = None) -> common.Section:
    from django.db import connection
    from django.test import Client

    from jobs import services

    n = requests or (30 if quick else 200)
    section = common.Section(
        "Profile of one single-job POST /api/v1/jobs/ (queries, Python, locks)",
        method=(
            f"In-process (Django test client, token auth, no HTTP), the relay enqueue stubbed; after 5 warm-up "
            f"requests, {n} POSTs of the bench job (1 GPU, partition debug, 1 min) one after the other: every query "
            f"of one POST, time per POST (median/p90/p99) split into database and Python, the team lock held from "
            f"`SELECT … FOR UPDATE` to the commit, and cProfile over the {n} requests."
        ),
    )
    world = common.begin(section, truncate=True)
    client = Client(HTTP_AUTHORIZATION=f"Token {world.token}")
    body = job_body("post-profile")

    def post(payload):
        response = client.post("/api/v1/jobs/", payload, content_type="application/json")
        if response.status_code != 201:
            raise RuntimeError(f"POST answered {response.status_code}: {response.content[:300]!r}")

    with mock.patch.object(services.submit, "relay_drain_after_commit", lambda: None):  # the one enqueue (a batch's too)
        for _ in range(5):
            post(body)
        # one POST: its queries
        one = QueryLog()
        with connection.execute_wrapper(one):
            post(body)
        # a batch of 10: its queries
        batch = QueryLog()
        with connection.execute_wrapper(batch):
            post([body] * 10)
        # n POSTs: time, database time, lock hold
        totals, db_times, holds, cpu = [], [], [], []
        for _ in range(n):
            log = QueryLog()
            began, began_cpu = time.perf_counter(), time.thread_time()
            with connection.execute_wrapper(log):
                post(body)
            totals.append(time.perf_counter() - began)
            cpu.append(time.thread_time() - began_cpu)  # this thread's CPU: steadier than wall on a shared machine
            db_times.append(log.seconds)
            holds += log.lock_holds
        # cProfile over n more
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            post(body)
        profiler.disable()
        if stats is not None:
            profiler.dump_stats(stats)  # for pstats: callers, callees, any function's share

    runs = f"{n} requests"
    section.add("queries per single-job POST", len(one.queries), "queries", "1 request after warm-up")
    section.add("queries per batch POST of 10 jobs", len(batch.queries), "queries", "1 request after warm-up")
    section.add("POST in-process, p50", common.median(totals) * 1000, "ms", runs)
    section.add("POST in-process, p90", common.percentile(totals, 90) * 1000, "ms", runs)
    section.add("POST in-process, p99", common.percentile(totals, 99) * 1000, "ms", runs)
    section.add("POST in-process, this thread's CPU p50", common.median(cpu) * 1000, "ms", runs)
    section.add("  of which database (p50)", common.median(db_times) * 1000, "ms", runs)
    python = [t - d for t, d in zip(totals, db_times, strict=True)]
    section.add("  of which Python (p50)", common.median(python) * 1000, "ms", runs)
    if holds:
        section.add("team row lock held (FOR UPDATE → commit), p50", common.median(holds) * 1000, "ms", runs)
        section.add("team row lock held, p99", common.percentile(holds, 99) * 1000, "ms", runs)
    else:
        section.note("no SELECT … FOR UPDATE in the POST: no team row lock taken")

    lines = ["Queries of one single-job POST, in order (time in ms):", "", "```"]
    lines += [f"{i:2d}. {s * 1000:6.2f}  {_short(sql)}" for i, (sql, s) in enumerate(one.queries, 1)]
    lines += ["```", "", f"cProfile over {n} POSTs, top {top} by own time (tottime) and by cumulative time:", "", "```"]
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.strip_dirs().sort_stats(order).print_stats(top)
        text = out.getvalue()
        lines.append(text[text.find("   ncalls"):].rstrip())
        lines.append("")
    lines.append("```")
    section.extra_md = "\n".join(lines)
    print(section.extra_md)
    common.truncate_jobs()
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="30 requests")
    parser.add_argument("--requests", type=int, help="POSTs timed and profiled (default 200)")
    parser.add_argument("--top", type=int, default=20, help="cProfile lines per ordering")
    parser.add_argument("--stats", type=Path, help="also write cProfile's statistics to this file (pstats)")
    parser.add_argument("--markdown", type=Path, help="also write the section as markdown to this file")
    args = parser.parse_args()
    common.setup()
    machine = common.machine()
    section = run(quick=args.quick, requests=args.requests, top=args.top, stats=args.stats)
    if args.markdown:
        machine["load average at end (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
        header = "\n".join(f"- {k}: {v}" for k, v in machine.items())
        args.markdown.write_text(section.markdown() + "\n\nMachine:\n\n" + header + "\n")


if __name__ == "__main__":
    main()
