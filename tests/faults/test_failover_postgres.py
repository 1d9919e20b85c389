"""PostgreSQL with a standby (issue 42): a primary and a streaming standby of this test's own, and
portal processes (tests/faults/db_probe.py: Django from DATABASE_URL, one request per command) given
the multi-host URL of docs/deploy.md in either order. Each writes to the primary, whichever host is
listed first; the primary is SIGKILLed and the standby promoted (pg_ctl promote); the next request of
the same process writes to the new primary (CONN_HEALTH_CHECKS replaces the dead connection), a
request in flight at the kill fails and leaves nothing, and what was committed before is there.
The control: the same process with CONN_HEALTH_CHECKS off fails its first request after the failover.
Beat's lease (portal/beat.py) is renewed by its holder on the new primary at its next claim.
Figures are printed (run with ``-s``)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.faults.ha import PostgresPair, wait_until

DATABASE = "ha"


@pytest.fixture
def pg_pair():
    pair = PostgresPair()
    try:
        pair.start(DATABASE)
        yield pair
    finally:
        pair.stop()


class Probe:
    def __init__(self, url: str, *, health_checks: bool = True):
        env = os.environ | {"DATABASE_URL": url, "GPUPORTAL_TEST_NO_HEALTH_CHECKS": "0" if health_checks else "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.db_probe"], cwd=ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 60) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            pytest.fail(f"the probe did not answer within {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the probe exited with {self.proc.wait(timeout=10)}")
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.send(**command)
        return self.answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _sessions(pair: PostgresPair, node: str) -> set[str]:
    """The session keys on ``node`` (none while its table is not there yet: a standby replaying)."""
    import psycopg

    with pair.connect(node, DATABASE) as conn:
        try:
            return {row[0] for row in conn.execute("SELECT session_key FROM django_session")}
        except psycopg.errors.UndefinedTable:
            return set()


def _lease(pair: PostgresPair, node: str) -> tuple | None:
    """(holder, expires_at) of beat's lease on ``node``; None before the standby has it."""
    import psycopg

    with pair.connect(node, DATABASE) as conn:
        try:
            return conn.execute("SELECT holder, expires_at FROM portal_lease WHERE name = 'celery-beat'").fetchone()
        except psycopg.errors.UndefinedTable:
            return None


def test_the_portal_follows_a_promoted_standby_whichever_host_is_listed_first(pg_pair):
    a, b = pg_pair.ports["a"], pg_pair.ports["b"]
    query = f"{DATABASE}?target_session_attrs=read-write&connect_timeout=3"
    probes = {
        "standby-first": Probe(f"postgres://postgres@127.0.0.1:{b},127.0.0.1:{a}/{query}"),
        "primary-first": Probe(f"postgres://postgres@127.0.0.1:{a},127.0.0.1:{b}/{query}"),
        "no-health-checks": Probe(f"postgres://postgres@127.0.0.1:{a},127.0.0.1:{b}/{query}", health_checks=False),
    }
    beat = Probe(f"postgres://postgres@127.0.0.1:{a},127.0.0.1:{b}/{query}")  # a beat process: no requests
    try:
        assert probes["standby-first"].ask(op="setup") == {"ok": True}
        for name, probe in probes.items():  # the primary, whichever order: the standby refuses read-write
            assert probe.ask(op="request", key=f"before-{name}") == {"ok": True, "port": a, "standby": False}, name
        claimed = beat.ask(op="beat")  # the beat takes the lease
        assert claimed["holding"] is True and claimed["held_for"] > 0, claimed
        in_flight = probes["standby-first"].ask(op="hold", key="in-flight")
        assert in_flight == {"ok": True, "held": True, "port": a, "standby": False}
        before = {f"before-{name}" for name in probes}
        wait_until(lambda: _sessions(pg_pair, "b") >= before and _lease(pg_pair, "b"), timeout=30,
                   what="the standby to replay the commits")  # fmt: skip
        holder, expires_at = _lease(pg_pair, "b")

        pg_pair.kill("a")  # the primary's host dies …
        started = time.monotonic()
        pg_pair.promote("b")  # … and the standby is promoted (what pg_auto_failover's monitor orders)
        promoted = time.monotonic() - started

        probes["standby-first"].send(op="release")  # the request in flight commits on a dead server
        released = probes["standby-first"].answer()
        assert released["ok"] is False, released

        # beat's next renewal, on the connection the kill left dead: renewed on the new primary, still its lease
        claimed = beat.ask(op="beat")
        assert claimed["holding"] is True, claimed
        assert _lease(pg_pair, "b")[0] == holder and _lease(pg_pair, "b")[1] > expires_at

        after, took = {}, {}
        for name, probe in probes.items():
            started = time.monotonic()
            after[name] = probe.ask(op="request", key=f"after-{name}")
            took[name] = round(time.monotonic() - started, 2)
        assert after["standby-first"] == {"ok": True, "port": b, "standby": False}
        assert after["primary-first"] == {"ok": True, "port": b, "standby": False}  # the dead host first: skipped
        # the control: without health checks the dead connection fails the request, the next one reconnects
        assert after["no-health-checks"]["ok"] is False, after["no-health-checks"]
        retried = probes["no-health-checks"].ask(op="request", key="after-no-health-checks")
        assert retried == {"ok": True, "port": b, "standby": False}

        on_b = _sessions(pg_pair, "b")
        assert on_b >= before | {f"after-{name}" for name in probes}  # committed before and after: all there
        assert "in-flight" not in on_b  # the request in flight left nothing
        print(f"\nPostgreSQL failover: promote took {promoted:.1f} s; first request after it took {took} s; "
              f"the request in flight failed with {released['error'][:80]!r}")  # fmt: skip
    finally:
        for probe in [*probes.values(), beat]:
            probe.stop()
