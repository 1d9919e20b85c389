"""``gpuportal``: submit and follow GPU jobs through the portal's REST API from a shell.

Talks HTTP only (``/api/v1/``, ``Authorization: Token …``) and uses the standard library only, so it
runs anywhere Python 3.9 does. ``python -m gpuportal_cli`` works as well as the console script."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gpuportal_cli import config as config_mod
from gpuportal_cli.client import ApiError, Client
from gpuportal_cli.sbatch import gpu_request, parse_memory_gb, parse_time_minutes
from gpuportal_cli.sbatch_directives import DirectiveError, parse_directives, script_request

# Exit codes (documented in --help; keep EXIT_CODES_HELP in step).
EXIT_OK = 0
EXIT_JOB_FAILED = 1  # --wait: the job ended FAILED (non-zero exit code)
EXIT_JOB_ENDED_OTHERWISE = 2  # --wait: CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, …
EXIT_SUBMIT_FAILED = 3  # --wait: Slurm refused the job (SUBMIT_FAILED)
EXIT_USAGE = 64  # bad arguments or an unreadable script
EXIT_REFUSED = 65  # the portal refused the request (400, 404, 409, …)
EXIT_UNAVAILABLE = 69  # the portal could not be reached, failed (5xx) or did not answer as the API (not JSON, a redirect)
EXIT_AUTH = 77  # not logged in, invalid or revoked token, or not allowed (401/403)
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\
exit codes:
  0    success; with --wait: the job COMPLETED
  1    with --wait: the job FAILED
  2    with --wait: the job ended otherwise (CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...)
  3    with --wait: Slurm refused the job (SUBMIT_FAILED)
  64   bad arguments or an unreadable script
  65   the portal refused the request (invalid input, not found, conflict); field errors are printed
  69   the portal could not be reached, had an internal error, or did not answer as its API does
       (not JSON, a redirect that is not followed)
  77   not logged in, token invalid or revoked, or permission denied
  130  interrupted (a job you were waiting for keeps running)

environment:
  GPUPORTAL_URL, GPUPORTAL_TOKEN override the stored login
  XDG_CONFIG_HOME  the login is kept in $XDG_CONFIG_HOME/gpuportal/config.json (default ~/.config)
"""

TERMINAL_STATES = frozenset(
    {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE", "SUBMIT_FAILED", "LOST",
    }
)
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage; 2 means "job cancelled" here, so usage errors exit 64."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# ---------------------------------------------------------------- helpers


