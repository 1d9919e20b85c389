"""What the CLI backend (portal.slurm.cli) sends to Slurm's commands: argv lists (never a shell; every
value one element, checked for control characters), the batch script as written and the job's
environment the way sbatch takes it (``--export``/``--export-file``, never lines in the script).
Pure: unit-tested."""

from __future__ import annotations

import datetime as dt
import re

from . import parsing
from .types import JobRequest, JobSubmission, SlurmRejected

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")


def check_text(value: str, what: str) -> str:
    """Reject control characters in single-line values (they would break output parsing)."""
    if _CONTROL_CHARS_RE.search(value):
        raise SlurmRejected(f"{what} must not contain control characters: {value!r}")
    return value


def check_script(script: str) -> str:
    """The batch script as Slurm gets it: never edited (a ``#!/usr/bin/env python3`` script runs as
    written); NUL characters are refused (Slurm cuts the script there)."""
    if "\x00" in script:
        raise SlurmRejected("The batch script must not contain NUL characters")
    return script


def checked_variables(environment: dict[str, str]) -> dict[str, str]:
    """The job's own variables, checked: each name a shell name, no NUL in a value."""
    for name, value in environment.items():
        if not _ENV_NAME_RE.match(name):
            raise SlurmRejected(f"Invalid environment variable name: {name!r}")
        if "\x00" in value:
            raise SlurmRejected(f"Environment variable {name} must not contain NUL characters")
    return dict(environment)


# Inside the job, every ``srun`` step reads SLURM_EXPORT_ENV as its --export: the value sbatch
# leaves there from the portal's ``--export`` (NONE, or a list) would start each step with no PATH
# and no HOME. sbatch sets it only when it is not set already (src/sbatch/opt.c: setenv(..., 0)), and
# propagates every SLURM_* variable of its own environment: so sbatch runs with SLURM_EXPORT_ENV=ALL,
# sbatch's documented remedy, and steps inherit the job's environment as under ``--export=ALL``.
STEP_EXPORT = {"SLURM_EXPORT_ENV": "ALL"}


def job_process_environment(request: JobRequest, *, submit_dir: str) -> dict[str, str]:
    """The variables the job gets from its submission, as from sbatch run in ``submit_dir`` by a
    login shell: the job's own, PWD (the shell's directory: what a script that is not bash, which
    resets it, reads) and SLURM_JOB_NAME (sbatch leaves it out when it reads an export file)."""
    return checked_variables(request.variables) | {"PWD": submit_dir, "SLURM_JOB_NAME": request.name}


def export_argv(export_fd: int) -> list[str]:
    """sbatch's options for the job's environment: the variables of ``job_process_environment`` in
    ``--export-file`` (the file descriptor ``export_fd``, NUL-separated NAME=value: any character,
    never through root's sbatch's own environment, where LD_PRELOAD or SBATCH_* would act on sbatch,
    nor its argv, nor the script), and ``--export=SLURM_EXPORT_ENV``: a list, so that sbatch merges
    the file, the SLURM_* variables of its environment (STEP_EXPORT) and asks slurmd for the user's
    login environment beneath them (``su - user -c env`` on the node, as with ``--export=NONE``,
    which would discard the file)."""
    return [f"--export-file={int(export_fd)}", "--export=SLURM_EXPORT_ENV"]


def export_file_bytes(environment: dict[str, str]) -> bytes:
    """``--export-file``'s content: each NAME=value followed by a NUL (sbatch's env_array_from_file)."""
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in sorted(environment.items()))


def sbatch_argv(submission: JobSubmission, sbatch: str = "sbatch", *, export_fd: int = 3) -> list[str]:
    """sbatch's argv for a submission: its request's command line and the relay's options (the
    request's script goes to stdin; the job's variables in the file ``export_fd`` names, see
    export_argv). Pure: unit-tested."""
    check_text(submission.request.name, "Job name")
    # --ignore-pbs: sbatch would otherwise translate #PBS and #BSUB lines of the script (walltime,
    # priority, hold, …) that the portal never read (gpuportal_sbatch.directives reads only
    # #SBATCH/#SLURM, as slurmctld's own descriptor paths do): Slurm gets exactly what was validated.
    argv = [sbatch, "--parsable", "--ignore-pbs", *export_argv(export_fd)]
    for option, value in submission.command_line:
        if value is None:
            argv.append(f"--{option}")
        else:
            argv.append(f"--{option}={check_text(value, f'--{option}')}")
    return argv


def sreport_argv(start: dt.datetime, end: dt.datetime, *, cluster: str = "", sreport: str = "sreport") -> list[str]:
    """sreport's GPU-minutes per account and user in [start, end), times in UTC (the gateway runs
    every command with TZ=UTC: sreport reads Start=/End= in that zone)."""
    argv = [
        sreport, "-n", "-P", "cluster", "AccountUtilizationByUser",
        f"Start={parsing.format_time(start)}", f"End={parsing.format_time(end)}", "-T", "gres/gpu", "-t", "Minutes",
    ]  # fmt: skip
    if cluster:
        argv.append(f"Clusters={cluster}")
    return argv


def sreport_utilization_argv(start: dt.datetime, end: dt.datetime, *, cluster: str = "", sreport: str = "sreport") -> list[str]:
    """sreport's cluster Utilization in [start, end), times in UTC: one row per cluster once slurmdbd has
    rolled up any hour of the range, none before (the gateway's ``usage_rolled_up``)."""
    argv = [
        sreport, "-n", "-P", "cluster", "Utilization",
        f"Start={parsing.format_time(start)}", f"End={parsing.format_time(end)}", "-t", "Seconds",
        "format=Cluster,Reported",
    ]  # fmt: skip
    if cluster:
        argv.append(f"Clusters={cluster}")
    return argv
