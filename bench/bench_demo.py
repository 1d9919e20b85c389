"""Single-job submissions on the demo's own processes: an open-loop latency test and 500 POSTs to Slurm ids.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_demo.py [--quick] [--rates 50,100] [--seconds 20] [--jobs 500]
    .venv/bin/python bench/bench_demo.py --url http://127.0.0.1:8000 --token KEY --team vision   # a running demo

The processes are the ones ``scripts/demo start`` runs, with its settings (DEBUG=0, the demo's
gunicorn configuration ``deploy/gunicorn.conf.py``: gthread workers, one per core (at least 2), 4
threads each; one Celery worker ``--concurrency=2``; Celery beat), started by this benchmark on its own port
(BENCH_PORT), database (BENCH_DB) and Redis databases (BENCH_REDIS_DB), never on the demo's. With
``--url`` it targets an already running portal instead (then ``--token`` and ``--team`` of a member
there; the raw sbatch loop still runs as the bench user, and the Slurm ids are read through the API).

  open loop   R submissions/s for S seconds (``--rates``, ``--seconds``): the send time of request i
              is fixed in advance (start + i/R); 64 keep-alive client threads take the next request
              and send it at its time, or late when all are busy; latency is measured from the
              planned send time (a stall is not hidden by the client waiting), p50/p90/p99/max and
              errors per rate, and what rate was really offered.
  throughput  N single-job POSTs from 8 concurrent keep-alive clients, back to back; the round ends
              when every job has its Slurm id; against a plain sequential sbatch loop of the same jobs
              in the same run (the bench user, the gateway's argv): ratio portal/raw.
  batch       (``--batch B``) N jobs as batch POSTs of B jobs, one POST at a time, each until its B
              Slurm ids: jobs/s against the same sbatch loop (issue 38: a batch of 50 ≥ 3× the loop).
``--slurm 25.11`` runs all of it on the local Slurm 25.11 cluster with the pyslurm relay
(``scripts/cluster env --slurm 25.11``, SLURM_BACKEND=pyslurm); the sbatch loop is 25.11's sbatch.
The load average is printed before and after every figure: the machine is shared."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import cpu
from bench_relay import job_body, portal_round, raw_round

OPEN_LOOP_CLIENTS = 64
# The bench account's GPUs running at once (GrpTRES). 0: every job is submitted and waits
# (AssocGrpGRES) — what is measured is submission; with 2, slurmd launching `true` jobs on the same
# 2 cores cost up to 5.8 ms of CPU per job and took the open loop's p99 from ~30 to ~300 ms.
GPU_CAP = int(os.environ.get("BENCH_DEMO_GPU_CAP", "0"))
# BENCH_DEMO_WORKER_NICE=N starts the Celery worker (and so the sbatch it runs) under `nice -n N`: the web
# ahead of the relay for the CPU (measured in bench/results.md, "the twenty-eighth session"; not the demo's).
WORKER_NICE = os.environ.get("BENCH_DEMO_WORKER_NICE", "")
THROUGHPUT_CLIENTS = 8


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------- the demo's processes


class DemoProcesses:
    """gunicorn (deploy/gunicorn.conf.py), a Celery worker and Celery beat as scripts/demo starts
    them, on the benchmark's port, database and Redis databases."""

    def __init__(self):
        self.services: list[common.Service] = []

    def start(self) -> None:
        import platform

        from portal.project.celery import app

        py = sys.executable
        env = common.service_env(WEB_BIND=f"127.0.0.1:{common.BENCH_PORT}", LOG_LEVEL="WARNING")
        env.pop("THROTTLE_SUBMIT", None)  # the demo's default submit throttle, not the benchmarks' raised one
        # as scripts/demo: web, worker, beat
        argv = [py, "-m", "gunicorn", "-c", str(common.ROOT / "deploy" / "gunicorn.conf.py")]
        web = common.Service("demo-web", argv, env)  # access log on, as the demo's: into .run/bench/demo-web.log
        self.services.append(web)
        node = f"bench-demo-{os.getpid()}@{platform.node()}"
        nice = ["nice", "-n", WORKER_NICE] if WORKER_NICE else []
        worker = common.Service("demo-worker", [*nice, py, "-m", "celery", "-A", "portal.project", "worker", "--loglevel=WARNING",
                                                "--concurrency=2", "-n", node], env)  # fmt: skip
        self.services.append(worker)
        schedule = common.RUN_DIR / "celerybeat-schedule"
        beat = common.Service("demo-beat", [py, "-m", "celery", "-A", "portal.project", "beat", "--loglevel=WARNING",
                                            "--schedule", str(schedule), "--pidfile="], env)  # fmt: skip
        self.services.append(beat)
        deadline = time.monotonic() + 90
        web_ok = worker_ok = False
        while time.monotonic() < deadline and not (web_ok and worker_ok):
            for service in self.services:
                service.check()
            web_ok = web_ok or common.web_answers()
            if not worker_ok:
                worker_ok = bool(app.control.ping(destination=[node], timeout=0.5))
            time.sleep(0.3)  # polling the processes, not synchronising
        if not (web_ok and worker_ok):
            self.stop()
            raise RuntimeError("the demo's processes did not answer within 90 s (logs in .run/bench/)")

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()
        self.services = []


