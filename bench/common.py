"""What every benchmark shares, and the one name its scripts import (``import common``): a
benchmark's start (``begin``), its command line (``arguments``, ``main``), and every shared helper,
each from the module of its concern:

    environment.py  the benchmark's own database, Redis databases, port and names; the environment
                    of its processes (imported first: it points DATABASE_URL, CELERY_BROKER_URL and
                    CACHE_URL at the benchmark's own before Django is set up)
    database.py     create / migrate / drop the benchmark's database, empty its jobs tables, COPY job rows
    world.py        the bench world (team, user, Unix user, Slurm association, API token)
    cluster.py      the bench account's jobs in Slurm: drain, GPU cap, leaving the cluster clean
    processes.py    gunicorn and Celery worker subprocesses, stopped by pid
    api_client.py   the load generators' keep-alive HTTP client, refused POSTs counted
    results.py      medians and percentiles, figures and sections, bench/results.md
    host.py         the machine description
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

# Each of these imports environment first: the benchmark's database and Redis before Django.
from api_client import ApiClient, count_refusal
from cluster import bench_live_jobs, clean_workdir, drain_cluster, gateway, gpu_limit_set, leave_cluster
from database import (
    copy_jobs,
    database_create,
    database_drop,
    database_exists,
    make_job,
    setup,
    truncate_jobs,
)
from environment import (
    BENCH_BROKER_URL,
    BENCH_CACHE_URL,
    BENCH_DATABASE_URL,
    BENCH_DB,
    BENCH_PORT,
    BENCH_TEAM,
    BENCH_USER,
    BENCH_WORKDIR,
    ROOT,
    RUN_DIR,
    service_env,
)
from host import machine
from processes import (
    Service,
    broker_purge,
    start_gunicorn,
    start_worker,
    stop_all,
    web_answers,
    worker_idle_wait,
)
from results import (
    RESULTS,
    Figure,
    Section,
    dump_json,
    median,
    percentile,
    print_header,
    write_results,
    write_section,
)
from world import World, world

__all__ = [
    "BENCH_BROKER_URL", "BENCH_CACHE_URL", "BENCH_DATABASE_URL", "BENCH_DB", "BENCH_PORT", "BENCH_TEAM",
    "BENCH_USER", "BENCH_WORKDIR", "RESULTS", "ROOT", "RUN_DIR", "ApiClient", "Figure", "Section", "Service", "World",
    "arguments", "begin", "bench_live_jobs", "broker_purge", "clean_workdir", "copy_jobs", "count_refusal",
    "database_create", "database_drop", "database_exists", "drain_cluster", "dump_json", "gateway",
    "gpu_limit_set", "leave_cluster", "machine", "main", "make_job", "median", "percentile", "print_header",
    "service_env", "setup", "start_gunicorn", "start_worker", "stop_all", "truncate_jobs", "web_answers",
    "worker_idle_wait", "world", "write_results", "write_section",
]  # fmt: skip


def begin(section: Section, *, slurm: bool = True, truncate: bool = False, gpu_cap: int | None = None) -> World:
    """A benchmark's start: its header printed, the bench world (``world(slurm=...)``), the jobs tables
    emptied (``truncate``), and with ``gpu_cap`` every live bench job cancelled and the bench account
    capped at that many running GPUs (undone by leave_cluster())."""
    print_header(section.title)
    bench_world = world(slurm=slurm)
    if truncate:
        truncate_jobs()
    if gpu_cap is not None:
        drain_cluster()
        gpu_limit_set(gpu_cap)
    return bench_world


def arguments(doc: str, *, quick: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's command line: the first line of its module docstring (``doc``) as description and,
    given ``quick`` (what it then measures), the --quick option."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    return parser


def main(run: Callable[..., Section], parser: argparse.ArgumentParser) -> Section:
    """Run a benchmark from its command line: its database set up (setup()), every option a keyword
    of ``run``."""
    args = parser.parse_args()
    setup()
    return run(**vars(args))
