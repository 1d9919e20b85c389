"""Where the machine's CPU went during a benchmark part: CPU seconds by process group, read from
/proc/<pid>/stat (utime + stime, and cutime + cstime for the children a process reaped — the sbatch
calls of the relay land on the Celery worker, the raw loop's on the bench process).

    snap = cpu.snapshot(); ...work...; spent = cpu.since(snap)   # {"web": 3.2, "postgres": 2.1, …}

A process that started and ended inside the window and whose parent is outside every group is
missed; the groups below cover what the portal, its services and the cluster run."""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")

# first match wins: (group, words any of which in the command line puts a process in it)
GROUPS = (
    ("web", ("gunicorn",)),
    ("celery worker", ("celery -A portal.project worker", "celery worker", " worker ")),
    ("celery beat", ("beat",)),
    ("postgres", ("postgres",)),
    ("redis", ("redis-server",)),
    ("slurmctld", ("slurmctld",)),
    ("slurmdbd", ("slurmdbd",)),
    ("slurmd", ("slurmd", "slurmstepd")),
    ("mariadb", ("mariadbd", "mysqld")),
    ("munged", ("munged",)),
)


def _group(pid: int) -> str | None:
    if pid == os.getpid():
        return "bench client (this process)"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    for name, words in GROUPS:
        if any(word in cmdline for word in words):
            return name
    return None


def _ticks(pid: int) -> tuple[int, int] | None:
    """(own, reaped children) clock ticks of a process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the ")": state is field 3 of stat(5), so utime (14) is index 11 here
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return utime + stime, cutime + cstime


def snapshot() -> dict[int, tuple[str, int, int]]:
    """pid -> (group, own ticks, reaped children's ticks) for every process in a group."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        group = _group(pid)
        if group is None:
            continue
        ticks = _ticks(pid)
        if ticks is not None:
            out[pid] = (group, *ticks)
    return out


def since(before: dict[int, tuple[str, int, int]]) -> dict[str, float]:
    """CPU seconds by group since ``before`` (processes started meanwhile count whole; ones that
    ended meanwhile count up to ``before``, so nothing is counted twice)."""
    after = snapshot()
    spent: dict[str, float] = {}
    for pid, (group, own, children) in after.items():
        _, own0, children0 = before.get(pid, (group, 0, 0))
        if (own, children) < (own0, children0):  # pid reused
            own0 = children0 = 0
        spent[group] = spent.get(group, 0.0) + (own - own0 + children - children0) / _TICK
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def describe(spent: dict[str, float], jobs: int, wall: float) -> str:
    """'web 3.20 s (6.4 ms/job), postgres …; total 9.1 s of 2 cores × 5.0 s' for a note."""
    total = sum(spent.values())
    parts = ", ".join(f"{name} {seconds:.2f} s ({seconds / jobs * 1000:.1f} ms/job)" for name, seconds in spent.items() if seconds >= 0.01)
    cores = os.cpu_count() or 1
    return f"{parts}; total {total:.2f} s ({total / jobs * 1000:.1f} ms/job) of {cores} cores × {wall:.1f} s wall"
