"""Fixtures for the fault tests: a dedicated Redis server (the shared one on 6379 is never touched)
and a real Celery worker on it that a test may SIGKILL and start again, both connected to this
run's test database; helpers that count, in Slurm itself, the jobs carrying the portal's tags."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support import skip_unless_ci, wait_for
from django.utils import timezone

from tests.conftest import ROOT, _use_broker

FAULT_RELAY_LEASE_SECONDS = 15  # see tests/faults/worker_main.py
FAULT_SLURM_TIMEOUT = 4  # three Slurm calls per relay at most: 12 s < the lease


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RedisServer:
    """A redis-server of this test's own, without persistence (a restart loses every message)."""

    def __init__(self, directory: Path):
        self.port = _free_port()
        self.directory = directory
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--pidfile", str(self.directory / f"redis-{self.port}.pid"), "--dir", str(self.directory),
                "--daemonize", "no", "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

        def listening() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server on port {self.port} exited with {self.proc.returncode}")
            return _port_open(self.port)

        wait_for(listening, timeout=10, interval=0.02, what=f"redis-server to listen on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """SIGKILL and start again: queued and unacknowledged messages are gone."""
        self.kill()
        self.start()
        self.restarts += 1


class FaultWorker:
    """A real ``celery worker`` (prefork, as in production) on the dedicated broker, consuming this
    test's queue. ``kill()`` SIGKILLs its whole process group (parent and pool children)."""

    def __init__(self, *, broker_url: str, queue: str, database_url: str, log_path: Path, concurrency: int = 2,
                 module: str = "tests.faults.worker_main", extra_env: dict[str, str] | None = None):  # fmt: skip
        self.module = module  # the worker's main (tests/faults/ha_worker_main.py: with a test task)
        self.extra_env = extra_env or {}
        self.broker_url = broker_url
        self.queue = queue
        self.database_url = database_url
        self.log_path = log_path
        self.concurrency = concurrency
        self.proc: subprocess.Popen | None = None
        self.generation = 0
        self.kills = 0
        self.exits = 0  # exited on its own (restarted by supervise())

    @property
    def node_name(self) -> str:
        return f"faults-{os.getpid()}-{self.generation}@{os.uname().nodename}"

    def start(self, *, wait: bool = True) -> None:
        self.generation += 1
        env = os.environ | {
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": self.broker_url,
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "DJANGO_SETTINGS_MODULE": "portal.project.settings",
            "SLURM_TIMEOUT": str(FAULT_SLURM_TIMEOUT),
            "GPUPORTAL_TEST_RELAY_LEASE_SECONDS": str(FAULT_RELAY_LEASE_SECONDS),
        } | self.extra_env
        with open(self.log_path, "a") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", self.module, "-A", "portal.project", "worker", "-Q", self.queue,
                    "--pool=prefork", f"--concurrency={self.concurrency}", "--without-mingle", "--without-gossip",
                    "--without-heartbeat", "--loglevel=INFO", "-n", self.node_name.split("@")[0] + "@%h",
                ],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 45) -> float:
        from portal.project.celery import app

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                pytest.fail(f"celery worker exited with {self.proc.returncode} (log: {self.log_path})")
            try:
                if app.control.ping(destination=[self.node_name], timeout=0.5):
                    return time.monotonic() - started
            except Exception:  # noqa: BLE001 — the broker may be restarting
                time.sleep(0.2)  # back off before the next ping (the ping itself waits 0.5 s for answers)
        pytest.fail(f"celery worker did not answer within {timeout} s (log: {self.log_path})")

    def supervise(self) -> bool:
        """What systemd's ``Restart=always`` (docs/deploy.md) does: start the worker again when it
        has exited. Returns True when it had to. (Celery 5.7/kombu 5.7 with redis-py 8 exit with
        "Unrecoverable error: AttributeError('NoneType' object has no attribute 'hostname')" when
        the broker connection drops; see docs/reliability.md.)"""
        if self.proc is not None and self.proc.poll() is None:
            return False
        self.exits += 1
        self.start(wait=False)
        return True

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes: no warm shutdown, nothing acknowledged."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.kills += 1
        self.proc = None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.proc = None


class Faults:
    def __init__(self, redis: RedisServer, worker: FaultWorker):
        self.redis = redis
        self.worker = worker
        self.since = timezone.now()


def _database_url() -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def faults(transactional_db, cluster, settings, monkeypatch, tmp_path):
    """Dedicated Redis + killable worker; this process's Celery app publishes to them (eager off).
    The sweeper's age threshold and the relay lease are shortened for the test's runtime (the
    worker gets the same lease). At the end: worker and Redis stopped by pid, and every job of this
    test still live in Slurm cancelled."""
    from jobs import services
    from portal.project.celery import app

    if shutil.which("redis-server") is None:
        skip_unless_ci("redis-server is not installed (scripts/services installs it)")
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    queue = f"faults-{os.getpid()}"
    log_dir = ROOT / ".run" if (ROOT / ".run").is_dir() else tmp_path
    worker = FaultWorker(
        broker_url=redis_server.url, queue=queue, database_url=_database_url(), log_path=log_dir / "test-faults-worker.log"
    )
    saved = app.conf.task_always_eager, app.conf.broker_url, app.conf.task_default_queue
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.JOB_ACCEPTED_SWEEP_SECONDS = 5
    monkeypatch.setattr(services.relay, "RELAY_LEASE_SECONDS", FAULT_RELAY_LEASE_SECONDS)
    app.conf.task_always_eager = False
    app.conf.task_default_queue = queue
    _use_broker(redis_server.url)
    state = Faults(redis_server, worker)
    try:
        worker.start()
        yield state
    finally:
        worker.stop()
        app.conf.task_always_eager, _, app.conf.task_default_queue = saved
        _use_broker(saved[1])
        redis_server.kill()
        cancel_live_jobs_of_this_test()


