"""``gpuportal``: submit and follow GPU jobs through the portal's REST API from a shell.

Talks HTTP only (``/api/v1/``, ``Authorization: Token …``) and uses the standard library only, so it
runs anywhere Python 3.9 does. ``python -m gpuportal_cli`` works as well as the console script."""

from __future__ import annotations

import argparse
import os
import sys

from gpuportal_cli import config as config_mod
from gpuportal_cli.account import _client, cmd_login, cmd_teams
from gpuportal_cli.client import ApiError
from gpuportal_cli.exit_codes import (
    EXIT_AUTH,
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_JOB_ENDED_OTHERWISE,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_SUBMIT_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    exit_code_for_api_error,
    exit_code_for_state,
)
from gpuportal_cli.jobs import UUID_RE, _drain_output, cmd_cancel, cmd_logs, cmd_status, resolve_job_id
from gpuportal_cli.output import (
    TERMINAL_STATES,
    _err,
    _estimate_line,
    _money,
    _out,
    _state_line,
    _table,
    _team_label,
    _when,
    is_terminal,
)
from gpuportal_cli.submit import (
    BATCH_MAX,
    _check_directives,
    _read_script,
    build_submission,
    cmd_quote,
    cmd_submit,
    wait_for_job,
)

# The commands live in their modules (account, submit, jobs); their names stay importable from here.
__all__ = [
    "BATCH_MAX", "CliError", "EXIT_AUTH", "EXIT_CODES_HELP", "EXIT_INTERRUPTED",
    "EXIT_JOB_ENDED_OTHERWISE", "EXIT_JOB_FAILED", "EXIT_OK", "EXIT_REFUSED", "EXIT_SUBMIT_FAILED",
    "EXIT_UNAVAILABLE", "EXIT_USAGE", "TERMINAL_STATES", "UUID_RE", "_check_directives", "_client",
    "_drain_output", "_err", "_estimate_line", "_money", "_out", "_read_script", "_state_line", "_table",
    "_team_label", "_when", "build_submission", "cmd_cancel", "cmd_login", "cmd_logs", "cmd_quote",
    "cmd_status", "cmd_submit", "cmd_teams", "exit_code_for_api_error", "exit_code_for_state",
    "is_terminal", "resolve_job_id", "wait_for_job", "build_parser", "main",
]  # fmt: skip


CLUSTER_HELP = ("the cluster to run on, one of those the portal serves (as sbatch -M; default: the script's "
                "-M/--clusters, else the partition's cluster)")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage; 2 means "job cancelled" here, so usage errors exit 64."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


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
    p.add_argument("--cluster", "--clusters", "-M", metavar="NAME", help=CLUSTER_HELP)
    p.add_argument("--nodes", "-N", type=int)
    p.add_argument("--name", "-J", help="job name (default: the script's -J, else its file name)")
    p.add_argument("--cpus-per-gpu", type=int)
    p.add_argument("--mem", metavar="SIZE", help="memory per node, e.g. 32G (a bare number is MiB)")
    p.add_argument("--workdir", "-D", help="working directory on the cluster")
    p.add_argument("--image", help="Kubernetes clusters: the container image, one the site allows (default: the site's)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable (repeatable)")
    p.add_argument("--after", action="append", metavar="JOB", help="start only once this portal job has completed "
                   "successfully (repeatable, or JOB,JOB; sent to Slurm as --dependency=afterok)")  # fmt: skip
    p.add_argument("--idle-exempt", action="store_true",
                   help="exempt from the team's idle-GPU policy (a debugger session: never cancelled for idle GPUs; the team's managers see it)")
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
    p.add_argument("--cluster", "--clusters", "-M", metavar="NAME", help=CLUSTER_HELP)
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
