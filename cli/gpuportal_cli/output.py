"""What the CLI prints: stdout/stderr lines, tables, estimates, job states."""

from __future__ import annotations

import datetime as dt
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


PENDING_STATES = frozenset({"PENDING", "REQUEUED"})


def _api_time(value: Any) -> dt.datetime:
    """An API timestamp (ISO 8601 with its offset; "Z" for UTC, which Python 3.9 does not read)."""
    text = str(value)
    return dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


def _local_time(value: Any) -> str:
    """An API timestamp in this machine's local time, to the minute."""
    try:
        return _api_time(value).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return str(value)


def _passed(value: Any) -> bool:
    try:
        return _api_time(value) <= dt.datetime.now(dt.timezone.utc)
    except (ValueError, TypeError):
        return False


def _start_line(job: dict) -> str:
    """A pending job's outlook: "2026-12-06 14:05 (moved from 13:20), 2nd in line for a100 in gpu";
    "no estimate yet" when Slurm has none; "" for a job that is not pending."""
    if job.get("state") not in PENDING_STATES:
        return ""
    start = job.get("expected_start_at")
    line = _local_time(start) if start else "no estimate yet"
    if start and _passed(start):
        line = f"any moment now (planned for {line})"
    if start and job.get("expected_start_moved_from"):
        line += f" (moved from {_local_time(job['expected_start_moved_from'])})"
    if job.get("queue_position"):
        line += f"; #{job['queue_position']} in line for {job.get('gpu_type') or 'any GPU'} in {job.get('partition')}"
    return line


def _start_cell(job: dict) -> str:
    """The job list's START column: "2026-12-06 14:05 #2", "no estimate #2"; "" unless pending."""
    if job.get("state") not in PENDING_STATES:
        return ""
    start = _local_time(job["expected_start_at"]) if job.get("expected_start_at") else "no estimate"
    return f"{start} #{job['queue_position']}" if job.get("queue_position") else start


def _reason_line(job: dict) -> str:
    """Slurm's reason, in words with what to change where the portal knows the code."""
    reason = job.get("state_reason") or ""
    if reason in ("", "None") and not job.get("state_reason_text"):
        return ""
    text = job.get("state_reason_text") or ""
    advice = job.get("state_reason_advice") or ""
    return " ".join(part for part in (f"{reason}:" if text else reason, text, advice) if part)


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


def _exit_line(job: dict) -> str:
    """The exit code, and the signal that ended it where there was one, in the portal's words: "0,
    signal 9 (SIGKILL)" (sacct's "0:9"); "" while the API has none."""
    code, number = job.get("exit_code"), job.get("exit_signal")
    if code in (None, ""):
        return ""
    if not number:
        return str(code)
    return f"{code}, {job.get('exit_signal_text') or f'signal {number}'}"


def _state_line(job: dict) -> str:
    state = job.get("state", "?")
    extras = []
    if job.get("slurm_job_id"):
        extras.append(f"Slurm job {job['slurm_job_id']}")
    reason = job.get("state_reason") or ""
    if reason and reason not in ("None",):
        extras.append(reason)
    if state in TERMINAL_STATES and _exit_line(job):
        extras.append(f"exit code {_exit_line(job)}")
    return f"{time.strftime('%H:%M:%S')} {state}" + (f" ({'; '.join(extras)})" if extras else "")
