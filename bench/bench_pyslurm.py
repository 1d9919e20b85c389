"""Slurm 25.11: submit cost through pyslurm (in-process RPC) against the sbatch subprocess, and relay
throughput with each backend, on the same local 25.11 cluster.

    eval "$(scripts/services up)" && BENCH_DB=gpuportal_bench_pyslurm .venv/bin/python bench/bench_pyslurm.py [--quick] [--jobs 200] [--runs 3]

Needs ``scripts/cluster up --slurm 25.11`` and pyslurm in the venv (``scripts/pyslurm``). The portal
in this process is pointed at the 25.11 cluster (``scripts/cluster env --slurm 25.11``); per backend
(cli, pyslurm), per run:
  submit   N × ``gateway.submit`` of the relay's own submission (1 GPU, ``true``, partition debug) one
           after the other: per-call median and the loop's jobs/s;
  relay    N ACCEPTED portal jobs relayed by ``jobs.services.job_relay_run`` in this process (claim,
           submit, write): jobs/s;
  celery   N ``job_relay`` tasks sent at once to one Celery worker (prefork, concurrency 2) whose
           SLURM_BACKEND is the backend: jobs/s from the first message to the last ``submitted_at``.
The bench account is capped at 2 running GPUs and its jobs are cancelled after every run. No
thresholds. ``--results`` replaces this benchmark's section of bench/results.md."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

TITLE = "Slurm 25.11: submit through pyslurm vs sbatch, relay throughput per backend (bench_pyslurm.py)"
BACKENDS = ("cli", "pyslurm")


def cluster25_env() -> dict[str, str]:
    """SLURM_CONF, SLURM_CLUSTER, SLURM_BIN_DIR (and SLURM_LIB_DIR) of the 25.11 cluster (scripts/cluster env --slurm 25.11)."""
    proc = subprocess.run([str(common.ROOT / "scripts" / "cluster"), "env", "--slurm", "25.11"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if proc.returncode:
        sys.exit(f"no Slurm 25.11 cluster: {proc.stderr.strip()}")
    env = dict(line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return {name: env[name] for name in ("SLURM_CONF", "SLURM_CLUSTER", "SLURM_BIN_DIR", "SLURM_LIB_DIR") if name in env}


def use_backend(backend: str, env: dict[str, str]) -> None:
    from django.conf import settings

    import portal.slurm

    settings.SLURM_BACKEND = backend
    for name, value in env.items():
        setattr(settings, name, value)
    portal.slurm.reset_gateway()
    assert portal.slurm.get_gateway().name == backend


def submit_loop(world, n: int) -> list[float]:
    """Seconds of each of n gateway.submit calls, one after the other."""
    import bench_relay

    from portal.slurm import get_gateway
    from portal.slurm.tags import slurm_tag

    gateway = get_gateway()
    times = []
    for _ in range(n):
        spec = bench_relay.raw_spec(world, slurm_tag(uuid.uuid4()))
        began = time.perf_counter()
        gateway.submit(spec)
        times.append(time.perf_counter() - began)
    return times


def relay_in_process(world, n: int) -> float:
    """jobs/s of job_relay_run over n ACCEPTED jobs, in this process."""
    import bench_relay

    from jobs import services

    ids = bench_relay._accepted_jobs(world, n, f"pyslurm-bench-{uuid.uuid4().hex[:6]}")
    began = time.perf_counter()
    for job_id in ids:
        outcome = services.job_relay_run(job_id)
        if outcome != "submitted":
            print(f"  ! relay of {job_id}: {outcome}", file=sys.stderr)
    return n / (time.perf_counter() - began)


def run(*, quick: bool = False, jobs: int | None = None, runs: int | None = None) -> common.Section:
    import bench_relay

    n = jobs or (20 if quick else 200)
    runs = runs or (1 if quick else 3)
    env = cluster25_env()
    section = common.Section(
        TITLE,
        method=(
            f"Cluster `{env['SLURM_CLUSTER']}` (Slurm 25.11.7 built from the vendored source, pyslurm 25.11.2). "
            f"Per backend, {runs} runs of: {n} × `gateway.submit` one after the other (the relay's submission: `true`, "
            f"1 GPU, partition debug, --uid/--gid of the bench user); {n} ACCEPTED jobs relayed by `job_relay_run` "
            f"in-process; {n} `job_relay` tasks to one Celery worker (prefork, concurrency 2) running that backend. "
            "The bench account is capped at 2 running GPUs; its jobs are cancelled after every run. Medians over runs."
        ),
    )
    use_backend("cli", env)
    world = common.begin(section, truncate=True, gpu_cap=2)
    common.broker_purge()
    figures: dict[str, dict[str, list[float]]] = {b: {"submit_ms": [], "submit_rate": [], "relay": [], "celery": []} for b in BACKENDS}
    try:
        for backend in BACKENDS:
            use_backend(backend, env)
            submit_loop(world, 3)  # warm (imports, first connection)
            common.drain_cluster()
            for _ in range(runs):
                times = submit_loop(world, n)
                figures[backend]["submit_ms"].append(common.median(times) * 1000)
                figures[backend]["submit_rate"].append(n / sum(times))
                common.drain_cluster()
                figures[backend]["relay"].append(relay_in_process(world, n))
                common.drain_cluster()
            worker_env = {"SLURM_BACKEND": backend, **env}
            rates = _celery_rates(bench_relay, world, n, runs, worker_env)
            figures[backend]["celery"] = rates
        for backend in BACKENDS:
            f = figures[backend]
            how = "pyslurm JobSubmitDescription.submit (libslurm RPC)" if backend == "pyslurm" else "sbatch subprocess"
            section.add(f"{backend}: one submit", common.median(f["submit_ms"]), "ms", f"median of {runs} runs × {n}", how)
            section.add(f"{backend}: submit loop", common.median(f["submit_rate"]), "jobs/s", f"median of {runs} runs × {n}")
            section.add(f"{backend}: relay in-process (job_relay_run)", common.median(f["relay"]), "jobs/s", f"median of {runs} runs × {n}")
            section.add(f"{backend}: relay through Celery (1 worker, concurrency 2)", common.median(f["celery"]), "jobs/s",
                        f"median of {runs} runs × {n}")  # fmt: skip
        ratio = common.median(figures["cli"]["submit_ms"]) / common.median(figures["pyslurm"]["submit_ms"])
        section.note(f"one submit through pyslurm costs 1/{ratio:.1f} of an sbatch subprocess on the same cluster")
    finally:
        common.leave_cluster()
    return section


def _celery_rates(bench_relay, world, n: int, runs: int, worker_env: dict[str, str]) -> list[float]:
    """bench_relay.relay_only with a worker whose Slurm settings are ``worker_env``."""
    original = common.start_worker

    def start_worker(**kwargs):
        return original(**{**kwargs, **worker_env})

    common.start_worker = start_worker
    try:
        return bench_relay.relay_only(world, n, concurrency=2, runs=runs)
    finally:
        common.start_worker = original


def main() -> None:
    parser = common.arguments(__doc__, quick="small sizes (20 jobs, 1 run)")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--results", type=Path, help="write the section into this results file (bench/results.md)")
    parser.add_argument("--keep-db", action="store_true", help=f"keep the database {common.BENCH_DB} afterwards")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (--uid/--gid submissions, GrpTRES limits)")
    common.setup(fresh=True)
    try:
        machine = common.machine()
        section = run(quick=args.quick, jobs=args.jobs, runs=args.runs)
        section.note(f"measured {machine['date']} at commit {machine['commit']}, load average at start "
                     f"{machine['load average at start (1/5/15 min)']} (a shared machine: compare the two backends, "
                     "not these figures with other sections)")  # fmt: skip
        if args.results:
            common.write_section(section, args.results)
    finally:
        common.stop_all()
        if not args.keep_db:
            common.database_drop()


if __name__ == "__main__":
    main()
