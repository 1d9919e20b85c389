"""``gpuportal submit`` (the POST body from the script and the flags, batches of scripts, --wait) and
``gpuportal quote``."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gpuportal_cli.account import _client
from gpuportal_cli.client import ApiError, Client
from gpuportal_cli.exit_codes import EXIT_OK, CliError, exit_code_for_state
from gpuportal_cli.output import _err, _estimate_line, _money, _out, _state_line, is_terminal
from gpuportal_cli.sbatch import gpu_request, parse_memory_gb, parse_time_minutes
from gpuportal_sbatch.directives import DirectiveError, parse_directives, script_request


def _check_directives(script: str) -> dict:
    """The script's directives read as sbatch (and the server) reads them: a directive sbatch would
    refuse stops here, naming its line. Returns the last directive of each option. The CLI does not
    know the cluster's Slurm release: any release's options pass here (the server checks the release)."""
    try:
        directives = parse_directives(script)
        script_request(directives)  # values sbatch checks (times, counts, GPU forms, exclusive pairs)
        return {d.option: d for d in directives}
    except DirectiveError as exc:
        raise CliError(f"script: {exc}") from None


def build_submission(args, script: str, script_name: str) -> tuple[dict, list[str]]:
    """The POST body of a submission: the script (the server reads its #SBATCH lines) and the flags
    given, which override the script's directives as sbatch's command line does. The job is
    submitted from the directory the CLI runs in (``submit_dir``), as sbatch's own; a relative
    --chdir/-D (flag or directive) is resolved against it.
    Returns the body and notes for the user."""
    directives = _check_directives(script)
    notes: list[str] = []
    body: dict[str, Any] = {"team": args.team, "script": script}
    if args.name:
        body["name"] = args.name
    elif "job-name" not in directives:
        body["name"] = re.sub(r"[^A-Za-z0-9._-]+", "-", script_name).strip("-")[:128] or "sbatch"  # sbatch: the file name
    if args.partition:
        body["partition"] = args.partition
    if getattr(args, "cluster", None):
        body["cluster"] = args.cluster  # overrides the script's -M/--clusters, as sbatch's command line
    if args.nodes is not None:
        body["nodes"] = args.nodes
    gpu_type_flag = None
    if args.gpus is not None:
        type_from_gpus, count = gpu_request(args.gpus)
        body["gpus"] = count
        gpu_type_flag = type_from_gpus or None
    if args.gpu_type:
        gpu_type_flag = args.gpu_type
    if gpu_type_flag:
        body["gpu_type"] = gpu_type_flag
    if args.time:
        body["time_limit_minutes"] = parse_time_minutes(args.time)
    if args.cpus_per_gpu is not None:
        body["cpus_per_gpu"] = args.cpus_per_gpu
    if args.mem:
        body["memory_gb"] = parse_memory_gb(args.mem)
    # submitted from where the CLI runs, as sbatch: the job starts there (SLURM_SUBMIT_DIR) unless
    # --chdir says otherwise; a relative --chdir/-D (flag or directive) is resolved against it
    body["submit_dir"] = os.getcwd()
    if args.workdir:
        body["workdir"] = os.path.abspath(args.workdir)
    if getattr(args, "image", None):
        body["image"] = args.image  # Kubernetes only: the server checks it against the site's list
    if getattr(args, "after", None):
        body["depends_on"] = [job for item in args.after for job in re.split(r"[\s,]+", item) if job]
    if args.env:
        environment = {}
        for item in args.env:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise CliError(f"--env {item!r}: expected KEY=VALUE")
            environment[key] = value
        body["environment"] = environment
    if getattr(args, "idle_exempt", False):
        body["idle_exempt"] = True
    return body, notes


BATCH_MAX = 100  # jobs per POST of an array (the API's MAX_BATCH_JOBS)


def _read_script(path: str) -> tuple[str, str]:
    try:
        if path == "-":
            return sys.stdin.read(), "stdin"
        return Path(path).read_text(), Path(path).name
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


def cmd_submit(args) -> int:
    scripts = args.script
    if len(scripts) > 1 and "-" in scripts:
        raise CliError("'-' (standard input) cannot be one of several scripts")
    bodies = []
    for path in scripts:
        script, script_name = _read_script(path)
        try:
            body, notes = build_submission(args, script, script_name)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        prefix = f"{path}: " if len(scripts) > 1 else ""
        for note in notes:
            _err(f"warning: {prefix}{note}")
        bodies.append(body)
    client = _client(args)
    key = args.idempotency_key or str(uuid.uuid4())
    if len(bodies) == 1:
        jobs = [client.post("jobs/", bodies[0], idempotency_key=key)]
    else:
        # One POST of an array per BATCH_MAX scripts (all or none per POST; relayed together);
        # each POST its own key, derived from one, so a retry of the whole command replays them.
        jobs = []
        for index, start in enumerate(range(0, len(bodies), BATCH_MAX)):
            chunk_key = key if index == 0 else f"{key}.{index}"
            jobs += client.post("jobs/", bodies[start : start + BATCH_MAX], idempotency_key=chunk_key)
    if args.json and not args.wait:
        _out(json.dumps(jobs[0] if len(jobs) == 1 else jobs, indent=2))
        return EXIT_OK
    for job in jobs:
        estimate = _estimate_line(job)
        slurm = f", Slurm job {job['slurm_job_id']}" if job.get("slurm_job_id") else ""
        named = f" ({job.get('name')})" if len(jobs) > 1 else ""
        _out(f"Job {job['id']}{named} {job.get('state', 'ACCEPTED')}{slurm}" + (f" — estimated {estimate}" if estimate else ""))
    if not args.wait:
        return EXIT_OK
    finals = []
    for job in jobs:  # one after the other: a job that ended meanwhile answers at once
        finals.append(wait_for_job(client, job["id"], interval=args.poll_interval, first=job,
                                   label=f"{job['id'][:8]} " if len(jobs) > 1 else ""))  # fmt: skip
    if args.json:
        _out(json.dumps(finals[0] if len(finals) == 1 else finals, indent=2))
    # several jobs: the worst ending (SUBMIT_FAILED 3 > other end 2 > FAILED 1 > COMPLETED 0)
    return max(exit_code_for_state(final.get("state", "")) for final in finals)


def wait_for_job(client: Client, job_id: str, *, interval: float, first: dict | None = None, label: str = "") -> dict:
    """Poll until the job is terminal; print each change of state (or reason). Transient errors
    while polling are reported and polling goes on: the job runs whatever the network does."""
    last = None
    job = first
    while True:
        if job is not None:
            shown = (job.get("state"), job.get("state_reason"), job.get("slurm_job_id"))
            if shown != last:
                _out(label + _state_line(job))
                last = shown
            if is_terminal(job):
                return job
        time.sleep(interval)
        try:
            job = client.get(f"jobs/{job_id}/")
        except ApiError as exc:
            if exc.status and exc.status < 500:
                raise
            _err(f"warning: {exc.detail}; still waiting")
            job = None


def cmd_quote(args) -> int:
    client = _client(args)
    body: dict[str, Any] = {}
    if args.script:
        body["script"], _ = _read_script(args.script)
        _check_directives(body["script"])
    elif args.gpus is None:
        raise CliError("give --gpus, or a SCRIPT whose #SBATCH lines ask for GPUs")
    gpu_type = ""
    try:
        if args.time:
            body["time_limit_minutes"] = parse_time_minutes(args.time)
        if args.gpus is not None:
            gpu_type, body["gpus"] = gpu_request(args.gpus)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.gpu_type or gpu_type:
        body["gpu_type"] = args.gpu_type or gpu_type
    for key in ("partition", "cluster", "team", "nodes"):
        if getattr(args, key, None):
            body[key] = getattr(args, key)
    quote = client.post("jobs/quote/", body)
    if args.json:
        _out(json.dumps(quote, indent=2))
        return EXIT_OK
    _out(f"{quote.get('gpu_hours')} GPU-hours, {_money(quote.get('cost'), quote.get('currency', ''))}")
    for key, value in quote.items():
        if key not in ("gpu_hours", "cost", "currency") and value not in (None, "", [], {}):
            _out(f"  {key.replace('_', ' ')}: {value}")
    return EXIT_OK
