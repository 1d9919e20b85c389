"""Real Celery workers for the tests (tests/conftest.py's ``celery_workers`` / ``real_worker``):
starting and stopping a worker subprocess on a queue of this run's own, pointing this process's
Celery app at a broker, and settling a worker before a test's tables are flushed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A queue of this test run's own on a broker database no demo uses (14): concurrent test runs on
# one machine never take each other's tasks.
WORKER_QUEUE = f"tests-{os.getpid()}"


def _broker_database(number: int) -> str:
    """The Redis of CELERY_BROKER_URL (its password with it: scripts/services gives Redis one),
    database ``number``."""
    from urllib.parse import urlsplit, urlunsplit

    broker = urlsplit(os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
    return urlunsplit((broker.scheme, broker.netloc, f"/{number}", "", ""))


WORKER_BROKER_URL = _broker_database(14)
# queue -> the node name of this run's worker on it (other runs' workers share the broker database)
NODES: dict[str, str] = {}


def _use_broker(url: str) -> None:
    """Point this process's Celery app at another broker. The connection and producer pools are
    built lazily from the configuration on first use, so they are dropped too (test-only reach into
    Celery's private attributes; the same reset Celery does after a fork)."""
    from portal.project.celery import app

    # Celery's Settings.broker_url prefers the CELERY_BROKER_URL environment variable (which
    # `make test` exports) to the configured value: change both.
    os.environ["CELERY_BROKER_URL"] = url
    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None


def _start_worker(name: str, queue: str, slurm_env: dict[str, str]):
    """A real ``celery worker`` subprocess on ``queue`` of the dedicated broker database, connected
    to the pytest test database, with ``slurm_env`` (SLURM_BACKEND, SLURM_CONF ...) over ours.
    Returns (process, log file, log path) once it answers a ping."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(WORKER_BROKER_URL).delete(queue)
    db = settings.DATABASES["default"]
    from urllib.parse import quote

    login = quote(db["USER"], safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else "")
    database_url = f"postgres://{login}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = os.environ | slurm_env | {
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": WORKER_BROKER_URL,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "DJANGO_SETTINGS_MODULE": "portal.project.settings",
    }
    (ROOT / ".run").mkdir(exist_ok=True)
    log_path = ROOT / ".run" / f"test-celery-{name}-{os.getpid()}.log"
    log = open(log_path, "w")
    node = f"{name}-{os.getpid()}"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "portal.project", "worker", "-Q", queue, "--pool=prefork",
            "--concurrency=2", "--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel=INFO",
            "-n", f"{node}@%h",
        ],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        from portal.project.celery import app

        _use_broker(WORKER_BROKER_URL)
        deadline = time.monotonic() + 90  # a loaded 2-core machine takes a while to import Django + Celery
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"celery worker exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if app.control.ping(destination=[f"{node}@{os.uname().nodename}"], timeout=0.5):
                NODES[queue] = f"{node}@{os.uname().nodename}"
                return proc, log
        pytest.fail(f"celery worker did not answer within 90 s:\n{log_path.read_text()[-3000:]}")
    except BaseException:
        _stop_worker(proc, log)
        raise


def _stop_worker(proc, log) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


def _worker_settle(queue: str, timeout: float = 60.0) -> None:
    """Before the test's tables are flushed: drop what is still queued for the worker (tasks the test
    left behind, e.g. the job-end notice of its last job) and wait until no worker runs or holds a
    task — one writing to the tables while they are truncated deadlocks the flush."""
    import redis

    from portal.project.celery import app
    from tests.support import wait_for

    broker = redis.Redis.from_url(WORKER_BROKER_URL)
    broker.delete(queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9)))  # kombu's list per priority step

    def idle():
        inspect = app.control.inspect(destination=[NODES[queue]] if queue in NODES else None, timeout=0.5)
        busy = [tasks for reply in (inspect.active(), inspect.reserved()) for tasks in (reply or {}).values()]
        return not any(busy)

    wait_for(idle, timeout=timeout, interval=0.2, what="the test's Celery worker to finish its tasks")
