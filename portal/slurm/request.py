"""The job request, built once (``job_request``): what every backend translates.

- ``command_line``: the options the portal sets on sbatch's command line (the given fields, the
  portal's output files, the account and the portal's tag), overriding the script's ``#SBATCH`` lines;
- ``script``: the script as Slurm gets it: the directives those options replace (the same option,
  or one Slurm holds mutually exclusive with it, e.g. a script's ``--cpus-per-task`` when the
  portal sets ``--cpus-per-gpu``) turned into comments, so sbatch never sees both;
- ``options``: every option Slurm will apply, in order (the script's remaining directives, then the
  command line): what a backend that does not read ``#SBATCH`` lines itself (pyslurm) submits.

A gateway talks to ONE cluster, through that cluster's own ``SLURM_CONF``: the options that choose a
cluster (``CLUSTER_OPTIONS``: a script's ``#SBATCH -M name`` / ``--clusters`` / ``--cluster``, which
the portal reads as the job's cluster before it picks the gateway) are never sent. Left in the
script, sbatch would ask slurmdbd where that cluster's controller is and submit there: a name
slurmdbd does not hold (another site's slurmdbd, or a portal name that is not Slurm's ClusterName)
is refused ("No cluster ... known by database"), and every submit would need slurmdbd up and take
longer (measured with ``-M`` naming the cluster itself, 20 submits each: 22.05 100 ms instead of
18 ms a submit, 25.11 11 ms instead of 7.6 ms). So they
are taken out of the script (its directive lines written again without them: a line left with
nothing is commented out like a replaced directive) and dropped from the options.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from gpuportal_sbatch.directives import (
    CLUSTER_OPTIONS,
    MAGIC_WORDS,
    Directive,
    DirectiveError,
    apply_overrides,
    directive_lines,
    disable_directives,
    parse_directives,
)

from .types import JobRequest, SlurmRejected


# The name Slurm gives a job whose request names none: sbatch's, for a script read from stdin
STDIN_JOB_NAME = "sbatch"


def job_request(
    *,
    script: str,
    command_line: Sequence[tuple[str, str | None]],
    workdir: str,
    submit_dir: str,
    directives: Sequence[Directive] | None = None,
    effective: Sequence[Directive] | None = None,
    submit_dir_default: bool = False,
    environment: Mapping[str, str] | None = None,
    gpus: int = 0,
    gpu_type: str = "",
    nodes: int = 1,
    time_limit_minutes: int = 0,
    array_tasks: int = 1,
    depends_on: Sequence[str] = (),
    image: str = "",
) -> JobRequest:
    """The one request for a job: the script's directives (``directives``: the parse the caller has;
    None: read now) merged with ``command_line`` as sbatch merges them (``effective``: that merge,
    ``merged_options``, when the caller made it). Options that choose a cluster are dropped from
    both (the module docstring)."""
    if directives is None:
        try:
            directives = parse_directives(script)
        except DirectiveError as exc:
            raise SlurmRejected(f"sbatch: error: {exc}") from None
    directives = list(directives)
    overrides = [Directive(option, value, 0, "") for option, value in command_line if option not in CLUSTER_OPTIONS]
    effective = merged_options(directives, command_line) if effective is None else list(effective)
    kept = {d.line for d in effective if d.line}
    sent = disable_directives(_without_cluster_options(script, directives), {d.line for d in directives} - kept)
    options = tuple((d.option, d.value) for d in effective)
    return JobRequest(
        script=sent, command_line=tuple((d.option, d.value) for d in overrides), options=options,
        lines=tuple(d.line for d in effective),
        name=next((value or "" for option, value in reversed(options) if option == "job-name"), STDIN_JOB_NAME),
        workdir=workdir, submit_dir=submit_dir, submit_dir_default=submit_dir_default,
        environment=tuple(sorted((environment or {}).items())), gpus=gpus, gpu_type=gpu_type, nodes=nodes,
        time_limit_minutes=time_limit_minutes, array_tasks=array_tasks, depends_on=tuple(depends_on),
        image=image,
    )  # fmt: skip


def merged_options(directives: Sequence[Directive], command_line: Sequence[tuple[str, str | None]],
                   *, relay_sets: Sequence[str] = ()) -> list[Directive]:  # fmt: skip
    """Every option Slurm applies, in order: the script's directives the command line does not
    replace, then the command line (line 0); never one that chooses a cluster. ``relay_sets``: options
    the relay adds when it sends the job (``--dependency``: its parents' Slurm ids are known only
    then, JobSubmission.dependency): they replace the script's directives too, but are not here."""
    overrides = [Directive(option, value, 0, "") for option, value in command_line]
    overrides += [Directive(option, None, 0, "") for option in relay_sets]
    return [d for d in apply_overrides(list(directives), overrides)
            if d.option not in CLUSTER_OPTIONS and (d.line or d.option not in relay_sets)]  # fmt: skip


def _without_cluster_options(script: str, directives: list[Directive]) -> str:
    """The script with no directive of CLUSTER_OPTIONS. In a script that has one, each directive line
    is written again with the other directives that start on it, each one quoted argv word
    (``--option=value``, as sbatch reads them back), so a value given on the next line goes too; a
    line that then holds none becomes a comment (disable_directives). Where a cluster option was,
    the line as written follows a ``#`` (which ends what sbatch reads). Line numbers stay."""
    cluster_lines = {d.line for d in directives if d.option in CLUSTER_OPTIONS}
    if not cluster_lines:
        return script
    starting: dict[int, list[Directive]] = {}
    for directive in directives:
        if directive.option not in CLUSTER_OPTIONS:
            starting.setdefault(directive.line, []).append(directive)
    out = script.split("\n")
    emptied = set()
    for number, body in directive_lines(script):
        if number not in starting:
            emptied.add(number)
            continue
        magic = next(m for m in MAGIC_WORDS if out[number - 1].startswith(m))
        words = " ".join(shlex.quote(d.as_arg()) for d in starting[number])
        note = f"  # [gpuportal: cluster option taken out] {body.strip()}" if number in cluster_lines else ""
        out[number - 1] = f"{magic} {words}{note}"
    return disable_directives("\n".join(out), emptied)