# ---------------------------------------------------------------- what Slurm holds


def slurm_ids_by_tag(tags: set[str], since: dt.datetime) -> dict[str, set[int]]:
    """Every Slurm job id carrying each tag: the controller's queue (live and recently ended) and
    accounting since ``since`` (jobs that left the queue), merged by id."""
    from portal.slurm import get_gateway

    gateway = get_gateway()
    found: dict[str, set[int]] = defaultdict(set)
    for entry in gateway.queue():
        if entry.comment in tags:
            found[entry.comment].add(entry.job_id)
    for record in gateway.accounting(since - dt.timedelta(minutes=5), timezone.now() + dt.timedelta(minutes=1)):
        if record.comment in tags:
            found[record.comment].add(record.job_id)
    return found


def cancel_live_jobs_of_this_test() -> None:
    """scancel every job this test's rows point at, or that carries their tags, still in the queue."""
    from jobs.models import Job
    from portal.slurm import SlurmError, get_gateway
    from portal.slurm.tags import slurm_tag

    try:
        tags = {slurm_tag(pk) for pk in Job.objects.values_list("pk", flat=True)}
        gateway = get_gateway()
        for entry in gateway.queue():
            if entry.comment in tags and entry.state in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED"):
                gateway.cancel(entry.job_id)
    except (SlurmError, Exception) as exc:  # noqa: BLE001 — clean-up must not hide the test's own outcome
        print(f"clean-up of this test's Slurm jobs failed: {exc}")


def submit_tiny(world, name: str, **overrides):
    """A 1-GPU ``true`` job in the debug partition through the service (as the API calls it)."""
    from jobs.services import job_submit

    kwargs = {
        "user": world.alice, "team": world.vision, "name": name, "script": "#!/bin/bash\ntrue\n",
        "partition": "debug", "gpus": 1, "time_limit_minutes": 1,
    }  # fmt: skip
    kwargs.update(overrides)
    job, _ = job_submit(**kwargs)
    return job


def recover(ids, *, timeout: float, sweep_every: float = 2.0, worker: FaultWorker | None = None) -> dict:
    """Run the sweeper (beat does not run in tests) until no job of ``ids`` is ACCEPTED; figures."""
    from jobs.choices import JobState
    from jobs.models import Job
    from jobs.services import jobs_sweep

    started = time.monotonic()
    sweeps = re_enqueued = 0
    last_sweep = 0.0
    while True:
        left = Job.objects.filter(pk__in=ids, state=JobState.ACCEPTED).count()
        if left == 0:
            return {"seconds": round(time.monotonic() - started, 1), "sweeps": sweeps, "re_enqueued": re_enqueued}
        if time.monotonic() - started > timeout:
            pytest.fail(f"{left} job(s) still ACCEPTED after {timeout} s of sweeping ({sweeps} sweeps)")
        if worker is not None:
            worker.supervise()
        if time.monotonic() - last_sweep >= sweep_every:
            result = jobs_sweep()
            sweeps += 1
            re_enqueued += result["relays"]
            last_sweep = time.monotonic()
        # a poll of the condition above that also plays beat (sweeps, supervision) between polls;
        # its failure says how many sweeps ran, which wait_for's would not
        time.sleep(0.3)


def assert_each_job_in_slurm_exactly_once(ids, since) -> dict:
    """No job ACCEPTED or SUBMIT_FAILED; Slurm holds exactly one job per tag, the one recorded."""
    from jobs.choices import JobState
    from jobs.models import Job

    jobs = list(Job.objects.filter(pk__in=ids))
    assert len(jobs) == len(ids)
    states = defaultdict(int)
    for job in jobs:
        states[job.state] += 1
    assert states[JobState.ACCEPTED] == 0 and states[JobState.SUBMIT_FAILED] == 0, dict(states)
    tags = {job.slurm_tag for job in jobs}
    found = slurm_ids_by_tag(tags, since)
    # sacct may lag a finished job by a moment once it has left the queue: ask again (for up to 10 s)
    # until every tag is found, then check
    deadline = time.monotonic() + 10
    while any(not found.get(job.slurm_tag) for job in jobs) and time.monotonic() < deadline:
        time.sleep(0.5)  # a bounded poll that does not fail by itself: the asserts below say what is missing
        found = slurm_ids_by_tag(tags, since)
    twice = {tag: sorted(ids_) for tag, ids_ in found.items() if len(ids_) > 1}
    assert twice == {}, f"jobs submitted to Slurm more than once: {twice}"
    for job in jobs:
        assert found.get(job.slurm_tag) == {job.slurm_job_id}, (job.pk, job.slurm_job_id, found.get(job.slurm_tag))
    attempts = defaultdict(int)
    for job in jobs:
        attempts[job.relay_attempts] += 1
    return {"states": dict(states), "relay_attempts": dict(sorted(attempts.items()))}
