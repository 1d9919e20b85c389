"""Issue 30, finding 4: a job runs as its user on a compute node, which in the demo is this host; it
must not reach the portal's Redis or PostgreSQL. ``scripts/services up`` is run against a Redis and a
PostgreSQL cluster of this test's own, on other ports, both left open the way the machine's were
found (Redis without a password, pg_hba.conf "trust"): afterwards neither lets anyone in without
the password, the passwords are generated once (a second ``up`` prints the same URLs), and the
printed URLs work. The machine's own services (5432, 6379) are never touched."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import skip_unless_ci
from tests.workers import ROOT

pytestmark = pytest.mark.external


def _free_port() -> int:
    """A port nothing listens on now, as the kernel picks one: not the machine's services' (a port
    computed from the pid, 5400 + pid % 90, was 5432 for pid 7232, and that CI run's PostgreSQL
    cluster of this test could not start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


PG_PORT = _free_port()
REDIS_PORT = next(port for port in iter(_free_port, None) if port != PG_PORT)


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture
def open_services(tmp_path):
    """A Redis without a password and a PostgreSQL cluster trusting every login, on ports of this test's own."""
    if os.geteuid() != 0 or not shutil.which("redis-server") or not shutil.which("pg_createcluster"):
        skip_unless_ci("needs root, redis-server and Debian's postgresql (scripts/services installs them)")
    version = sorted(os.listdir("/usr/lib/postgresql"), key=lambda v: [int(p) for p in v.split(".")])[-1]
    name = f"gpuportal-test-{os.getpid()}"
    redis_pid = tmp_path / "open-redis.pid"
    run(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--daemonize", "yes", "--pidfile", str(redis_pid), "--dir", str(tmp_path)], check=True)  # fmt: skip
    created = run(["pg_createcluster", "--port", str(PG_PORT), version, name, "--", "--auth-local=trust", "--auth-host=trust"])
    assert created.returncode == 0, created.stderr
    try:
        run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"], check=True)
        yield {"version": version, "name": name}
    finally:
        run(["pg_dropcluster", "--stop", version, name])
        for _ in range(50):
            if redis_pid.exists():
                pid = int(redis_pid.read_text())
                try:
                    os.kill(pid, 15)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                break
        started = tmp_path / "run" / "pid" / "redis.pid"  # one scripts/services started, if it did
        if started.exists():
            try:
                os.kill(int(started.read_text()), 15)
            except ProcessLookupError:
                pass


def services_up(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL")}
    env |= {
        "GPUPORTAL_PG_PORT": str(PG_PORT), "CELERY_BROKER_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
        "GPUPORTAL_RUN_DIR": str(tmp_path / "run"), "GPUPORTAL_SECRETS_DIR": str(tmp_path / "secrets"),
    }  # fmt: skip
    done = run([str(ROOT / "scripts" / "services"), "up"], env=env)
    assert done.returncode == 0, done.stderr
    return dict(re.findall(r"^export (\w+)=(\S+)$", done.stdout, re.M))


def psql(*args: str, password: str = "", user: str = "gpuportal") -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSWORD": password}
    return run(["psql", "-w", "-X", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", user, "-d", "gpuportal" if user == "gpuportal" else "postgres",
                "-Atc", "select current_user", *args], env=env)  # fmt: skip


def redis_cli(*args: str, password: str = "") -> str:
    env = {**os.environ, "REDISCLI_AUTH": password} if password else {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
    return run(["redis-cli", "-h", "127.0.0.1", "-p", str(REDIS_PORT), "--no-auth-warning", *args], env=env).stdout.strip()


def test_services_up_closes_open_services_and_prints_urls_with_their_passwords(open_services, tmp_path):
    assert redis_cli("ping") == "PONG" and psql(user="postgres").returncode == 0  # open, as found

    urls = services_up(tmp_path)
    assert set(urls) == {"DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL"}
    pg_password = (tmp_path / "secrets" / "postgres-password").read_text()
    redis_password = (tmp_path / "secrets" / "redis-password").read_text()
    assert len(pg_password) >= 32 and len(redis_password) >= 32 and pg_password != redis_password
    assert urls["DATABASE_URL"] == f"postgres://gpuportal:{pg_password}@127.0.0.1:{PG_PORT}/gpuportal"
    assert urls["CELERY_BROKER_URL"] == f"redis://:{redis_password}@127.0.0.1:{REDIS_PORT}/0"
    assert urls["CACHE_URL"] == f"redis://:{redis_password}@127.0.0.1:{REDIS_PORT}/1"
    assert oct((tmp_path / "secrets").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "secrets" / "redis-password").stat().st_mode & 0o777) == "0o600"

    # Redis: nothing without the password
    assert redis_cli("ping").startswith("NOAUTH") and redis_cli("get", "x").startswith("NOAUTH")
    assert redis_cli("ping", password=redis_password) == "PONG"
    # PostgreSQL: the portal's role and the superuser need a password over TCP; the portal's works (scram)
    assert psql().returncode != 0 and psql(user="postgres").returncode != 0
    assert psql(password="gpuportal").returncode != 0  # the old fixed password is gone
    assert psql(password=pg_password).stdout.strip() == "gpuportal"
    stored = run(["runuser", "-u", "postgres", "--", "psql", "-X", "-p", str(PG_PORT), "-Atc",
                  "select rolpassword from pg_authid where rolname = 'gpuportal'"])  # fmt: skip
    assert stored.stdout.startswith("SCRAM-SHA-256$"), stored
    # a job's user on this host cannot log in over the socket as the portal's role either
    socket = run(["runuser", "-u", "nobody", "--", "psql", "-w", "-X", "-p", str(PG_PORT), "-U", "gpuportal", "-d", "gpuportal", "-Atc", "select 1"])
    assert socket.returncode != 0

    # generated once: a second run prints the same URLs, and they still work
    assert services_up(tmp_path) == urls
    assert redis_cli("ping", password=redis_password) == "PONG" and psql(password=pg_password).returncode == 0
    hba = Path(run(["runuser", "-u", "postgres", "--", "psql", "-X", "-p", str(PG_PORT), "-Atc", "show hba_file"]).stdout.strip())
    assert hba.read_text().count("# BEGIN gpuportal") == 1


def test_services_up_starts_a_missing_redis_with_its_password(open_services, tmp_path):
    redis_cli("shutdown", "nosave")  # nothing answers: scripts/services starts its own
    urls = services_up(tmp_path)
    password = (tmp_path / "secrets" / "redis-password").read_text()
    assert urls["CELERY_BROKER_URL"] == f"redis://:{password}@127.0.0.1:{REDIS_PORT}/0"
    assert redis_cli("ping").startswith("NOAUTH") and redis_cli("ping", password=password) == "PONG"
    started = tmp_path / "run" / "pid" / "redis.pid"
    cmdline = Path(f"/proc/{int(started.read_text())}/cmdline").read_bytes()
    assert password.encode() not in cmdline  # argv is readable by every user of the host: the password is in a 0600 file