# ---------------------------------------------------------------- open loop


def open_loop(client_factory, rate: float, seconds: float, name: str, team: str) -> dict:
    """Offer ``rate`` POSTs/s for ``seconds``; latency from each request's planned send time."""
    n = int(rate * seconds)
    lock = threading.Lock()
    counter = iter(range(n))
    latencies: list[float] = []
    late: list[float] = []
    errors = [0]
    statuses: dict[int, int] = {}
    body = job_body(name) | {"team": team}
    ready = threading.Barrier(OPEN_LOOP_CLIENTS + 1)
    start_box: list[float] = []

    def client():
        api = client_factory()
        try:
            api.request("GET", "/api/v1/cluster/")  # open the connection (not timed)
            ready.wait()
            t0 = start_box[0]
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                planned = t0 + i / rate
                delay = planned - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)  # the client's schedule, not synchronisation
                sent = time.perf_counter()
                try:
                    status, text, _ = api.request("POST", "/api/v1/jobs/", body)
                except OSError as exc:  # no answer within the client's 60 s, or the connection lost: an error
                    status, text = 0, repr(exc).encode()
                    api.close()
                    api = client_factory()
                done = time.perf_counter()
                with lock:
                    latencies.append(done - planned)
                    late.append(sent - planned)
                    statuses[status] = statuses.get(status, 0) + 1
                    common.count_refusal(errors, status, text, chars=200)
        finally:
            api.close()

    threads = [threading.Thread(target=client) for _ in range(OPEN_LOOP_CLIENTS)]
    for t in threads:
        t.start()
    start_box.append(time.perf_counter() + 0.5)
    ready.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start_box[0]
    return {"n": n, "latencies": latencies, "late": late, "errors": errors[0], "statuses": statuses,
            "achieved": len(latencies) / elapsed}  # fmt: skip


# ---------------------------------------------------------------- run


def wait_relayed(timeout: float) -> int:
    """Own processes: wait until the worker relayed every ACCEPTED job (the open loop's backlog must
    not run into the next part). Returns how many were still ACCEPTED at the timeout."""
    from jobs.choices import JobState
    from jobs.models import Job

    deadline = time.monotonic() + timeout
    while (left := Job.objects.filter(state=JobState.ACCEPTED).count()) and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the database, not synchronising
    return left


class UrlClient(common.ApiClient):
    def __init__(self, token: str, url: str):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        super().__init__(token, port=parts.port or 80, host=parts.hostname or "127.0.0.1")