def _out(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _client(args) -> Client:
    try:
        cfg = config_mod.load()
    except config_mod.ConfigError as exc:
        raise CliError(str(exc)) from None
    if not cfg.url or not cfg.token:
        raise CliError("Not logged in: run `gpuportal login` (or set GPUPORTAL_URL and GPUPORTAL_TOKEN).", EXIT_AUTH)
    return Client(cfg.url, cfg.token, timeout=args.timeout)


def exit_code_for_api_error(error: ApiError) -> int:
    if not error.from_api or error.status == 0 or error.status >= 500:
        return EXIT_UNAVAILABLE
    if error.status in (401, 403):
        return EXIT_AUTH
    return EXIT_REFUSED


def exit_code_for_state(state: str) -> int:
    if state == "COMPLETED":
        return EXIT_OK
    if state == "FAILED":
        return EXIT_JOB_FAILED
    if state == "SUBMIT_FAILED":
        return EXIT_SUBMIT_FAILED
    return EXIT_JOB_ENDED_OTHERWISE


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


# ---------------------------------------------------------------- login / teams


def cmd_login(args) -> int:
    stored = config_mod.load()
    url = args.url or stored.url
    if not url:
        url = input("Portal URL (e.g. https://gpu.example.org): ").strip()
    url = config_mod.normalise_url(url)
    if not url:
        raise CliError("A portal URL is needed.")
    token = args.token
    if not token:
        _err(f"Create a token at {url}/account/tokens/ and paste it here.")
        token = getpass.getpass("API token: ").strip()
    if not token:
        raise CliError("A token is needed.")
    client = Client(url, token, timeout=args.timeout)
    try:
        page = client.get("teams/")
    except ApiError as exc:
        if exc.status in (401, 403):
            raise CliError(f"The portal at {url} refused this token: {exc.detail}", EXIT_AUTH) from None
        raise
    path = config_mod.save(config_mod.Config(url=url, token=token))
    teams = [t.get("slug", "") for t in (page.get("results", []) if isinstance(page, dict) else page)]
    _out(f"Logged in to {url}; saved in {path}.")
    _out(f"Your teams: {', '.join(teams)}" if teams else "You are in no team yet: ask a team manager to add you.")
    return EXIT_OK


def cmd_teams(args) -> int:
    client = _client(args)
    teams = list(client.paginate("teams/"))
    if args.json:
        _out(json.dumps(teams, indent=2))
        return EXIT_OK
    if not teams:
        _out("You are in no team yet: ask a team manager to add you.")
        return EXIT_OK
    rows = [[t.get("slug", ""), t.get("name", ""), t.get("slurm_account", ""), t.get("role") or "", "yes" if t.get("active", True) else "no"] for t in teams]
    _out(_table(rows, ["TEAM", "NAME", "SLURM ACCOUNT", "ROLE", "ACTIVE"]))
    return EXIT_OK


# ---------------------------------------------------------------- submit


def _check_directives(script: str) -> dict:
    """The script's directives read as sbatch (and the server) reads them: a directive sbatch would
    refuse stops here, naming its line. Returns the last directive of each option."""
    try:
        directives = parse_directives(script)
        script_request(directives)  # values sbatch checks (times, counts, GPU forms, exclusive pairs)
        return {d.option: d for d in directives}
    except DirectiveError as exc:
        raise CliError(f"script: {exc}") from None


def build_submission(args, script: str, script_name: str) -> tuple[dict, list[str]]:
    """The POST body of a submission: the script (the server reads its #SBATCH lines) and the flags
    given, which override the script's directives as sbatch's command line does. A relative
    --chdir/-D (flag or directive) is resolved against the directory the CLI runs in.
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
    workdir = args.workdir or (directives["chdir"].value if "chdir" in directives else None)
    if workdir:
        body["workdir"] = os.path.abspath(workdir)  # relative: against where the CLI runs, as sbatch
    if args.env:
        environment = {}
        for item in args.env:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise CliError(f"--env {item!r}: expected KEY=VALUE")
            environment[key] = value
        body["environment"] = environment
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


# ---------------------------------------------------------------- status / logs / cancel / quote


def cmd_status(args) -> int:
    client = _client(args)
    if args.job:
        job = client.get(f"jobs/{resolve_job_id(client, args.job)}/")
        if args.json:
            _out(json.dumps(job, indent=2))
            return EXIT_OK
        fields = [
            ("Job", job.get("id")), ("Name", job.get("name")), ("Team", _team_label(job)),
            ("State", job.get("state")), ("Reason", job.get("state_reason") or ""),
            ("Slurm job", job.get("slurm_job_id") or "—"), ("Exit code", job.get("exit_code", "")),
            ("Partition", job.get("partition")),
            ("GPUs", f"{job.get('gpus')} x {job.get('gpu_type') or 'any'} on {job.get('nodes', 1)} node(s)"),
            ("Time limit", f"{job.get('time_limit_minutes')} min"), ("Estimate", _estimate_line(job)),
            ("Submitted", _when(job)),
        ]
        for label, value in fields:
            if value not in (None, ""):
                _out(f"{label + ':':<12} {value}")
        return EXIT_OK
    params = {"team": args.team, "state": args.state}
    jobs = list(client.paginate("jobs/", params, limit=args.limit))
    if args.json:
        _out(json.dumps(jobs, indent=2))
        return EXIT_OK
    if not jobs:
        _out("No jobs yet. Submit one with `gpuportal submit SCRIPT --team TEAM`.")
        return EXIT_OK
    rows = [
        [
            str(j.get("id", ""))[:8], (j.get("name") or "")[:30], _team_label(j), j.get("state", ""),
            str(j.get("slurm_job_id") or "—"), f"{j.get('gpus', '')}{(' ' + j['gpu_type']) if j.get('gpu_type') else ''}",
            _when(j),
        ]
        for j in jobs
    ]
    _out(_table(rows, ["ID", "NAME", "TEAM", "STATE", "SLURM", "GPUS", "SUBMITTED"]))
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
        message = chunk.get("message") or ""
        if message and not data and message not in shown:
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
    for key in ("partition", "team", "nodes"):
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


# ---------------------------------------------------------------- argument parsing


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuportal",
        description="Submit and follow GPU jobs on the cluster through gpuportal.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request (default 30)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name: str, help_text: str, func, **kwargs) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        p.set_defaults(func=func)
        return p

    p = add("login", "Store the portal URL and your API token (asks for what is missing).", cmd_login)
    p.add_argument("--url", help="the portal's address, e.g. https://gpu.example.org")
    p.add_argument("--token", help="an API token from the portal's 'API tokens' page (asked for if omitted)")

    p = add("teams", "List the teams you can see and your role in each.", cmd_teams)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = add(
        "submit",
        "Submit a batch script. The portal reads its #SBATCH lines as sbatch does (every sbatch option; "
        "the estimate covers what Slurm allocates: tasks, --exclusive, --array); the options below override "
        "them, as sbatch's command line does.",
        cmd_submit,
    )
    p.add_argument(
        "script", metavar="SCRIPT", nargs="+",
        help="the batch script ('-' reads standard input); several scripts are sent together in one request "
        "(all or none, the options apply to each)",
    )  # fmt: skip
    p.add_argument("--team", required=True, help="team slug (its Slurm account is charged)")
    p.add_argument("--gpus", metavar="[TYPE:]N", help="GPUs for the whole job, e.g. 2 or a100:2")
    p.add_argument("--gpu-type", help="GPU type, e.g. a100 (default: any)")
    p.add_argument("--time", metavar="LIMIT", help="time limit: 90 (minutes), 90m, 2h, 1:30:00, 2-00:00:00")
    p.add_argument("--partition", "-p")
    p.add_argument("--nodes", "-N", type=int)
    p.add_argument("--name", "-J", help="job name (default: the script's -J, else its file name)")
    p.add_argument("--cpus-per-gpu", type=int)
    p.add_argument("--mem", metavar="SIZE", help="memory per node, e.g. 32G (a bare number is MiB)")
    p.add_argument("--workdir", "-D", help="working directory on the cluster")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait until the job ends (with several scripts: all of them); the exit code tells how it ended (several: the worst)")
    p.add_argument("--poll-interval", type=float, default=3.0, help="seconds between polls with --wait (default 3)")
    p.add_argument(
        "--idempotency-key",
        help="key that makes a repeated submission return the first job (default: a fresh random key, "
        "reused for retries of this one request)",
    )
    p.add_argument("--json", action="store_true", help="print the job as JSON")

    p = add("status", "Your recent jobs as a table, or one job in detail.", cmd_status)
    p.add_argument("job", nargs="?", metavar="JOB", help="job id, a unique prefix of one, or a Slurm job id")
    p.add_argument("--team", help="only this team's jobs")
    p.add_argument("--state", help="only jobs in this state, e.g. RUNNING")
    p.add_argument("--limit", type=int, default=20, help="how many jobs to list (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = add("logs", "Print a job's output; --follow keeps printing until the job ends.", cmd_logs)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--stderr", action="store_true", help="standard error instead of standard output")
    p.add_argument("--follow", "-f", action="store_true", help="keep reading until the job ends")
    p.add_argument("--poll-interval", type=float, default=2.0, help="seconds between reads with --follow")
    p.add_argument("--chunk", type=int, default=65536, help=argparse.SUPPRESS)

    p = add("cancel", "Cancel a job.", cmd_cancel)
    p.add_argument("job", metavar="JOB")

    p = add("quote", "Estimate what a job would cost (the figure the portal holds against the budget).", cmd_quote)
    p.add_argument("script", nargs="?", metavar="SCRIPT", help="a batch script: its #SBATCH lines count, the options override them")
    p.add_argument("--gpus", metavar="[TYPE:]N")
    p.add_argument("--time", metavar="LIMIT", help="default: the script's --time, else the partition's default")
    p.add_argument("--gpu-type")
    p.add_argument("--partition", "-p")
    p.add_argument("--nodes", "-N", type=int)
    p.add_argument("--team")
    p.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        _err(f"gpuportal: {exc}")
        return exc.code
    except ApiError as exc:
        lines = exc.lines()
        _err(f"gpuportal: {lines[0]}")
        for line in lines[1:]:
            _err(line)
        return exit_code_for_api_error(exc)
    except config_mod.ConfigError as exc:
        _err(f"gpuportal: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("\ninterrupted" + (" (the job keeps running; see `gpuportal status`)" if getattr(args, "wait", False) or getattr(args, "follow", False) else ""))
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
