"""What every benchmark shares: its own PostgreSQL database, the bench world (team, user, Unix
user, Slurm association, API token), gunicorn and Celery worker subprocesses stopped by pid,
statistics helpers, the machine description, and leaving the cluster without bench jobs.

Import this module before Django: it points DATABASE_URL, CELERY_BROKER_URL and CACHE_URL at the
benchmark's own database and Redis databases, then sets Django up.

Environment:
    DATABASE_URL    any database on the PostgreSQL server to use (as `scripts/services up` prints);
                    only its server and credentials are used
    BENCH_DB        name of the benchmark's own database (default gpuportal_bench)
    BENCH_REDIS_DB  first of two Redis databases the benchmark owns: broker, then cache (default 12)
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import json
import os
import platform
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from unittest import mock
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get("BENCH_DB", "gpuportal_bench")
if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", BENCH_DB):
    sys.exit(f"BENCH_DB={BENCH_DB!r}: use lower-case letters, digits and '_'")
_SERVER_URL = os.environ.get("DATABASE_URL", "postgres://gpuportal@127.0.0.1:5432/gpuportal")
if not _SERVER_URL.startswith(("postgres://", "postgresql://")):
    sys.exit(
        'The benchmarks run on PostgreSQL: set DATABASE_URL=postgres://… (eval "$(scripts/services up)")'
    )
_parts = urlsplit(_SERVER_URL)
BENCH_DATABASE_URL = urlunsplit((_parts.scheme, _parts.netloc, "/" + BENCH_DB, "", ""))

_broker = urlsplit(os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
_redis_db = int(os.environ.get("BENCH_REDIS_DB", "12"))
BENCH_BROKER_URL = urlunsplit((_broker.scheme, _broker.netloc, f"/{_redis_db}", "", ""))
BENCH_CACHE_URL = urlunsplit((_broker.scheme, _broker.netloc, f"/{_redis_db + 1}", "", ""))

# The benchmark's own names in the portal, on the host and in Slurm.
BENCH_TEAM = "gpbench"  # team slug and Slurm account
BENCH_USER = "gpbench"  # portal login and Unix user
BENCH_WORKDIR = "/tmp/gpuportal-bench"  # jobs' working directory (their output files land here)
BENCH_PORT = int(os.environ.get("BENCH_PORT", "8765"))
RUN_DIR = ROOT / ".run" / "bench"

os.environ["DATABASE_URL"] = BENCH_DATABASE_URL
os.environ["CELERY_BROKER_URL"] = BENCH_BROKER_URL
os.environ["CACHE_URL"] = BENCH_CACHE_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")
# In this (driver) process services that enqueue (team_create, membership_set) run their task inline.
os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"
# Production-like settings here as in the web and worker processes (pages timed in this process).
_PRODUCTION_LIKE = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(48), "SECURE_SSL_REDIRECT": "0",
                    "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0"}  # fmt: skip
os.environ.update(_PRODUCTION_LIKE)
# The submit throttle counts (its cost is in every figure) but never refuses: the benchmarks POST
# thousands of jobs a minute as one user, in gunicorn and in this process (same cache).
os.environ["THROTTLE_SUBMIT"] = "1000000/min"


# ---------------------------------------------------------------- database


def _admin_connection():
    import psycopg

    return psycopg.connect(
        host=_parts.hostname or "127.0.0.1", port=_parts.port or 5432, user=_parts.username,
        password=_parts.password, dbname="postgres", autocommit=True,
    )  # fmt: skip


def database_exists() -> bool:
    with _admin_connection() as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone() is not None


def database_create(*, fresh: bool) -> None:
    """Create the benchmark's database (dropping it first when ``fresh``). Only BENCH_DB is ever dropped."""
    with _admin_connection() as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')


def database_drop() -> None:
    from django.db import connections

    connections.close_all()
    with _admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')


_ready = False


def setup(*, fresh: bool = False) -> None:
    """Create (or re-create) and migrate the benchmark's database, then set Django up. Once per process."""
    global _ready
    if _ready:
        return
    database_create(fresh=fresh)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    _ready = True


def truncate_jobs() -> None:
    """Empty the jobs tables (and what refers to them) in the benchmark's database."""
    from django.db import connection

    from jobs.models import Job, JobEvent

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {JobEvent._meta.db_table}, {Job._meta.db_table} CASCADE")


# ---------------------------------------------------------------- the bench world


@dataclass
class World:
    team: object
    user: object
    token: str
    uid: int
    gid: int


