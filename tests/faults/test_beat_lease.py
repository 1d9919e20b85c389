"""Celery beat once across the site (issue 42, portal/beat.py): two real ``celery beat`` processes (as on
two portal hosts) on this run's test database and a dedicated Redis broker, with the portal's own
schedule (jobs-sync every 0.5 s here). Only the lease's holder sends; the holder is SIGKILLed and the
other takes over within the lease; the messages on the broker, in the order they were sent, carry
their sender (Celery's ``origin`` header: gen<pid>@host) and show one sender, then the other, never
both. A clean stop (SIGTERM) gives the lease up. Figures are printed (run with ``-s``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from django.utils import timezone

from portal.beat import BEAT_LEASE
from portal.models import Lease
from tests.conftest import ROOT
from tests.faults.conftest import RedisServer, _database_url
from tests.faults.ha import wait_until

LEASE_SECONDS = 5.0  # a holder starved for longer than this (a loaded machine) would hand over legitimately


class Beat:
    def __init__(self, name: str, *, broker_url: str, directory):
        self.name = name
        self.log_path = directory / f"beat-{name}.log"
        env = os.environ | {
            "DATABASE_URL": _database_url(),
            "CELERY_BROKER_URL": broker_url,
            "DJANGO_SETTINGS_MODULE": "portal.project.settings",
            "BEAT_LEASE_SECONDS": str(LEASE_SECONDS),
            "JOB_SYNC_INTERVAL_SECONDS": "0.5",
        }
        with open(self.log_path, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", "portal.project", "beat", "--loglevel=INFO",
                    "--schedule", str(directory / f"beat-{name}-schedule"), "--pidfile=",
                ],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def signal(self, sig) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)


def _senders(broker) -> list[int]:
    """The pid of the sender of every message on the default queue, oldest first (LPUSH: newest first)."""
    messages = [json.loads(raw) for raw in reversed(broker.lrange("celery", 0, -1))]
    return [int(m["headers"]["origin"].removeprefix("gen").split("@")[0]) for m in messages]


def _holder_pid() -> int | None:
    lease = Lease.objects.filter(name=BEAT_LEASE).first()
    return int(lease.holder.split(":")[1]) if lease and lease.holder else None


@pytest.mark.django_db(transaction=True)
def test_beat_runs_once_and_another_host_takes_over_when_the_holder_is_killed(tmp_path):
    import redis

    redis_server = RedisServer(tmp_path)
    redis_server.start()
    broker = redis.Redis.from_url(redis_server.url)
    beats = [Beat(name, broker_url=redis_server.url, directory=tmp_path) for name in ("host1", "host2")]
    by_pid = {beat.proc.pid: beat for beat in beats}
    try:
        wait_until(lambda: _holder_pid() in by_pid, timeout=60, what="one beat to take the lease")
        holder = by_pid[_holder_pid()]
        other = next(beat for beat in beats if beat is not holder)
        wait_until(lambda: _senders(broker).count(holder.proc.pid) >= 6, timeout=60, what="the holder to send")
        time.sleep(LEASE_SECONDS)  # the other has tried to claim a few times meanwhile

        holder.signal(signal.SIGKILL)  # the holder's host dies
        killed_at = time.monotonic()
        sent_before_kill = len(_senders(broker))
        took = wait_until(lambda: other.proc.pid in _senders(broker), timeout=30, what="the other beat to send")
        wait_until(lambda: _senders(broker).count(other.proc.pid) >= 4, timeout=30, what="the other beat to go on")
        senders = _senders(broker)
        assert set(senders[:sent_before_kill]) == {holder.proc.pid}  # the standby sent nothing while the holder lived
        runs = [pid for i, pid in enumerate(senders) if i == 0 or senders[i - 1] != pid]
        assert runs == [holder.proc.pid, other.proc.pid]  # one sender, then the other: never both
        assert took <= LEASE_SECONDS + LEASE_SECONDS / 3 + 3  # the lease, one renewal period, start-up slack
        assert _holder_pid() == other.proc.pid

        other.signal(signal.SIGTERM)  # a clean stop gives the lease up at once
        assert Lease.objects.get(name=BEAT_LEASE).expires_at <= timezone.now()
        print(f"\nbeat lease: {sent_before_kill} tasks sent by the holder, taken over {took:.1f} s after its SIGKILL "
              f"(lease {LEASE_SECONDS} s, renewed every {LEASE_SECONDS / 3:.1f} s); "
              f"{time.monotonic() - killed_at:.1f} s to {senders.count(other.proc.pid)} sends by the new holder")  # fmt: skip
    finally:
        for beat in beats:
            beat.signal(signal.SIGKILL)
        redis_server.kill()
