"""The machine the figures were measured on: cores, memory, CPU, OS, the versions of Slurm,
PostgreSQL, Redis, Python and Django, the commit, and the load average at the start."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess

from cluster import gateway
from environment import BENCH_BROKER_URL, ROOT


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