def world(*, slurm: bool = True) -> World:
    """Team ``gpbench`` mirrored to Slurm (account + association), its member ``gpbench`` with a Unix
    account and a fresh API token, the inventory synced. Through the portal's services; idempotent.
    ``slurm=False``: the portal side only (benchmarks that never call Slurm)."""
    from django.contrib.auth import get_user_model

    from portal.models import ApiToken, Team
    from portal.roles import is_member
    from portal.services import api_token_create, cluster_sync, membership_set, team_create, team_mirror
    from portal.unix import unix_user_ensure

    uid, gid = unix_user_ensure(BENCH_USER)
    if slurm:
        cluster_sync()
    team = Team.objects.filter(slug=BENCH_TEAM).first()
    if team is None:
        with mock.patch("portal.services.after_commit", lambda *args: None):  # mirrored below
            team = team_create(
                name="Benchmarks",
                slug=BENCH_TEAM,
                slurm_account=BENCH_TEAM,
                description="gpuportal benchmarks",
            )
    user, _ = get_user_model().objects.get_or_create(username=BENCH_USER)
    if not is_member(user, team):
        with mock.patch("portal.services.after_commit", lambda *args: None):
            membership_set(team=team, user=user)
    if slurm:
        team_mirror(team=team)
    _unlimited_quota(team)
    ApiToken.objects.filter(user=user).delete()
    _, key = api_token_create(user=user, name="bench")
    os.makedirs(BENCH_WORKDIR, exist_ok=True)
    os.chmod(BENCH_WORKDIR, 0o1777)
    return World(team=team, user=user, token=key, uid=uid, gid=gid)


def _unlimited_quota(team) -> None:
    """An approved quota far larger than any benchmark, so submissions measure the portal, not the budget
    check's refusal (the check itself still runs). Stored directly: not mirrored to Slurm limits."""
    import datetime as dt

    from django.utils import timezone

    from accounting.models import Quota, QuotaState

    today = timezone.localdate()
    Quota.objects.get_or_create(
        team=team,
        gpu_type="",
        period_start=today - dt.timedelta(days=366),
        period_end=today + dt.timedelta(days=366),
        state=QuotaState.APPROVED,
        defaults={"gpu_hours": 10**8, "approved_at": timezone.now(), "justification": "benchmarks"},
    )


# ---------------------------------------------------------------- Slurm: bench jobs


def gateway():
    from portal.slurm import get_gateway

    return get_gateway()


def bench_live_jobs() -> list[int]:
    """Slurm ids of the bench account's jobs the controller still holds alive (one squeue)."""
    done = {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
    return [e.job_id for e in gateway().queue() if e.account == BENCH_TEAM and e.state not in done]


def drain_cluster(*, timeout: float = 120.0) -> int:
    """Cancel every live job of the bench account (scancel through the gateway, 4 at a time) and
    wait until the controller holds none. Returns how many were cancelled."""
    from portal.slurm import SlurmError

    cancelled = 0
    deadline = time.monotonic() + timeout
    while True:
        ids = bench_live_jobs()
        if not ids:
            return cancelled
        if time.monotonic() > deadline:
            print(f"  ! {len(ids)} bench jobs still alive in Slurm after {timeout:.0f} s", file=sys.stderr)
            return cancelled

        def cancel(job_id: int) -> None:
            try:
                gateway().cancel(job_id)
            except SlurmError as exc:
                print(f"  ! scancel {job_id}: {exc}", file=sys.stderr)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(cancel, ids))
        cancelled += len(ids)
        time.sleep(0.5)


def gpu_limit_set(gpus: int | None) -> None:
    """Cap the bench account at ``gpus`` GPUs running at once (GrpTRES), or lift the cap (None), so
    that benchmark jobs never hold the whole shared cluster."""
    from portal.slurm import AssociationLimits

    gateway().association_limits_set(
        AssociationLimits(account=BENCH_TEAM, grp_tres={} if gpus is None else {"gres/gpu": gpus})
    )


def leave_cluster() -> None:
    """After a benchmark that submitted: no bench job left alive, the bench account uncapped, the
    jobs' output files removed."""
    drain_cluster()
    gpu_limit_set(None)
    clean_workdir()


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


def clean_workdir() -> None:
    """Remove the output files bench jobs left in BENCH_WORKDIR."""
    if os.path.isdir(BENCH_WORKDIR):
        for name in os.listdir(BENCH_WORKDIR):
            if name.startswith("gpuportal-"):
                try:
                    os.unlink(os.path.join(BENCH_WORKDIR, name))
                except OSError:
                    pass


