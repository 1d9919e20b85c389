"""``gpuportal status``, ``logs`` and ``cancel``: a job named by its id, a prefix of it or its Slurm id."""

from __future__ import annotations

import json
import re
import sys
import time
import uuid

from gpuportal_cli.account import _client
from gpuportal_cli.client import Client
from gpuportal_cli.exit_codes import EXIT_OK, EXIT_REFUSED, CliError
from gpuportal_cli.output import (
    TERMINAL_STATES,
    _err,
    _estimate_line,
    _exit_line,
    _json_or_empty,
    _money,
    _out,
    _reason_line,
    _start_cell,
    _start_line,
    _table,
    _team_label,
    _used_line,
    _when,
    is_terminal,
)


UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


def resolve_job_id(client: Client, ref: str) -> str:
    """A full job id, a unique prefix of one of your recent jobs' ids, or a Slurm job id."""
    ref = ref.strip()
    if UUID_RE.match(ref):
        return str(uuid.UUID(ref))
    if not ref:
        raise CliError("Give a job id.")
    matches = []
    for job in client.paginate("jobs/", limit=500):
        job_id = str(job.get("id", ""))
        if job_id.startswith(ref.lower()) or (ref.isdigit() and str(job.get("slurm_job_id") or "") == ref):
            matches.append(job_id)
    if not matches:
        raise CliError(f"No job of yours matches {ref!r} (give the id from `gpuportal status`).", EXIT_REFUSED)
    if len(set(matches)) > 1:
        raise CliError(f"{ref!r} matches several jobs: {', '.join(m[:13] for m in matches[:5])}…", EXIT_REFUSED)
    return matches[0]


def cmd_status(args) -> int:
    client = _client(args)
    if args.job:
        job = client.get(f"jobs/{resolve_job_id(client, args.job)}/")
        if args.json:
            _out(json.dumps(job, indent=2))
            return EXIT_OK
        fields = [
            ("Job", job.get("id")), ("Name", job.get("name")), ("Team", _team_label(job)),
            ("State", job.get("state")), ("Reason", _reason_line(job)), ("Start", _start_line(job)),
            ("Slurm job", job.get("slurm_job_id") or "—"), ("Exit code", _exit_line(job)),
            ("Partition", job.get("partition")),
            ("GPUs", f"{job.get('gpus')} x {job.get('gpu_type') or 'any'} on {job.get('nodes', 1)} node(s)"),
            ("Time limit", f"{job.get('time_limit_minutes')} min"), ("Estimate", _estimate_line(job)),
            ("Used", _used_line(job) or "nothing recorded yet"), ("Submitted", _when(job)),
        ]
        for label, value in fields:
            if value not in (None, ""):
                _out(f"{label + ':':<12} {value}")
        tasks = job.get("tasks") or []
        if tasks:
            rows = [[str(t.get("index")), t.get("state", ""), str(t.get("slurm_job_id") or "—"), _exit_line(t) or "—",
                     str(t.get("gpu_hours") if t.get("gpu_hours") is not None else "—"),
                     _money(t.get("cost"), job.get("currency", "")) if t.get("cost") is not None else "—"]
                    for t in tasks]  # fmt: skip
            _out("")
            _out(_table(rows, ["TASK", "STATE", "SLURM", "EXIT", "GPU-HOURS", "COST"]))
        return EXIT_OK
    params = {"team": args.team, "state": args.state}
    jobs = list(client.paginate("jobs/", params, limit=args.limit))
    if _json_or_empty(jobs, as_json=args.json, empty="No jobs yet. Submit one with `gpuportal submit SCRIPT --team TEAM`."):
        return EXIT_OK
    rows = [
        [
            str(j.get("id", ""))[:8], (j.get("name") or "")[:30], _team_label(j), j.get("state", ""),
            str(j.get("slurm_job_id") or "—"), f"{j.get('gpus', '')}{(' ' + j['gpu_type']) if j.get('gpu_type') else ''}",
            _when(j), _money(j.get("estimated_cost"), j.get("currency", "")),
            _money(j.get("cost"), j.get("currency", "")) + ("" if j.get("usage_final") or j.get("cost") is None else " so far"),
            _start_cell(j),
        ]
        for j in jobs
    ]
    _out(_table(rows, ["ID", "NAME", "TEAM", "STATE", "SLURM", "GPUS", "SUBMITTED", "ESTIMATE", "COST", "START"]))
    return EXIT_OK


def _drain_output(client: Client, job_id: str, stream: str, offset: int, length: int, shown: set[str]) -> tuple[int, bool]:
    """Print the stream from ``offset`` to its current end; return the new offset and whether the
    file is final (the job ended, it will not grow)."""
    while True:
        chunk = client.get(f"jobs/{job_id}/output/", {"stream": stream, "offset": offset, "length": length})
        data = chunk.get("data") or ""
        if data:
            sys.stdout.write(data)
            sys.stdout.flush()
        message = chunk.get("message") or ""  # why there is no data, or a note on it (a kept log cut short)
        if message and message not in shown:
            _err(message)
            shown.add(message)
        next_offset = chunk.get("next_offset")
        if next_offset is None:
            next_offset = offset + len(data.encode())
        progressed = next_offset > offset
        offset = next_offset
        if not progressed or chunk.get("eof", True):
            return offset, bool(chunk.get("final")) and bool(chunk.get("eof", True))


def cmd_logs(args) -> int:
    client = _client(args)
    job_id = resolve_job_id(client, args.job)
    stream = "stderr" if args.stderr else "stdout"
    shown: set[str] = set()
    offset, final = _drain_output(client, job_id, stream, 0, args.chunk, shown)
    if not args.follow or final:
        return EXIT_OK
    while True:
        time.sleep(args.poll_interval)
        job = client.get(f"jobs/{job_id}/")
        ended = is_terminal(job)  # read the state first: output written before the end is then read below
        offset, final = _drain_output(client, job_id, stream, offset, args.chunk, shown)
        if ended or final:
            _err(f"[job {job.get('state')}]")
            return EXIT_OK


def cmd_cancel(args) -> int:
    client = _client(args)
    job_id = resolve_job_id(client, args.job)
    job = client.post(f"jobs/{job_id}/cancel/")
    state = (job or {}).get("state", "")
    _out(f"Job {job_id} {'cancel requested' if state not in TERMINAL_STATES else state}" + (f" ({state})" if state and state not in TERMINAL_STATES else ""))
    return EXIT_OK
