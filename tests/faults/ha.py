"""Services with failover for the fault tests, each of this test's own on free localhost ports (the
shared Redis on 6379 and PostgreSQL on 5432 are never touched): a Redis master, its replica and three
Sentinels (``SentinelRedis``), and a PostgreSQL primary with a streaming standby (``PostgresPair``).
Their processes are started in sessions of their own and stopped by pid; failover timeouts are short
(Sentinel: down-after 1 s) to keep each test's runtime small."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import skip_unless_ci, wait_for

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill_group(proc: subprocess.Popen | None, sig=signal.SIGKILL) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=20)


class SentinelRedis:
    """A master, one replica and three Sentinels monitoring it as ``master_name``, with passwords as a
    site sets them: ``password`` on the data nodes (requirepass, masterauth), ``sentinel_password``
    on the Sentinels (their requirepass, which they also use with each other)."""

    SENTINELS = 3
    password = "data-secret"
    sentinel_password = "sentinel-secret"

    def __init__(self, directory: Path, master_name: str = "ha-test"):
        if shutil.which("redis-server") is None:
            skip_unless_ci("redis-server is not installed (scripts/services installs it)")
        self.directory = directory
        self.master_name = master_name
        self.data_ports = [free_port(), free_port()]
        self.sentinel_ports = [free_port() for _ in range(self.SENTINELS)]
        self.procs: dict[int, subprocess.Popen] = {}

    def url(self, db: int) -> str:
        """Celery's/kombu's Sentinel URL: every Sentinel, joined by ;, the master's password on the first."""
        first, *others = self.sentinel_ports
        return ";".join([f"sentinel://:{self.password}@127.0.0.1:{first}/{db}",
                         *(f"sentinel://127.0.0.1:{port}/{db}" for port in others)])  # fmt: skip

    def _spawn(self, port: int, args: list[str]) -> None:
        with open(self.directory / f"redis-{port}.log", "w") as log:  # the child keeps its own descriptor
            self.procs[port] = subprocess.Popen(
                ["redis-server", *args], cwd=self.directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for(lambda: port_open(port), timeout=10, interval=0.05, what=f"redis on port {port}")

    def start(self) -> None:
        master, replica = self.data_ports
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.directory),
                  "--requirepass", self.password, "--masterauth", self.password]  # fmt: skip
        self._spawn(master, ["--port", str(master), *common])
        self._spawn(replica, ["--port", str(replica), *common, "--replicaof", "127.0.0.1", str(master)])
        for port in self.sentinel_ports:
            conf = self.directory / f"sentinel-{port}.conf"  # Sentinel rewrites its file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {master} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} 1000\n"
                f"sentinel failover-timeout {self.master_name} 5000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
                f"sentinel auth-pass {self.master_name} {self.password}\n"
                f"requirepass {self.sentinel_password}\n"
            )
            self._spawn(port, [str(conf), "--sentinel"])
        wait_for(self.settled, timeout=30, interval=0.2, what="every Sentinel to know the replica and the other Sentinels")

    def _sentinel(self, port: int):
        import redis

        return redis.Redis(host="127.0.0.1", port=port, password=self.sentinel_password, socket_timeout=1,
                           decode_responses=True)  # fmt: skip

    def settled(self) -> bool:
        try:
            for port in self.sentinel_ports:
                with self._sentinel(port) as s:
                    state = s.sentinel_masters()[self.master_name]  # (redis-py 6.4's sentinel_master() breaks)
                    if state["num-other-sentinels"] != self.SENTINELS - 1 or state["num-slaves"] < 1:
                        return False
        except Exception:  # noqa: BLE001 — not up yet
            return False
        return True

    def master_port(self) -> int | None:
        """Where the Sentinels agree the master is (None while they disagree)."""
        answers = set()
        for port in self.sentinel_ports:
            try:
                with self._sentinel(port) as s:
                    # the command itself: redis-py 6.4's sentinel_get_master_addr_by_name() breaks on its reply
                    answers.add(int(s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1]))
            except Exception:  # noqa: BLE001
                return None
        return answers.pop() if len(answers) == 1 else None

    def data(self, port: int, db: int = 0):
        """A plain client of one data node's database ``db`` (to look at what landed where)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=port, db=db, password=self.password, socket_timeout=2)

    def kill(self, port: int) -> None:
        _kill_group(self.procs.pop(port, None))

    def freeze(self, port: int) -> None:
        """SIGSTOP: the host answers no more but its connections stay open (a client sees a cut link)."""
        os.killpg(self.procs[port].pid, signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        os.killpg(self.procs[port].pid, signal.SIGCONT)

    def role(self, port: int) -> str | None:
        try:
            with self.data(port) as node:
                return node.info("replication")["role"]
        except Exception:  # noqa: BLE001 — frozen or down
            return None

    def stop(self) -> None:
        for port in list(self.procs):
            with contextlib.suppress(ProcessLookupError):
                self.thaw(port)
            self.kill(port)


class PostgresPair:
    """A PostgreSQL primary and a standby (pg_basebackup -R: streaming replication), run as the
    postgres user from a directory of this test's own, trusting connections from 127.0.0.1."""

    def __init__(self):
        if not (PG_BIN / "initdb").exists():
            skip_unless_ci(f"PostgreSQL's server binaries are not in {PG_BIN} (scripts/services installs them)")
        self.user = pwd.getpwnam("postgres")
        # not under pytest's tmp_path: its parents are root's alone, and the server runs as postgres
        self.directory = Path(tempfile.mkdtemp(prefix="gpuportal-test-pg-"))
        os.chown(self.directory, self.user.pw_uid, self.user.pw_gid)
        self.ports = {"a": free_port(), "b": free_port()}
        self.procs: dict[str, subprocess.Popen] = {}

    def data_dir(self, node: str) -> Path:
        return self.directory / f"pg-{node}"

    def _run(self, *args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=120, user=self.user.pw_uid, group=self.user.pw_gid,
                       cwd=self.directory)  # fmt: skip

    def _start(self, node: str) -> None:
        port = self.ports[node]
        with open(self.directory / f"pg-{node}.log", "w") as log:  # the child keeps its own descriptor
            self.procs[node] = self._popen_postgres(node, port, log)
        wait_for(lambda: self._ready(node), timeout=30, interval=0.1, what=f"PostgreSQL {node} on port {port}")

    def _popen_postgres(self, node: str, port: int, log) -> subprocess.Popen:
        return subprocess.Popen(
            [
                str(PG_BIN / "postgres"), "-D", str(self.data_dir(node)), "-p", str(port), "-k", str(self.directory),
                "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "shared_buffers=16MB",
                "-c", "max_connections=30", "-c", "wal_keep_size=64MB",
            ],
            cwd=self.directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            user=self.user.pw_uid, group=self.user.pw_gid,
        )  # fmt: skip

    def _ready(self, node: str) -> bool:
        if self.procs[node].poll() is not None:
            pytest.fail(f"PostgreSQL {node} exited with {self.procs[node].returncode} (log {self.directory}/pg-{node}.log)")
        result = subprocess.run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.ports[node])],
                                capture_output=True, timeout=10, check=False)  # fmt: skip
        return result.returncode == 0

    def start(self, database: str) -> None:
        """Primary a, a database on it, then standby b from a base backup of a."""
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data_dir("a")), "-U", "postgres", "--auth=trust", "--no-sync")
        self._start("a")
        with self.connect("a", "postgres") as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        self._run(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.ports["a"]), "-U", "postgres",
                  "-D", str(self.data_dir("b")), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast")  # fmt: skip
        self._start("b")

    def connect(self, node: str, database: str):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.ports[node], user="postgres", dbname=database,
                               autocommit=True, connect_timeout=3)  # fmt: skip

    def promote(self, node: str) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "promote", "-w", "-D", str(self.data_dir(node)))

    def kill(self, node: str) -> None:
        """SIGKILL the node's postmaster and every backend (its whole session): a host that died."""
        _kill_group(self.procs.pop(node, None))

    def stop(self) -> None:
        for node in list(self.procs):
            self.kill(node)
        shutil.rmtree(self.directory, ignore_errors=True)


def wait_until(predicate, *, timeout: float, what: str) -> float:
    """wait_for, returning the seconds it took."""
    started = time.monotonic()
    wait_for(predicate, timeout=timeout, interval=0.05, what=what)
    return time.monotonic() - started