def _wait_relayed_via_api(token: str, url: str, name: str, n: int, timeout: float) -> dict:
    """--url mode: poll the API until no job of this run is ACCEPTED; the Slurm ids from the list."""
    import json

    api = UrlClient(token, url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            status, body, _ = api.request("GET", "/api/v1/jobs/?mine=true&state=ACCEPTED&page_size=1")
            if status == 200 and json.loads(body)["count"] == 0:
                break
            time.sleep(0.2)  # polling the portal's state, not synchronising
        seen = time.monotonic()
        ids, page = 0, 1
        while True:
            status, body, _ = api.request("GET", f"/api/v1/jobs/?mine=true&page={page}")
            data = json.loads(body) if status == 200 else {"results": [], "next": None}
            ids += sum(1 for j in data["results"] if j["name"] == name and j["slurm_job_id"])
            if not data.get("next"):
                break
            page += 1
        return {"relayed": ids, "seen": seen}
    finally:
        api.close()


def batch_rounds(world, n: int, batch: int) -> dict:
    """n jobs as batch POSTs of ``batch`` jobs, one POST at a time, each waited for until every job of
    it has its Slurm id (bench_relay.portal_round). Returns seconds, jobs relayed, POST errors."""
    from bench_relay import portal_round

    seconds, relayed, errors = 0.0, 0, 0
    for i in range(0, n, batch):
        size = min(batch, n - i)
        result = portal_round(world, size, f"demo-batch-{i}", timeout=120, batch=size, threads=1)
        seconds += result["seconds"]
        relayed += result["relayed"]
        errors += result["post_errors"]
    return {"seconds": seconds, "relayed": relayed, "post_errors": errors}


def run(*, quick: bool = False, rates: list[float] | None = None, seconds: float | None = None, jobs: int | None = None,
        url: str | None = None, token: str | None = None, team: str | None = None, batch: int = 0) -> common.Section:  # fmt: skip
    rates = rates or ([20.0] if quick else [50.0, 100.0])
    seconds = seconds or (3.0 if quick else 20.0)
    n = jobs or (20 if quick else 500)
    target = url or f"the demo's processes started by the benchmark on 127.0.0.1:{common.BENCH_PORT}"
    from django.conf import settings

    gateway = common.gateway()
    where = f"cluster {settings.SLURM_CLUSTER} (Slurm {gateway.version()}, relay through {gateway.name})"
    section = common.Section(
        "Single-job POSTs on the demo's processes: open-loop latency, 500 POSTs to Slurm ids"
        + ("" if settings.SLURM_CLUSTER == "gpuportal" else f" — {where}"),
        method=(
            f"Target: {target}, {where} (gunicorn -c deploy/gunicorn.conf.py with DEBUG=0, one Celery worker --concurrency=2, "
            f"Celery beat — as scripts/demo starts them). Open loop: R POSTs/s for {seconds:.0f} s with the send times fixed "
            f"in advance, {OPEN_LOOP_CLIENTS} keep-alive client threads, latency from the planned send time. Throughput: "
            f"{n} single-job POSTs from {THROUGHPUT_CLIENTS} keep-alive clients until every job has its Slurm id, against a "
            f"plain sequential sbatch loop of {n} of the same jobs in the same run. Job: `true`, 1 GPU, partition debug, "
            f"1 min; the bench account capped at {GPU_CAP} running GPUs (GrpTRES: the jobs wait in the queue, so the local "
            f"cluster's slurmd does not launch jobs on the portal's 2 cores meanwhile — on a site they run on compute "
            f"nodes); its jobs cancelled after each part. The client runs on "
            f"the same 2 cores as the portal. Load average (1/5/15 min) before → after each figure."
        ),
    )
    world = common.begin(section, gpu_cap=GPU_CAP)
    demo = None
    if url:
        if not (token and team):
            raise SystemExit("--url needs --token and --team (a member's API token on that portal)")

        def client_factory():
            return UrlClient(token, url)
    else:
        common.truncate_jobs()
        common.broker_purge()
        demo = DemoProcesses()
        demo.start()
        token, team = world.token, common.BENCH_TEAM

        def client_factory():
            return common.ApiClient(token)

    try:
        open_loop(client_factory, 10, 1.0, "demo-warm", team)  # warm every worker and connection
        if not url:
            wait_relayed(120)
        common.drain_cluster()
        for rate in rates:
            before = load()
            snap = cpu.snapshot()
            result = open_loop(client_factory, rate, seconds, f"demo-open-{rate:g}", team)
            after = load()
            if not url:
                section.note(f"CPU during the open loop at {rate:g}/s: {cpu.describe(cpu.since(snap), result['n'], seconds)}")
            lat = result["latencies"]
            runs = f"{result['n']} requests, 1 run; load {before} → {after}"
            section.add(f"open loop {rate:g}/s: POST latency p50", common.median(lat) * 1000, "ms", runs)
            section.add(f"open loop {rate:g}/s: p90", common.percentile(lat, 90) * 1000, "ms", runs)
            section.add(f"open loop {rate:g}/s: p99", common.percentile(lat, 99) * 1000, "ms", runs + " (target < 50 ms at 50/s)")
            section.add(f"open loop {rate:g}/s: max", max(lat) * 1000, "ms", runs)
            section.add(f"open loop {rate:g}/s: errors (not 201)", result["errors"], "requests",
                        f"{runs}; statuses {dict(sorted(result['statuses'].items()))} (0: no answer within 60 s)")  # fmt: skip
            section.add(f"open loop {rate:g}/s: offered rate achieved", result["achieved"], "requests/s",
                        f"{runs}; sent late (all clients busy) p99 {common.percentile(result['late'], 99) * 1000:.1f} ms")  # fmt: skip
            if not url:
                began = time.monotonic()
                left = wait_relayed(max(120, result["n"]))
                section.note(f"open loop {rate:g}/s: the worker relayed its {result['n']} jobs {time.monotonic() - began:.0f} s "
                             f"after the last POST" + (f" ({left} still ACCEPTED)" if left else ""))  # fmt: skip
            common.drain_cluster()

        before = load()
        snap = cpu.snapshot()
        raw_seconds = raw_round(world, n)
        raw = n / raw_seconds
        section.note(f"CPU during the raw sbatch loop: {cpu.describe(cpu.since(snap), n, raw_seconds)}")
        common.drain_cluster()
        name = "demo-throughput"
        snap = cpu.snapshot()
        if url:
            from bench_relay import post_jobs

            start = time.monotonic()
            post_seconds, _, post_errors = post_jobs(token, n, name, threads=THROUGHPUT_CLIENTS, client_factory=client_factory,
                                                     team=team)  # fmt: skip
            waited = _wait_relayed_via_api(token, url, name, n, timeout=max(120, n))
            relayed, portal_seconds = waited["relayed"], waited["seen"] - start
        else:
            result = portal_round(world, n, name, timeout=max(120, n), threads=THROUGHPUT_CLIENTS)
            relayed, portal_seconds = result["relayed"], result["seconds"]
            post_seconds, post_errors = result["post_seconds"], result["post_errors"]
        after = load()
        if not url:
            section.note(f"CPU during the {n} POSTs until their Slurm ids: {cpu.describe(cpu.since(snap), n, portal_seconds)}")
        common.drain_cluster()
        portal = relayed / portal_seconds
        runs = f"{n} jobs, 1 run; load {before} → {after}"
        if relayed != n or post_errors:
            section.note(f"throughput: {relayed}/{n} reached Slurm, {post_errors} POST errors")
        section.add("raw sequential sbatch loop", raw, "jobs/s", runs)
        section.add(f"portal: {n} single-job POSTs ({THROUGHPUT_CLIENTS} clients) → Slurm ids", portal, "jobs/s", runs)
        section.add("ratio portal / raw", portal / raw, "", runs + " (target ≥ 1.0)")
        section.add("POSTs accepted (API side alone)", n / post_seconds, "POSTs/s", runs)
        if batch and not url:
            before = load()
            snap = cpu.snapshot()
            result = batch_rounds(world, n, batch)
            after = load()
            section.note(f"CPU during the batch POSTs of {batch} until their Slurm ids: "
                         f"{cpu.describe(cpu.since(snap), n, result['seconds'])}")  # fmt: skip
            common.drain_cluster()
            runs = f"{n} jobs, 1 run; load {before} → {after}"
            if result["relayed"] != n or result["post_errors"]:
                section.note(f"batch: {result['relayed']}/{n} reached Slurm, {result['post_errors']} POST errors")
            rate = result["relayed"] / result["seconds"]
            section.add(f"portal: batch POSTs of {batch}, one at a time → Slurm ids", rate, "jobs/s", runs)
            section.add(f"ratio batch of {batch} / raw", rate / raw, "", runs + " (target ≥ 3)")
    finally:
        if demo is not None:
            demo.stop()
        common.leave_cluster()
    return section


def main() -> None:
    parser = common.arguments(__doc__, quick="20/s for 3 s, 20 jobs")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], help="offered rates (default 50,100)")
    parser.add_argument("--seconds", type=float, help="seconds per offered rate (default 20)")
    parser.add_argument("--jobs", type=int, help="single-job POSTs of the throughput part (default 500)")
    parser.add_argument("--url", help="an already running portal (e.g. the demo, http://127.0.0.1:8000)")
    parser.add_argument("--token", help="with --url: a member's API token there")
    parser.add_argument("--team", help="with --url: that member's team slug")
    parser.add_argument("--batch", type=int, default=0, help="also N jobs as batch POSTs of this many (e.g. 50)")
    parser.add_argument("--slurm", choices=["22.05", "25.11"], default="22.05",
                        help="25.11: the local Slurm 25.11 cluster with the pyslurm relay")  # fmt: skip
    args = parser.parse_args()
    if args.slurm == "25.11":  # before Django's settings are read, for this process and the demo's
        from bench_pyslurm import cluster25_env

        os.environ.update(cluster25_env(), SLURM_BACKEND="pyslurm")
    common.setup()
    print(f"load average at start: {load()}")
    run(quick=args.quick, rates=args.rates, seconds=args.seconds, jobs=args.jobs, url=args.url, token=args.token,
        team=args.team, batch=args.batch)  # fmt: skip


if __name__ == "__main__":
    main()
