"""The benchmark's subprocesses: gunicorn and Celery workers started in sessions of their own,
waited for until they answer, and stopped by their pids (SIGTERM, then SIGKILL) — at the latest when
the benchmark exits or is terminated. Logs in RUN_DIR (.run/bench/)."""

from __future__ import annotations

import atexit
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.request
from typing import ClassVar

from environment import BENCH_BROKER_URL, BENCH_PORT, ROOT, RUN_DIR, service_env


class Service:
    """A subprocess started in its own session and stopped by its pid (SIGTERM, then SIGKILL)."""

    running: ClassVar[list[Service]] = []

    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.node = ""  # a Celery worker's node name (start_worker)
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


def web_answers(port: int = BENCH_PORT) -> bool:
    """Whether a portal on 127.0.0.1:``port`` answers its login page."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=2).read()
    except OSError:
        return False
    return True


def start_gunicorn(*, workers: int = 3, threads: int = 1, **env: str) -> Service:
    """gunicorn (sync workers) on 127.0.0.1:BENCH_PORT; waits until /login/ answers."""
    argv = [
        sys.executable, "-m", "gunicorn", "portal.project.wsgi", "-b", f"127.0.0.1:{BENCH_PORT}", "-w", str(workers),
        "--threads", str(threads), "--timeout", "120", "--graceful-timeout", "10", "--log-level", "warning",
    ]  # fmt: skip
    service = Service("gunicorn", argv, service_env(**env))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        service.check()
        if web_answers():
            return service
        time.sleep(0.3)  # polling the port, not synchronising
    service.stop()
    raise RuntimeError("gunicorn did not answer within 60 s")


def start_worker(*, concurrency: int = 2, queue: str = "celery", **env: str) -> Service:
    """A Celery worker (prefork) on the benchmark's broker; waits until it answers a ping."""
    from portal.project.celery import app

    node = f"bench-{os.getpid()}-{queue}@{platform.node()}"
    argv = [
        sys.executable, "-m", "celery", "-A", "portal.project", "worker", "-Q", queue, "--pool=prefork",
        f"--concurrency={concurrency}", "--without-mingle", "--without-gossip", "--without-heartbeat",
        "--loglevel=WARNING", "-n", node,
    ]  # fmt: skip
    service = Service("celery-worker", argv, service_env(**env))
    service.node = node
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        service.check()
        if app.control.ping(destination=[node], timeout=0.5):
            return service
    service.stop()
    raise RuntimeError("celery worker did not answer within 60 s")


def worker_idle_wait(worker: Service, *, queue: str = "celery", timeout: float = 60.0) -> None:
    """Until the broker queue is empty and ``worker`` (start_worker's) holds no task, running or
    prefetched: what it was sent before has all been done."""
    import redis

    from portal.project.celery import app

    broker = redis.Redis.from_url(BENCH_BROKER_URL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker.check()
        if broker.llen(queue) == 0:
            inspect = app.control.inspect(destination=[worker.node], timeout=1.0)
            held = [inspect.active(), inspect.reserved()]
            if all(answer is not None and not any(answer.values()) for answer in held):
                return
        time.sleep(0.1)  # polling the broker and the worker, not synchronising
    raise RuntimeError(f"{worker.name} still had tasks after {timeout:.0f} s")


def broker_purge(queue: str = "celery") -> None:
    """Drop messages left in the benchmark's broker queue (an interrupted earlier run)."""
    import redis

    redis.Redis.from_url(BENCH_BROKER_URL).delete(queue)
