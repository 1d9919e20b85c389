"""What the CLI prints: stdout/stderr lines, tables, estimates, job states."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


TERMINAL_STATES = frozenset(
    {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE", "SUBMIT_FAILED", "LOST",
    }
)


def _out(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _json_or_empty(items: list, *, as_json: bool, empty: str) -> bool:
    """A listing's first step: ``items`` printed as JSON (``as_json``), or ``empty`` when there are
    none. True when that was the whole output (the caller prints its table otherwise)."""
    if as_json:
        _out(json.dumps(items, indent=2))
        return True
    if not items:
        _out(empty)
        return True
    return False


def is_terminal(job: dict) -> bool:
    for flag in ("is_terminal", "terminal", "ended"):
        if isinstance(job.get(flag), bool):
            return job[flag]
    return job.get("state") in TERMINAL_STATES


def _team_label(job: dict) -> str:
    team = job.get("team")
    if isinstance(team, dict):
        return team.get("slug") or team.get("name") or ""
    return str(team or "")


def _when(job: dict) -> str:
    for key in ("submitted_at", "created_at", "accepted_at"):
        value = job.get(key)
        if value:
            return str(value).replace("T", " ")[:16]
    return ""


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _money(value: Any, currency: str = "") -> str:
    if value in (None, ""):
        return "—"
    return f"{value} {currency}".strip()


def _estimate_line(job: dict) -> str:
    hours = job.get("estimated_gpu_hours", job.get("gpu_hours"))
    cost = job.get("estimated_cost", job.get("cost"))
    currency = job.get("currency", "")
    parts = []
    if hours not in (None, ""):
        parts.append(f"{hours} GPU-hours")
    if cost not in (None, ""):
        parts.append(_money(cost, currency))
    return ", ".join(parts)


def _used_line(job: dict) -> str:
    """What a job really used (from accounting), beside its estimate: "0.04 GPU-hours, 0.10 EUR"
    (+ " so far" while it runs); "" when nothing is recorded yet."""
    if job.get("gpu_seconds") is None:
        return ""
    line = f"{job.get('gpu_hours')} GPU-hours ({job['gpu_seconds']} GPU-s), {_money(job.get('cost'), job.get('currency', ''))}"
    return line + ("" if job.get("usage_final") else " so far")


def _state_line(job: dict) -> str:
    state = job.get("state", "?")
    extras = []
    if job.get("slurm_job_id"):
        extras.append(f"Slurm job {job['slurm_job_id']}")
    reason = job.get("state_reason") or ""
    if reason and reason not in ("None",):
        extras.append(reason)
    if state in TERMINAL_STATES and job.get("exit_code") not in (None, ""):
        extras.append(f"exit code {job['exit_code']}")
    return f"{time.strftime('%H:%M:%S')} {state}" + (f" ({'; '.join(extras)})" if extras else "")