# ---------------------------------------------------------------- subprocesses


def service_env(**extra: str) -> dict[str, str]:
    """Environment of the web and worker processes: the benchmark's database, broker and cache;
    production-like settings (DEBUG=0) without TLS redirects; quiet logs."""
    return (
        os.environ
        | {
            "DATABASE_URL": BENCH_DATABASE_URL,
            "CELERY_BROKER_URL": BENCH_BROKER_URL,
            "CACHE_URL": BENCH_CACHE_URL,
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "LOG_LEVEL": "WARNING",
        }
        | _PRODUCTION_LIKE
        | extra
    )


class Service:
    """A subprocess started in its own session and stopped by its pid (SIGTERM, then SIGKILL)."""

    running: ClassVar[list[Service]] = []

    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = RUN_DIR / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        Service.running.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}; log {self.log_path}:\n{tail}"
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        if self in Service.running:
            Service.running.remove(self)


def stop_all() -> None:
    for service in list(Service.running):
        service.stop()


atexit.register(stop_all)


def _terminate(signum, frame):
    stop_all()
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _terminate)


def start_gunicorn(*, workers: int = 3, threads: int = 1, **env: str) -> Service:
    """gunicorn (sync workers) on 127.0.0.1:BENCH_PORT; waits until /healthz answers."""
    argv = [
        sys.executable, "-m", "gunicorn", "portal.wsgi", "-b", f"127.0.0.1:{BENCH_PORT}", "-w", str(workers),
        "--threads", str(threads), "--timeout", "120", "--graceful-timeout", "10", "--log-level", "warning",
    ]  # fmt: skip
    service = Service("gunicorn", argv, service_env(**env))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        service.check()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{BENCH_PORT}/login/", timeout=2).read()
            return service
        except OSError:
            time.sleep(0.3)
    service.stop()
    raise RuntimeError("gunicorn did not answer within 60 s")


def start_worker(*, concurrency: int = 2, queue: str = "celery", **env: str) -> Service:
    """A Celery worker (prefork) on the benchmark's broker; waits until it answers a ping."""
    from portal.celery import app

    node = f"bench-{os.getpid()}-{queue}@{platform.node()}"
    argv = [
        sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", queue, "--pool=prefork",
        f"--concurrency={concurrency}", "--without-mingle", "--without-gossip", "--without-heartbeat",
        "--loglevel=WARNING", "-n", node,
    ]  # fmt: skip
    service = Service("celery-worker", argv, service_env(**env))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        service.check()
        if app.control.ping(destination=[node], timeout=0.5):
            return service
    service.stop()
    raise RuntimeError("celery worker did not answer within 60 s")


def broker_purge(queue: str = "celery") -> None:
    """Drop messages left in the benchmark's broker queue (an interrupted earlier run)."""
    import redis

    redis.Redis.from_url(BENCH_BROKER_URL).delete(queue)


# ---------------------------------------------------------------- figures


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values, p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


@dataclass
class Figure:
    what: str
    value: float
    unit: str
    runs: str  # how many runs / samples it is the median of, in words
    how: str = ""

    def line(self) -> str:
        value = f"{self.value:,.1f}" if abs(self.value) >= 10 else f"{self.value:,.3g}"
        return f"{self.what}: {value} {self.unit} ({self.runs})"


@dataclass
class Section:
    title: str
    method: str = ""
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_md: str = ""  # verbatim markdown (tables)
    failed: bool = False  # the benchmark did not finish: run_all exits nonzero

    def add(self, what: str, value: float, unit: str, runs: str, how: str = "") -> Figure:
        figure = Figure(what, value, unit, runs, how)
        self.figures.append(figure)
        print(f"  {figure.line()}", flush=True)
        return figure

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    def markdown(self) -> str:
        out = [f"## {self.title}", ""]
        if self.method:
            out += [self.method, ""]
        if self.figures:
            out += ["| what | figure | runs |", "|---|---:|---|"]
            for f in self.figures:
                value = f"{f.value:,.1f}" if abs(f.value) >= 10 else f"{f.value:,.3g}"
                what = f.what + (f" — {f.how}" if f.how else "")
                out.append(f"| {what} | {value} {f.unit} | {f.runs} |")
            out.append("")
        if self.extra_md:
            out += [self.extra_md, ""]
        for note in self.notes:
            out.append(f"- {note}")
        if self.notes:
            out.append("")
        return "\n".join(out)


# ---------------------------------------------------------------- the machine


