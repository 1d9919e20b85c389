"""What a JobSpec asks Slurm for, the same for every backend.

- ``spec_options``: the options the portal sets on the command line (overrides of the script's
  ``#SBATCH`` lines, plus those only the portal sets: account, comment, reservation, uid, gid);
- ``spec_script``: the script as Slurm gets it: the directives those options replace (the same
  option, or one Slurm holds mutually exclusive with it, e.g. a script's ``--cpus-per-task`` when the
  portal sets ``--cpus-per-gpu``) turned into comments, so sbatch never sees both; the job's
  environment as ``export`` lines after the directive block;
- ``spec_request``: every option Slurm will apply, in order (the script's remaining directives, then
  the command line): what a backend that does not read ``#SBATCH`` lines itself (pyslurm) submits.

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

from .types import JobSpec, SlurmRejected


def _typed_options(spec: JobSpec) -> list[tuple[str, str | None]]:
    """The options of a spec given as typed fields (GPUs as a total: per node as --gres)."""
    if spec.nodes < 1:
        raise SlurmRejected(f"nodes must be at least 1, got {spec.nodes}")
    if spec.gpus < 0:
        raise SlurmRejected(f"gpus must not be negative, got {spec.gpus}")
    if spec.gpus % spec.nodes:
        raise SlurmRejected(f"{spec.gpus} GPUs cannot be spread evenly over {spec.nodes} nodes")
    options: list[tuple[str, str | None]] = [
        ("job-name", spec.name), ("partition", spec.partition), ("nodes", str(spec.nodes)), ("chdir", spec.workdir),
    ]  # fmt: skip
    if spec.gpus:
        per_node = spec.gpus // spec.nodes
        options.append(("gres", f"gpu:{spec.gpu_type}:{per_node}" if spec.gpu_type else f"gpu:{per_node}"))
        options.append(("cpus-per-gpu", str(spec.cpus_per_gpu)))
    if spec.memory_mb is not None:
        options.append(("mem", str(int(spec.memory_mb))))
    if spec.time_limit_minutes is not None:
        options.append(("time", str(int(spec.time_limit_minutes))))
    if spec.stdout:
        options.append(("output", spec.stdout))
    if spec.stderr:
        options.append(("error", spec.stderr))
    return options


def spec_options(spec: JobSpec) -> list[tuple[str, str | None]]:
    """The command-line options for a spec, in order (portal-only options last); never one that
    chooses a cluster (the gateway's cluster is the job's)."""
    options = list(spec.options) if spec.options is not None else _typed_options(spec)
    options = [(option, value) for option, value in options if option not in CLUSTER_OPTIONS]
    options.append(("account", spec.account))
    if spec.comment:
        options.append(("comment", spec.comment))
    if spec.reservation:
        options.append(("reservation", spec.reservation))
    if spec.uid is not None:
        options.append(("uid", str(int(spec.uid))))
    if spec.gid is not None:
        options.append(("gid", str(int(spec.gid))))
    return options


def _directives(spec: JobSpec) -> list[Directive]:
    """The script's directives: as the portal read them at submission (``spec.directives``), else read now."""
    if spec.directives is not None:
        return [Directive(*directive) for directive in spec.directives]
    try:
        return parse_directives(spec.script)
    except DirectiveError as exc:
        raise SlurmRejected(f"sbatch: error: {exc}") from None


def _overrides(spec: JobSpec) -> list[Directive]:
    return [Directive(option, value, 0, "") for option, value in spec_options(spec)]


def spec_script(spec: JobSpec) -> str:
    """The script without the directives the command line replaces, nor those that choose a cluster."""
    directives = _directives(spec)
    kept = {d.line for d in _effective(directives, spec) if d.line}
    return disable_directives(_without_cluster_options(spec.script, directives), {d.line for d in directives} - kept)


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


def spec_request(spec: JobSpec) -> list[tuple[str, str | None]]:
    """Every option Slurm applies to the job, in order: the script's directives the command line
    does not replace, then the command line (``[(long option, value or None), ...]``)."""
    return [(d.option, d.value) for d in _effective(_directives(spec), spec)]


def _effective(directives: list[Directive], spec: JobSpec) -> list[Directive]:
    return [d for d in apply_overrides(directives, _overrides(spec)) if d.option not in CLUSTER_OPTIONS]


# The name Slurm gives a job whose request names none: sbatch's, for a script read from stdin
STDIN_JOB_NAME = "sbatch"


def spec_job_name(spec: JobSpec) -> str:
    """The job's name as Slurm will hold it (the last --job-name of the effective request)."""
    return next((value or "" for option, value in reversed(spec_request(spec)) if option == "job-name"), STDIN_JOB_NAME)
