"""API accept latency: p50 and p99 of ``POST /api/v1/jobs/`` with 20 concurrent clients.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_api.py [--quick] [--clients 20] [--requests 25] [--rounds 3]

gunicorn (3 gthread workers × 2 threads) on 127.0.0.1; each client is a thread with its own keep-alive
connection sending POSTs back to back. No Celery worker consumes the benchmark's queue, so every job
stays ACCEPTED: this measures what the API does before answering (validate, store, enqueue the relay
message in Redis), not the relay. The queue is purged afterwards and the jobs never reach Slurm."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_relay import job_body


def one_round(token: str, clients: int, per_client: int, name: str) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client():
        api = common.ApiClient(token)
        mine = []
        try:
            api.request("GET", "/api/v1/cluster/")  # open the connection (not timed)
            barrier.wait()
            for _ in range(per_client):
                status, body, seconds = api.request("POST", "/api/v1/jobs/", job_body(name))
                mine.append(seconds)
                if status != 201:
                    with lock:
                        errors[0] += 1
                        if errors[0] <= 3:
                            print(f"  ! POST answered {status}: {body[:300]!r}", file=sys.stderr)
        finally:
            api.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - began, errors[0]


def run(*, quick: bool = False, clients: int = 20, requests: int | None = None, rounds: int | None = None,
        web_workers: int = 3) -> common.Section:  # fmt: skip
    per_client = requests or (10 if quick else 25)
    rounds = rounds or (2 if quick else 3)
    section = common.Section(
        f"API accept latency: POST /api/v1/jobs/ with {clients} concurrent clients",
        method=(
            f"{rounds} rounds of {clients} client threads × {per_client} POSTs each (keep-alive connections, "
            f"back to back) against gunicorn ({web_workers} gthread workers × 2 threads) on 127.0.0.1. "
            "Relay disabled: no Celery worker consumes the benchmark's queue, jobs stay ACCEPTED (the relay "
            "message is still sent to Redis); the submit throttle is raised (THROTTLE_SUBMIT) so that it "
            "counts but never refuses. p50/p99 per round; the table gives the median over rounds."
        ),
    )
    world = common.begin(section, truncate=True)
    common.broker_purge()
    web = common.start_gunicorn(workers=web_workers, threads=2, THROTTLE_SUBMIT="1000000/min")
    p50s, p99s, rates, total = [], [], [], 0
    try:
        one_round(world.token, min(clients, 4), 5, "api-warm")
        for r in range(1, rounds + 1):
            latencies, seconds, errors = one_round(world.token, clients, per_client, f"api-r{r}")
            if errors:
                section.note(f"round {r}: {errors} requests did not answer 201")
            p50s.append(common.median(latencies))
            p99s.append(common.percentile(latencies, 99))
            rates.append(len(latencies) / seconds)
            total += len(latencies)
            print(
                f"  round {r}: p50 {p50s[-1] * 1000:.1f} ms, p99 {p99s[-1] * 1000:.1f} ms, {rates[-1]:.1f} requests/s",
                flush=True,
            )
        runs = f"median of {rounds} rounds of {clients}×{per_client} requests"
        section.add("accept latency p50", common.median(p50s) * 1000, "ms", runs)
        section.add("accept latency p99", common.median(p99s) * 1000, "ms", runs)
        section.add("throughput while doing so", common.median(rates), "requests/s", runs)
    finally:
        web.stop()
        common.broker_purge()
        common.truncate_jobs()
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="10 requests per client, 2 rounds")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, help="POSTs per client per round (default 25)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--web-workers", type=int, default=3)
    common.main(run, parser)


if __name__ == "__main__":
    main()