def _first_line(path: str, prefix: str) -> str:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    import django
    from django.db import connection

    mem_kb = _first_line("/proc/meminfo", "MemTotal")
    try:
        memory = f"{int(mem_kb.split()[0]) / 1024 / 1024:.1f} GiB"
    except (ValueError, IndexError):
        memory = mem_kb
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    try:
        slurm = gateway().version()
    except Exception as exc:  # noqa: BLE001 — described, not fatal
        slurm = f"unavailable ({exc})"
    try:
        import redis

        redis_version = redis.Redis.from_url(BENCH_BROKER_URL).info("server")["redis_version"]
    except Exception:  # noqa: BLE001
        redis_version = "?"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            # the results file itself is always about to change: it does not make the code uncommitted
            ["git", "status", "--porcelain", "--", ".", ":(exclude)bench/results.md"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        ).stdout.strip()
        commit += " (uncommitted changes)" if dirty else ""
    except OSError:
        commit = "?"
    load = os.getloadavg()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "memory": memory,
        "CPU": _first_line("/proc/cpuinfo", "model name"),
        "OS": _os_name(),
        "Slurm": slurm,
        "PostgreSQL": pg,
        "Redis": redis_version,
        "Python / Django": f"{platform.python_version()} / {django.get_version()}",
        "commit": commit,
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in load),
    }


def _os_name() -> str:
    try:
        with open("/etc/os-release") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def print_header(title: str) -> None:
    print(f"\n== {title}", flush=True)


def count_refusal(errors: list[int], status: int, text, *, shown: int = 3, chars: int = 300) -> None:
    """A POST answered other than 201 is counted in ``errors[0]``; the first ``shown`` are printed
    (``chars`` of the answer). Called under the client threads' lock."""
    if status != 201:
        errors[0] += 1
        if errors[0] <= shown:
            print(f"  ! POST answered {status}: {text[:chars]!r}", file=sys.stderr)


# ---------------------------------------------------------------- command line


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


def dump_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


# ---------------------------------------------------------------- HTTP


class ApiClient:
    """One keep-alive HTTP/1.1 connection to the benchmark's gunicorn, authenticated by token.
    Reconnects once when the server closed the connection."""

    def __init__(self, token: str, *, port: int | None = None, host: str = "127.0.0.1"):
        import http.client

        self._http = http.client
        self.port = port or BENCH_PORT
        self.headers = {
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self.conn = http.client.HTTPConnection(host, self.port, timeout=60)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes, float]:
        """(status, body, seconds)."""
        payload = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):
            began = time.perf_counter()
            try:
                self.conn.request(method, path, body=payload, headers=self.headers)
                response = self.conn.getresponse()
                data = response.read()
                elapsed = time.perf_counter() - began
                if response.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return response.status, data, elapsed
            except (
                self._http.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                self._http.CannotSendRequest,
            ):
                self.conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------- bulk job rows


def make_job(world: World, **values):
    """An unsaved Job of the bench team/user, finished (COMPLETED) unless told otherwise."""
    from decimal import Decimal

    from django.utils import timezone

    from jobs.models import Job

    now = timezone.now()
    defaults = dict(  # noqa: C408 — keyword form reads like the model
        team=world.team, submitter=world.user, name="bench-history", script="#!/bin/bash\ntrue\n", partition="debug",
        gpus=1, time_limit_minutes=1, workdir=BENCH_WORKDIR, environment={}, state="COMPLETED",
        estimated_gpu_hours=Decimal("0.02"), created_at=now, submitted_at=now, started_at=now, ended_at=now,
        exit_code=0, relay_attempts=1, unix_uid=world.uid,
    )  # fmt: skip
    return Job(**(defaults | values))


def copy_jobs(jobs) -> float:
    """Insert Job rows with one COPY (every concrete column, as the model defines them), then VACUUM (ANALYZE). Seconds taken."""
    from django.db import connection, models

    from jobs.models import Job

    began = time.perf_counter()
    fields = Job._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {Job._meta.db_table} ({columns}) FROM STDIN") as copy:
            for job in jobs:
                row = []
                for f in fields:
                    value = getattr(job, f.attname)
                    row.append(
                        json.dumps(value) if isinstance(f, models.JSONField) and value is not None else value
                    )
                copy.write_row(row)
        # what autovacuum does to a table after inserts: statistics, and the visibility map that lets
        # counts run as index-only scans
        cursor.execute(f"VACUUM (ANALYZE) {Job._meta.db_table}")
    return time.perf_counter() - began
