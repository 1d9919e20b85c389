"""What the CLI backend (portal.slurm.cli) sends to Slurm's commands: argv lists (never a shell; every
value one element, checked for control characters) and the batch script with the job's environment.
Pure: unit-tested."""

from __future__ import annotations

import datetime as dt
import re
import shlex

from . import parsing
from .request import spec_options
from .types import JobSpec, SlurmRejected

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")


def check_text(value: str, what: str) -> str:
    """Reject control characters in single-line values (they would break output parsing)."""
    if _CONTROL_CHARS_RE.search(value):
        raise SlurmRejected(f"{what} must not contain control characters: {value!r}")
    return value


def render_script(script: str, environment: dict[str, str]) -> str:
    """The batch script with ``export NAME='value'`` lines for the job's environment.

    The job runs with ``--export=NONE`` (nothing of the portal's own environment leaks into it);
    variables are written into the script, quoted with ``shlex.quote`` after checking each name,
    right after the leading comment block (shebang and ``#SBATCH`` lines, which sbatch reads only
    before the first command). Only bash on the compute node ever interprets them."""
    if "\x00" in script:
        raise SlurmRejected("The batch script must not contain NUL characters")
    if not environment:
        return script
    lines = []
    for name in sorted(environment):
        if not _ENV_NAME_RE.match(name):
            raise SlurmRejected(f"Invalid environment variable name: {name!r}")
        value = environment[name]
        if "\x00" in value:
            raise SlurmRejected(f"Environment variable {name} must not contain NUL characters")
        lines.append(f"export {name}={shlex.quote(value)}")
    block = "# Environment set by gpuportal\n" + "\n".join(lines) + "\n"
    script_lines = script.splitlines(keepends=True)
    insert_at = 0
    for index, line in enumerate(script_lines):
        stripped = line.strip()
        if stripped == "" or stripped.startswith("#"):
            insert_at = index + 1
            continue
        break
    head = "".join(script_lines[:insert_at])
    if head and not head.endswith("\n"):
        head += "\n"
    return head + block + "".join(script_lines[insert_at:])


def sbatch_argv(spec: JobSpec, sbatch: str = "sbatch") -> list[str]:
    """sbatch's argv for a job spec (the script, from ``spec_script``, goes to stdin). Pure: unit-tested."""
    check_text(spec.name, "Job name")
    check_text(spec.comment, "Job comment")
    argv = [sbatch, "--parsable", "--export=NONE"]
    for option, value in spec_options(spec):
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
