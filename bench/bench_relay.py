"""Relay benchmark: jobs/s from ``POST /api/v1/jobs/`` to a Slurm id, against a plain sbatch loop.

    eval "$(scripts/services up)" && .venv/bin/python bench/bench_relay.py [--quick] [--jobs 500] [--rounds 3]

Each round submits the same trivial job (``true``, 1 GPU, partition debug, 1 minute) N times:
  raw     a plain loop of ``sbatch`` (the argv and script the portal's gateway builds, --uid/--gid of
          the bench user), one after the other, from this process;
  portal  N POSTs to gunicorn (``--clients`` client threads, default 8), Celery worker(s) relay them
          (single-job submits publish the relay drain, the group commit: one claim of up to
          JOB_RELAY_DRAIN_BATCH jobs, parallel sbatch, one bulk write); the round ends when every job
          has its Slurm id (the last ``submitted_at``). ``--single-only``: these rounds alone.
Then the profile: the relay service run in this process for a few jobs, timed by phase (sbatch,
database, the rest), and the batched relay (jobs.services.job_relay_batch_run) in-process.
  batch   the same N jobs as arrays to ``POST /api/v1/jobs/`` (``--batch``, default N/10 within
          10–100, from the same client threads): one batched relay task per request (one claim, 4 sbatch at a time,
          one bulk write). Bench jobs are cancelled after every round; the bench account is capped at 2
running GPUs so the shared cluster stays usable."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SCRIPT = "true\n"
PARTITION = "debug"
TIME_LIMIT = 1
CLIENT_THREADS = 8  # issue 16 item 1: 500 single-job POSTs from 8 concurrent clients


def job_body(name: str) -> dict:
    return {"team": common.BENCH_TEAM, "name": name, "script": SCRIPT, "partition": PARTITION, "gpus": 1,
            "time_limit_minutes": TIME_LIMIT, "workdir": common.BENCH_WORKDIR}  # fmt: skip


def raw_spec(world, tag: str | None = None):
    """What the relay hands the gateway for job_body() (the stored request, jobs.spec; the bench
    user's ids), with a fresh tag: built by the one builder, portal.slurm.request.job_request."""
    from django.conf import settings

    from jobs.services import DEFAULT_SHEBANG
    from portal.slurm import JobSubmission
    from portal.slurm.request import job_request
    from portal.slurm.tags import slurm_tag

    pattern = settings.JOB_OUTPUT_PATTERN
    workdir = common.BENCH_WORKDIR
    command_line = [
        ("job-name", "relay-raw"), ("partition", PARTITION), ("chdir", workdir), ("gres", "gpu:1"),
        ("time", str(TIME_LIMIT)), ("output", pattern.format(workdir=workdir, slurm_job_id="%j", stream="out")),
        ("error", pattern.format(workdir=workdir, slurm_job_id="%j", stream="err")), ("account", common.BENCH_TEAM),
        ("comment", tag or slurm_tag(uuid.uuid4())),
    ]  # fmt: skip
    request = job_request(script=DEFAULT_SHEBANG + SCRIPT, command_line=command_line, workdir=workdir, submit_dir=workdir,
                          gpus=1, time_limit_minutes=TIME_LIMIT)  # fmt: skip
    return JobSubmission(request, uid=world.uid, gid=world.gid)


def raw_round(world, n: int, *, threads: int = 1) -> float:
    """Seconds for n sbatch calls (``threads`` at a time; 1 = a plain loop)."""
    from django.conf import settings

    from portal.slurm.cli import _clean_env, sbatch_argv
    from portal.slurm.tags import slurm_tag

    # the configured cluster's own sbatch and libslurm (a Slurm 25.11 build outside the PATH)
    env = _clean_env(settings.SLURM_CONF, settings.SLURM_LIB_DIR)
    exe = os.path.join(settings.SLURM_BIN_DIR, "sbatch") if settings.SLURM_BIN_DIR else "sbatch"
    base = raw_spec(world)
    script = base.request.script
    # a plain sbatch loop: --export=NONE, no export file (the portal's own job variables)
    argvs = [["--export=NONE" if a == "--export=SLURM_EXPORT_ENV" else a
              for a in sbatch_argv(raw_spec(world, slurm_tag(uuid.uuid4())), exe) if not a.startswith("--export-file")]
             for _ in range(n)]  # fmt: skip

    def one(argv):
        proc = subprocess.run(
            argv, input=script, capture_output=True, text=True, env=env, timeout=60, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")

    began = time.perf_counter()
    if threads == 1:
        for argv in argvs:
            one(argv)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, argvs))
    return time.perf_counter() - began


def post_jobs(
    token: str, n: int, name: str, *, threads: int | None = None, batch: int = 0, client_factory=None,
    team: str = common.BENCH_TEAM,
) -> tuple[float, list[float], int]:
    """POST n jobs from ``threads`` keep-alive clients: one job per POST to /api/v1/jobs/, or with
    ``batch`` > 0 arrays of up to ``batch`` jobs per POST (a batch submit). ``client_factory``: another
    portal than the benchmark's gunicorn (bench_demo.py --url). Returns (seconds, latencies per
    request, errors)."""
    threads = threads or CLIENT_THREADS
    sizes = [min(batch, n - i) for i in range(0, n, batch)] if batch else [0] * n
    counter = iter(sizes)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]

    body = job_body(name) | {"team": team}

    def client():
        api = client_factory() if client_factory else common.ApiClient(token)
        try:
            while True:
                with lock:
                    size = next(counter, None)
                    if size is None:
                        return
                if size:
                    status, text, seconds = api.request("POST", "/api/v1/jobs/", [body] * size)
                else:
                    status, text, seconds = api.request("POST", "/api/v1/jobs/", body)
                with lock:
                    latencies.append(seconds)
                    common.count_refusal(errors, status, text)
        finally:
            api.close()

    began = time.perf_counter()
    workers = [threading.Thread(target=client) for _ in range(min(threads, len(sizes)))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - began, latencies, errors[0]


def portal_round(world, n: int, name: str, *, timeout: float, batch: int = 0, threads: int = CLIENT_THREADS) -> dict:
    """POST n jobs (one per request, or ``batch`` per request to the batch API) and wait until all
    have a Slurm id (or failed). Times from the database clock."""
    from django.db.models import Max

    from jobs.choices import JobState
    from jobs.models import Job
    from portal.project.celery import app

    start = dt.datetime.now(dt.UTC)
    post_seconds, post_latencies, errors = post_jobs(world.token, n, name, batch=batch, threads=threads)
    deadline = time.monotonic() + timeout
    jobs = Job.objects.filter(name=name)
    last_sweep = time.monotonic()
    while time.monotonic() < deadline:
        pending = jobs.filter(state=JobState.ACCEPTED).count()
        if pending == 0:
            break
        if time.monotonic() - last_sweep >= 15:  # what beat does in production (a lost message is swept)
            app.send_task("jobs.tasks.jobs_sweep_task")
            last_sweep = time.monotonic()
        time.sleep(0.2)
    else:
        print(f"  ! {pending} jobs still ACCEPTED after {timeout:.0f} s", file=sys.stderr)
    done = jobs.filter(slurm_job_id__isnull=False)
    last = done.aggregate(last=Max("submitted_at"))["last"]
    relayed = done.count()
    failed = jobs.filter(state=JobState.SUBMIT_FAILED).count()
    lat = [(s - c).total_seconds() for c, s in done.values_list("created_at", "submitted_at")]
    return {
        "seconds": (last - start).total_seconds() if last else float("nan"),
        "relayed": relayed, "failed": failed, "post_errors": errors, "post_seconds": post_seconds,
        "post_latencies": post_latencies, "relay_latencies": lat,
    }  # fmt: skip


# ---------------------------------------------------------------- profile


class _Timed:
    """Wraps the real gateway: counts and times every call by method."""

    def __init__(self, real):
        self._real = real
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.calls[name] = self.calls.get(name, 0) + 1
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

        return timed


class QueryTimer:
    """connection.execute_wrapper that counts queries and their time."""

    def __init__(self):
        self.count = 0
        self.seconds = 0.0

    def __call__(self, execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.count += 1
            self.seconds += time.perf_counter() - began


@contextlib.contextmanager
def _no_relay():
    """Submits in this process store their jobs ACCEPTED and enqueue nothing: the relay drain's
    publish is a no-op (and its coalescing flag, left up by the first submit, is cleared after)."""
    from unittest import mock

    from jobs import tasks
    from jobs.services import relay_drain_key
    from portal.outbox import coalesced_done

    try:
        with mock.patch.object(tasks.job_relay_drain, "delay", lambda: None):
            yield
    finally:
        coalesced_done(relay_drain_key())


def _accepted_jobs(world, n: int, name: str) -> list:
    """n ACCEPTED jobs made by job_submit in this process, without enqueueing their relay."""
    from jobs import services

    ids = []
    with _no_relay():
        for _ in range(n):
            body = job_body(name)
            body.pop("team")
            job, _ = services.job_submit(user=world.user, team=world.team, **body)
            ids.append(job.pk)
    return ids


def profile_relay(world, n: int, section: common.Section) -> float:
    """Run jobs.services.job_relay_run for n jobs in this process; time sbatch, the database and the rest."""
    from django.db import connection

    import portal.slurm
    from jobs import services

    ids = _accepted_jobs(world, n, "relay-profile")
    real = portal.slurm.get_gateway()
    gateways = contextlib.ExitStack()  # portal.slurm.use_gateway for the timed wrappers
    timed = _Timed(real)
    timer = QueryTimer()
    gateways.enter_context(portal.slurm.use_gateway(timed))
    per_job = []
    try:
        with connection.execute_wrapper(timer):
            for job_id in ids:
                began = time.perf_counter()
                outcome = services.job_relay_run(job_id)
                per_job.append(time.perf_counter() - began)
                if outcome != "submitted":
                    print(f"  ! relay of {job_id}: {outcome}", file=sys.stderr)
    finally:
        gateways.close()
    total = sum(per_job)
    sbatch = timed.seconds.get("submit", 0.0)
    section.add("relay service in-process, per job (median)", common.median(per_job) * 1000, "ms", f"median of {n} jobs",
                "jobs.services.job_relay_run, no Celery")  # fmt: skip
    section.add("  of which sbatch (gateway.submit)", sbatch / n * 1000, "ms", f"mean of {n} jobs")
    section.add("  of which database", timer.seconds / n * 1000, "ms",
                f"mean of {n} jobs; {timer.count / n:.1f} queries per job")  # fmt: skip
    section.add("  of which the rest (Python: Django ORM, spec, unix_ids)", (total - sbatch - timer.seconds) / n * 1000, "ms",
                f"mean of {n} jobs")  # fmt: skip
    section.add("in-process relay rate, one at a time", n / total, "jobs/s", f"{n} jobs")
    return n / total


def api_profile(world, n: int = 30) -> tuple[int, float]:
    """Queries one POST /api/v1/jobs/ runs and the median time of one, in this process (Django test
    client: no HTTP, no gunicorn; relay enqueue stubbed)."""
    from django.db import connection
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Token {world.token}")
    timer = QueryTimer()
    with _no_relay():
        client.post("/api/v1/jobs/", job_body("relay-count"), content_type="application/json")  # warm
        with connection.execute_wrapper(timer):
            response = client.post("/api/v1/jobs/", job_body("relay-count"), content_type="application/json")
        times = []
        for _ in range(n):
            began = time.perf_counter()
            client.post("/api/v1/jobs/", job_body("relay-count"), content_type="application/json")
            times.append(time.perf_counter() - began)
    if response.status_code != 201:
        print(
            f"  ! test-client POST answered {response.status_code}: {response.content[:300]!r}",
            file=sys.stderr,
        )
    return timer.count, common.median(times)


def relay_only(world, n: int, *, concurrency: int, runs: int, drain: bool = False) -> list[float]:
    """The relay alone, through Celery: per run, n ACCEPTED jobs stored first, then n job_relay
    messages sent at once to one worker of ``concurrency`` processes — or, ``drain``, ONE
    job_relay_drain message (what the first single-job submit of a burst publishes: the group
    commit); jobs/s from the first message to the last id. The bench jobs are cancelled between
    runs. Returns the rate of each run."""
    from django.db.models import Max

    from jobs.choices import JobState
    from jobs.models import Job
    from portal.project.celery import app

    warnings.filterwarnings("ignore", message=".*send_task.*")  # the driver is eager; send_task is not
    worker = common.start_worker(concurrency=concurrency)
    rates = []
    try:
        for _ in range(4 * concurrency):  # warm each child (imports, database connection): no job to relay
            app.send_task("jobs.tasks.job_relay_drain") if drain else app.send_task("jobs.tasks.job_relay", args=[str(uuid.uuid4())])
        common.worker_idle_wait(worker)
        for run in range(runs):
            name = f"relay-only-c{concurrency}-{'drain-' if drain else ''}{run}-{uuid.uuid4().hex[:6]}"
            ids = _accepted_jobs(world, n, name)
            start = dt.datetime.now(dt.UTC)
            if drain:
                app.send_task("jobs.tasks.job_relay_drain")
            for job_id in [] if drain else ids:
                app.send_task("jobs.tasks.job_relay", args=[str(job_id)])
            deadline = time.monotonic() + max(120, n)
            while time.monotonic() < deadline and Job.objects.filter(name=name, state=JobState.ACCEPTED).exists():
                time.sleep(0.2)
            done = Job.objects.filter(name=name, slurm_job_id__isnull=False)
            last = done.aggregate(last=Max("submitted_at"))["last"]
            rates.append(done.count() / (last - start).total_seconds() if last else float("nan"))
            common.drain_cluster()
    finally:
        worker.stop()
    return rates


# ---------------------------------------------------------------- batched relay in-process


def batched_in_process(world, n: int, section: common.Section, *, runs: int, threads: int = 4) -> float:
    """The portal's batched relay (jobs.services.job_relay_batch_run) in this process, in batches of
    at most MAX_BATCH_JOBS (what one batch POST enqueues); ``runs`` runs of n jobs, median rate."""
    from django.db import connection

    from jobs.services import MAX_BATCH_JOBS, job_relay_batch_run

    rates, queries = [], 0
    for run in range(runs):
        ids = _accepted_jobs(world, n, f"relay-batched-{run}")
        timer = QueryTimer()
        submitted = 0
        began = time.perf_counter()
        with connection.execute_wrapper(timer):
            for start in range(0, len(ids), MAX_BATCH_JOBS):
                submitted += job_relay_batch_run(ids[start : start + MAX_BATCH_JOBS], threads=threads)["submitted"]
        rates.append(submitted / (time.perf_counter() - began))
        queries = max(queries, timer.count)
        common.drain_cluster()
    batches = -(-n // MAX_BATCH_JOBS)
    section.add(f"batched relay ({threads} sbatch at a time), in-process", common.median(rates), "jobs/s",
                f"median of {runs} runs of {n} jobs in {batches} batch(es); {queries} queries per run",
                "jobs.services.job_relay_batch_run")  # fmt: skip
    return common.median(rates)


# ---------------------------------------------------------------- run


def _timed_round(section, world, n: int, name: str, label: str, *, batch: int = 0) -> tuple[float, dict]:
    """One timed portal_round of n jobs, the bench jobs cancelled after it, a note on ``section`` when
    not every job was relayed cleanly. Returns the relay rate (jobs/s) and the round's result."""
    result = portal_round(world, n, name, timeout=max(120, n), batch=batch)
    common.drain_cluster()
    if result["relayed"] != n or result["failed"] or result["post_errors"]:
        section.note(f"{label}: {result['relayed']}/{n} relayed, {result['failed']} SUBMIT_FAILED, "
                     f"{result['post_errors']} POST errors")  # fmt: skip
    return result["relayed"] / result["seconds"], result


def run(*, quick: bool = False, jobs: int | None = None, rounds: int | None = None, concurrency: int = 2,
        web_workers: int = 3, batch: int | None = None, single_only: bool = False,
        relay_side: bool = False, batched_only: bool = False) -> common.Section:  # fmt: skip
    n = jobs or (40 if quick else 500)
    rounds = rounds or (2 if quick else 3)
    profile_n = 20 if quick else 100
    # default: about 10 requests of 10–100 jobs (500 jobs: 10 POSTs of 50), so relays overlap the POSTs
    batch_size = batch or max(1, min(100, max(10, -(-n // 10)), n))
    section = common.Section(
        "Relay: POST /api/v1/jobs/ to Slurm id, against a plain sbatch loop",
        method=(
            f"{rounds} rounds; each: {n} × `sbatch` in a plain loop (same argv and script as the gateway, "
            f"--uid/--gid of the bench user), then {n} × `POST /api/v1/jobs/` from {CLIENT_THREADS} keep-alive client "
            f"threads to gunicorn ({web_workers} gthread workers × 2 threads) with one Celery worker "
            f"(prefork, concurrency {concurrency}); portal time = first POST to the last `submitted_at`; then the same "
            f"{n} jobs as arrays of {batch_size} to `POST /api/v1/jobs/` (a batch submit: one batched relay task per request). "
            f"Job: `{SCRIPT.strip()}`, 1 GPU, partition {PARTITION}, {TIME_LIMIT} min; the bench account is capped "
            f"at 2 running GPUs (GrpTRES) and its jobs are cancelled after each round. Figures are medians over rounds."
        ),
    )
    world = common.begin(section, truncate=True, gpu_cap=2)
    common.broker_purge()
    web = worker = None
    raw_rates, portal_rates, ratios, accept_rates = [], [], [], []
    batch_rates, batch_ratios, batch_accept = [], [], []
    latencies: list[float] = []
    single_latencies: list[float] = []
    try:
        if relay_side:
            return _relay_side(world, n, rounds, concurrency, section)
        if batched_only:  # the batched relay in this process, nothing else (portal/db.py's bulk write, issue 38)
            batched_in_process(world, n, section, runs=rounds)
            return section
        web = common.start_gunicorn(workers=web_workers, threads=2, THROTTLE_SUBMIT="1000000/min")
        worker = common.start_worker(concurrency=concurrency)
        # warm both paths (imports, connections, slurmctld caches)
        raw_round(world, 3)
        portal_round(world, 3, "relay-warm", timeout=60)
        common.drain_cluster()
        for r in range(1, rounds + 1):
            raw = n / raw_round(world, n)
            common.drain_cluster()
            portal, result = _timed_round(section, world, n, f"relay-r{r}", f"round {r}")
            raw_rates.append(raw)
            portal_rates.append(portal)
            ratios.append(portal / raw)
            accept_rates.append(n / result["post_seconds"])
            latencies += result["relay_latencies"]
            single_latencies += result["post_latencies"]
            print(f"  round {r}: raw {raw:.1f} jobs/s, portal {portal:.1f} jobs/s (ratio {portal / raw:.2f}), "
                  f"POSTs accepted at {n / result['post_seconds']:.1f}/s", flush=True)  # fmt: skip
            if single_only:
                continue
            batch, result = _timed_round(section, world, n, f"relay-b{r}", f"batch round {r}", batch=batch_size)
            batch_rates.append(batch)
            batch_ratios.append(batch / raw)
            batch_accept.append(n / result["post_seconds"])
            print(f"  round {r}: batch API {batch:.1f} jobs/s (ratio {batch / raw:.2f}), "
                  f"jobs accepted at {n / result['post_seconds']:.1f}/s", flush=True)  # fmt: skip
        runs = f"median of {rounds} rounds of {n} jobs"
        section.add("raw sbatch loop", common.median(raw_rates), "jobs/s", runs)
        section.add("portal (POST → Slurm id)", common.median(portal_rates), "jobs/s", runs)
        section.add("ratio portal / raw", common.median(ratios), "", runs + " (target ≥ 1.0)")
        section.add("POSTs accepted (API side alone)", common.median(accept_rates), "jobs/s", runs)
        section.add("POST latency p50 (single-job POSTs)", common.percentile(single_latencies, 50) * 1000, "ms",
                    f"{len(single_latencies)} requests, all rounds, {CLIENT_THREADS} clients")  # fmt: skip
        section.add(
            "accepted → Slurm id, median", common.median(latencies), "s", f"{len(latencies)} jobs, all rounds"
        )
        section.add(
            "accepted → Slurm id, p99", common.percentile(latencies, 99), "s", f"{len(latencies)} jobs, all rounds"
        )
        if single_only:
            return section
        batch_runs = f"{runs}; {-(-n // batch_size)} POSTs of arrays of ≤ {batch_size} jobs to /api/v1/jobs/"
        section.add("portal, batch API (POST batch → Slurm id)", common.median(batch_rates), "jobs/s", batch_runs)
        section.add("ratio portal batch / raw", common.median(batch_ratios), "", batch_runs + " (target ≥ 1.0)")
        section.add("jobs accepted by the batch API (API side alone)", common.median(batch_accept), "jobs/s", batch_runs)
        worker.stop()
        web.stop()
        worker = web = None

        # Where the time goes
        common.truncate_jobs()
        queries, post_seconds = api_profile(world)
        section.add("queries per POST /api/v1/jobs/", queries, "queries", "1 request, after a warm-up")
        section.add(
            "POST /api/v1/jobs/ in-process (test client, no HTTP)",
            post_seconds * 1000,
            "ms",
            "median of 30 requests",
        )
        profile_relay(world, profile_n, section)
        common.drain_cluster()
        relay_rates = {}
        for c in sorted({concurrency, 4}):
            rates = relay_only(world, n, concurrency=c, runs=rounds)
            relay_rates[c] = common.median(rates)
            section.add(f"relay alone through Celery, worker concurrency {c}", relay_rates[c], "jobs/s",
                        f"median of {rounds} runs of {n} jobs stored first, then {n} messages")  # fmt: skip
        from django.conf import settings

        drained = common.median(relay_only(world, n, concurrency=concurrency, runs=rounds, drain=True))
        section.add(f"relay drain alone through Celery (group commit), worker concurrency {concurrency}", drained, "jobs/s",
                    f"median of {rounds} runs of {n} jobs stored first, then 1 drain message; "
                    f"batches of ≤ {settings.JOB_RELAY_DRAIN_BATCH}, 4 sbatch at a time")  # fmt: skip
        par_rates = []
        for _ in range(rounds):
            par_rates.append(n / raw_round(world, n, threads=4))
            common.drain_cluster()
        par = common.median(par_rates)
        section.add("raw sbatch, 4 at a time (the cluster's ceiling for parallel submitters)", par, "jobs/s",
                    f"median of {rounds} runs of {n} jobs")  # fmt: skip
        batched = batched_in_process(world, n, section, runs=rounds)
        section.note(
            f"End to end the portal cannot beat its slowest stage: the API accepted {common.median(accept_rates):.1f} POSTs/s, "
            f"the relay alone did {relay_rates[concurrency]:.1f} jobs/s through Celery at concurrency {concurrency} one task "
            f"per job and {drained:.1f} jobs/s as the drain (what single-job submits use), while "
            f"raw sbatch ran {common.median(raw_rates):.1f}/s sequentially and {par:.1f}/s 4 at a time; the batched "
            f"relay in-process (one claim, parallel sbatch, one bulk write) relayed {batched:.1f} jobs/s, and the "
            f"batch API end to end {common.median(batch_rates):.1f} jobs/s (ratio {common.median(batch_ratios):.2f})."
        )
    finally:
        for service in (worker, web):
            if service is not None:
                service.stop()
        common.leave_cluster()
    return section


def _relay_side(world, n: int, rounds: int, concurrency: int, section: common.Section) -> common.Section:
    """``--relay-side``: the relay without the API in front, against the plain sbatch loop, run by
    run: n jobs stored ACCEPTED, then n job_relay messages (one task per job) or ONE drain message."""
    per_job, drained, raw = [], [], []
    for _ in range(rounds):
        raw.append(n / raw_round(world, n))
        common.drain_cluster()
        per_job += relay_only(world, n, concurrency=concurrency, runs=1)
        drained += relay_only(world, n, concurrency=concurrency, runs=1, drain=True)
    runs = f"median of {rounds} runs of {n} jobs, worker concurrency {concurrency}"
    section.add("raw sbatch loop", common.median(raw), "jobs/s", runs)
    section.add("relay alone, one task per job", common.median(per_job), "jobs/s", runs)
    section.add("relay alone, the drain (one message)", common.median(drained), "jobs/s", runs)
    section.add("ratio drain / raw", common.median([d / r for d, r in zip(drained, raw)]), "", runs)
    return section


def main() -> None:
    global CLIENT_THREADS
    parser = common.arguments(__doc__, quick="small sizes (40 jobs, 2 rounds)")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes (default 2)")
    parser.add_argument("--web-workers", type=int, default=3, help="gunicorn workers (default 3)")
    parser.add_argument("--batch", type=int, help="jobs per batch POST to /api/v1/jobs/ (default: n/10, 10–100)")
    parser.add_argument("--clients", type=int, default=CLIENT_THREADS, help=f"client threads POSTing (default {CLIENT_THREADS})")
    parser.add_argument("--single-only", action="store_true", help="only the raw loop and the single-job POST rounds")
    parser.add_argument("--relay-side", action="store_true", help="only the relay (no API): per-job tasks vs the drain, vs raw")
    parser.add_argument("--batched-only", action="store_true", help="only the batched relay, in this process")
    options = vars(parser.parse_args())
    CLIENT_THREADS = options.pop("clients")
    common.setup()
    run(**options)  # every other option is a keyword of run()


if __name__ == "__main__":
    main()
