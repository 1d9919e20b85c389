"""A job's effective request (``JobRequest.options`` and the relay's options) as pyslurm 25.11's ``JobSubmitDescription``.

pyslurm submits a description, not a command line: it does not read the script's ``#SBATCH`` lines
(``JobSubmitDescription.load_sbatch_options`` exists, but its parser is not sbatch's: no
abbreviations, no quoting, ``--time20``-style splitting at digits, ``--gpus-per-socket`` mapped
twice, a ``#`` inside a value cuts it). So the portal's own parser (the one ``#SBATCH`` reader,
``gpuportal_sbatch.directives``) gives the options, ``request.job_request`` merges them with the
portal's command line exactly as sbatch would, and ``description_kwargs`` maps each one to the
attribute pyslurm has for it (read against PySlurm/pyslurm 25.11.x:
pyslurm/core/job/submission.pyx ``_create_job_submit_desc``, sbatch_opts.pyx, utils/cstr.pyx).

The one decision for options pyslurm cannot express (``NotExpressible``): the pyslurm gateway
submits that job with the cli backend (``PyslurmGateway.submit``), so the job gets what the
script asks for, never a silently different request. They are:

- options pyslurm has no attribute for (or ignores): ``--hint``, ``--gpu-freq``, ``--mem-bind``,
  ``--prefer``, ``--propagate``, ``--extra-node-info``, ``--nodefile``, ``--bb``, ...: everything
  not in ``_MAPPED`` below;
- values pyslurm turns into something else: ``--mem=0`` (pyslurm sends 0 as "not set", sbatch
  means "all of the node's memory"), ``--mem-per-gpu`` (pyslurm 25.11.2 raises NameError in
  ``_set_memory``), ``--exclusive=user|mcs|topo``, ``--begin``/``--deadline`` in sbatch's relative
  forms (``now+1hour``: pyslurm takes only timestamps), ``--ntasks-per-gpu`` (pyslurm adds a
  ``--gpu-bind=single:N`` Slurm 25.11 refuses as an invalid TRES specification, and refuses it
  with ``--nodes``, which sbatch does not), both ``--gres`` and ``--gpus-per-node``,
  ``--mail-type`` NONE or INVALID_DEPEND (pyslurm refuses both, with "Invalid Mail type: {typ}.").

What sbatch works out itself before it sends the request, this module does too (pyslurm sends
``ntasks=1`` when none is given): the implicit task count (``_implicit_ntasks``).

The job's environment is the descriptor's (``description_environment``), as sbatch builds it: the user's
login environment on the node (``get_user_environment``: what ``sbatch --export=NONE`` asks
slurmd for), the job's own variables over it, and the SLURM_* variables sbatch sets from its own
process (SLURM_SUBMIT_DIR, SLURM_SUBMIT_HOST, SLURM_UMASK) with SLURM_EXPORT_ENV=ALL, so ``srun``
steps inherit the job's environment (cli_argv.STEP_EXPORT). The script is never edited.
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Callable
from typing import Any

from gpuportal_sbatch.directives import DirectiveError, check_mail_type, is_c_digits, parse_time_minutes

from .cli_argv import STEP_EXPORT, job_process_environment
from .request import STDIN_JOB_NAME
from .types import JobSubmission, SlurmRejected


class NotExpressible(Exception):
    """An option of the request that pyslurm cannot submit as sbatch would."""

    def __init__(self, option: str, why: str = "pyslurm 25.11 has no attribute for it"):
        super().__init__(f"--{option}: {why}")
        self.option = option


def _text(value: str | None) -> str:
    return value or ""


def _int(value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise SlurmRejected(f"sbatch: error: invalid number {value!r}") from None


def _minutes(option: str) -> Callable[[str | None], int]:
    def convert(value: str | None) -> int:
        try:
            minutes = parse_time_minutes(value or "", option=option)
        except DirectiveError as exc:
            raise SlurmRejected(f"sbatch: error: {exc}") from None
        if minutes is None:  # UNLIMITED / INFINITE: pyslurm's timestr_to_mins says so itself
            raise NotExpressible(option, "an unlimited time is not passed through pyslurm")
        return int(minutes)  # an int: pyslurm refuses digit strings for time_limit

    return convert


def _memory(option: str) -> Callable[[str | None], str]:
    def convert(value: str | None) -> str:
        text = (value or "").strip().upper().removesuffix("B")
        if re.fullmatch(r"0+[KMGT]?", text):
            raise NotExpressible(option, "pyslurm sends 0 as 'not set'; sbatch means all of the node's memory")
        return text  # pyslurm's dehumanize: "4096", "4G" (MiB by default, as sbatch)

    return convert


def _gpu_count(value: str | None) -> str:
    """--gpus / --gpus-per-task values ("2", "a100:2", "gpu:a100:2") for from_gres_dict(typ="gpu")."""
    text = (value or "").removeprefix("gpu:")
    return text if ":" in text or is_c_digits(text) else f"{text}:1"  # "a100" alone: one of that type


def _gres(value: str | None) -> str:
    """--gres values ("gpu:2", "gpu:a100:2", "gpu", "gres:gpu:2") with a count on every item."""
    items = []
    for item in (value or "").removeprefix("gres:").split(","):
        parts = item.split(":")
        items.append(item if len(parts) > 1 and is_c_digits(parts[-1]) else f"{item}:1")
    return ",".join(items)


def _mail_types(value: str | None) -> str:
    """--mail-type as pyslurm reads it (its mail_type_list_to_int). NONE and INVALID_DEPEND, which
    sbatch takes and pyslurm 25.11 refuses ("Invalid Mail type: {typ}."), go by sbatch."""
    try:
        types = check_mail_type(value or "")
    except DirectiveError as exc:
        raise SlurmRejected(f"sbatch: error: {exc.message}") from None
    if {"NONE", "INVALID_DEPEND"} & set(types):
        raise NotExpressible("mail-type", "pyslurm 25.11 refuses --mail-type NONE and INVALID_DEPEND")
    return ",".join(types)


def _signal(value: str | None) -> dict[str, Any]:
    """sbatch's ``[{R|B}:]<sig_num>[@sig_time]``, as the dict pyslurm takes (its own string parser
    wants Python's signal names, "SIGUSR1", where sbatch also takes "USR1")."""
    match = re.fullmatch(r"(?:([RB]+):)?([A-Za-z0-9]+)(?:@([0-9]+))?", value or "")
    if not match:
        raise SlurmRejected(f"sbatch: error: Invalid --signal specification: {value}")
    flags, name, seconds = match.groups()
    if name.isdigit():
        number = int(name)
    else:
        upper = name.upper()
        member = getattr(signals.Signals, upper if upper.startswith("SIG") else f"SIG{upper}", None)
        if member is None:
            raise SlurmRejected(f"sbatch: error: Invalid --signal specification: {value}")
        number = int(member)
    result: dict[str, Any] = {"signal": number, "batch_only": "B" in (flags or ""),
                              "allow_reservation_overlap": "R" in (flags or "")}  # fmt: skip
    if seconds:
        result["time"] = int(seconds)
    return result


def _exclusive(value: str | None) -> str:
    if value is not None:
        raise NotExpressible("exclusive", f"pyslurm has no --exclusive={value}")
    return "no"


def _constant(result: Any) -> Callable[[str | None], Any]:
    return lambda _value: result


# sbatch long option -> (JobSubmitDescription attribute, converter of the option's value)
_MAPPED: dict[str, tuple[str, Callable[[str | None], Any]]] = {
    "job-name": ("name", _text),
    "account": ("account", _text),
    "partition": ("partitions", _text),
    "qos": ("qos", _text),
    "reservation": ("reservations", _text),
    "comment": ("comment", _text),
    "chdir": ("working_directory", _text),
    "output": ("standard_output", _text),
    "error": ("standard_error", _text),
    "input": ("standard_in", _text),
    "open-mode": ("log_files_open_mode", _text),
    "uid": ("user_id", _int),
    "gid": ("group_id", _int),
    "nodes": ("nodes", _text),  # "2" or "1-2": pyslurm's _parse_nodes reads both
    "ntasks": ("ntasks", _int),
    "ntasks-per-node": ("ntasks_per_node", _int),
    "ntasks-per-socket": ("ntasks_per_socket", _int),
    "ntasks-per-core": ("ntasks_per_core", _int),
    "cpus-per-task": ("cpus_per_task", _int),
    "cpus-per-gpu": ("cpus_per_gpu", _int),
    "mincpus": ("min_cpus_per_node", _int),
    "sockets-per-node": ("sockets_per_node", _int),
    "cores-per-socket": ("cores_per_socket", _int),
    "threads-per-core": ("threads_per_core", _int),
    "mem": ("memory_per_node", _memory("mem")),
    "mem-per-cpu": ("memory_per_cpu", _memory("mem-per-cpu")),
    "tmp": ("temporary_disk_per_node", _memory("tmp")),
    "gres": ("gres_per_node", _gres),
    "gpus-per-node": ("gres_per_node", lambda value: _gres(f"gpu:{_gpu_count(value)}")),  # sbatch: tres_per_node too
    "gpus": ("gpus", _gpu_count),
    "gpus-per-task": ("gpus_per_task", _gpu_count),
    "gpus-per-socket": ("gpus_per_socket", _gpu_count),
    "exclusive": ("resource_sharing", _exclusive),
    "oversubscribe": ("resource_sharing", _constant("yes")),
    "array": ("array", _text),
    "time": ("time_limit", _minutes("time")),
    "time-min": ("time_limit_min", _minutes("time-min")),
    "constraint": ("constraints", _text),
    "exclude": ("excluded_nodes", _text),
    "nodelist": ("required_nodes", _text),
    "contiguous": ("requires_contiguous_nodes", _constant(True)),
    "dependency": ("dependencies", _text),
    "nice": ("nice", lambda value: 100 if value is None else _int(value)),
    "signal": ("signal", _signal),
    "requeue": ("is_requeueable", _constant(True)),
    "no-requeue": ("is_requeueable", _constant(False)),
    "mail-type": ("mail_types", _mail_types),
    "mail-user": ("mail_user", _text),
    "licenses": ("licenses", _text),
    "wckey": ("wckey", _text),
    "distribution": ("distribution", _text),
    "no-kill": ("kill_on_node_fail", _constant(False)),
    "overcommit": ("overcommit", _constant(True)),
    "spread-job": ("spreads_over_nodes", _constant(True)),
    "use-min-nodes": ("use_min_nodes", _constant(True)),
    "kill-on-invalid-dep": ("kill_on_invalid_dependency", lambda value: (value or "yes").lower() == "yes"),
    "hold": ("priority", _constant(0)),  # sbatch --hold: priority 0 (tests; scripts may not hold)
}

# Options that change only how sbatch itself behaves, not the job: nothing to pass.
_CLIENT_ONLY = frozenset({"parsable", "quiet", "verbose", "ignore-pbs"})


def _implicit_ntasks(kwargs: dict[str, Any], seen: set[str]) -> None:
    """sbatch's task count when the script gives none (src/sbatch/opt.c, "massage the numbers"):
    one task per node for a fixed node count (times --sockets-per-node, --cores-per-socket,
    --threads-per-core), --ntasks-per-node per node; else Slurm's default of one."""
    if "ntasks" in seen:
        return
    low, _, high = str(kwargs.get("nodes") or "1").partition("-")
    nodes = max(_int(low), 1)
    if "ntasks-per-node" in seen:
        kwargs["ntasks"] = kwargs["ntasks_per_node"] * nodes
    elif "nodes" in seen and (not high or high == low):
        tasks = nodes
        for attribute in ("sockets_per_node", "cores_per_socket", "threads_per_core"):
            tasks *= kwargs.get(attribute) or 1
        kwargs["ntasks"] = tasks


def description_kwargs(submission: JobSubmission) -> dict[str, Any]:
    """The JobSubmitDescription keyword arguments for what Slurm would get from sbatch for this
    submission (the script's directives and the portal's command line), without ``script``.

    Raises NotExpressible for an option pyslurm cannot pass as sbatch would (see the module
    docstring), SlurmRejected for a value sbatch refuses."""
    # the environment: description_environment (the gateway's); the name sbatch gives a script read from
    # stdin, as the cli backend sends it, unless the request names the job
    kwargs: dict[str, Any] = {"name": STDIN_JOB_NAME}
    seen: set[str] = set()
    for option, value in submission.options:  # in order: a later occurrence wins, as in sbatch
        if option in _CLIENT_ONLY:
            continue
        if option not in _MAPPED:
            raise NotExpressible(option)
        attribute, convert = _MAPPED[option]
        if attribute == "gres_per_node" and option not in seen and {"gres", "gpus-per-node"} & seen:
            raise NotExpressible(option, "pyslurm has one attribute for --gres and --gpus-per-node together")
        kwargs[attribute] = convert(value)
        seen.add(option)
    _implicit_ntasks(kwargs, seen)
    if isinstance(kwargs.get("signal"), dict) and "time" not in kwargs["signal"]:
        kwargs["signal"]["time"] = 60  # sbatch's default warning time
    return kwargs


# What sbatch 25.11 exports into every job from its own options (src/sbatch/opt.c set_envs,
# src/common/env.c set_env_from_opts): option -> variable, the value as given
_OPTION_VARIABLES = {
    "cpus-per-task": "SLURM_CPUS_PER_TASK", "distribution": "SLURM_DISTRIBUTION",
    "threads-per-core": "SLURM_THREADS_PER_CORE", "ntasks-per-node": "SLURM_NTASKS_PER_NODE", "ntasks-per-core": "SLURM_NTASKS_PER_CORE",
    "ntasks-per-socket": "SLURM_NTASKS_PER_SOCKET", "ntasks-per-gpu": "SLURM_NTASKS_PER_GPU",
    "cpus-per-gpu": "SLURM_CPUS_PER_GPU", "gpus": "SLURM_GPUS", "gpus-per-node": "SLURM_GPUS_PER_NODE",
    "gpus-per-socket": "SLURM_GPUS_PER_SOCKET",
}  # fmt: skip
# ... and for MPI launchers, so that mpirun/mpiexec inside a job start their ranks with srun
# (env.c _set_ext_launcher_hydra and the OMPI/PRTE ones); a job's own value wins
_MPI_LAUNCHER = {
    "HYDRA_BOOTSTRAP": "slurm", "HYDRA_LAUNCHER_EXTRA_ARGS": "--external-launcher", "I_MPI_HYDRA_BOOTSTRAP": "slurm",
    "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "--external-launcher", "OMPI_MCA_plm_slurm_args": "--external-launcher",
    "PRTE_MCA_plm_slurm_args": "--external-launcher",
}  # fmt: skip


def description_environment(submission: JobSubmission, *, submit_dir: str, slurm_conf: str, host: str, umask: str,
                            nice: int = 0) -> dict[str, Any]:  # fmt: skip
    """The descriptor's environment attributes for a submission: what sbatch 25.11 run in ``submit_dir``
    with SLURM_EXPORT_ENV=ALL would send (the module docstring). ``slurm_conf``: the cluster's, so
    that Slurm's commands inside the job talk to it; ``nice``: the submitting process's
    (SLURM_PRIO_PROCESS). ``profile_types``: none, where pyslurm 25.11.2 would send NO_VAL, which
    slurmd reads as every profile (SLURM_PROFILE=Energy,Lustre,Network,Task); sbatch sends none."""
    options = dict(submission.options)
    environment = {
        **_MPI_LAUNCHER,
        **{variable: options[option] or "" for option, variable in _OPTION_VARIABLES.items() if option in options},
        **job_process_environment(submission.request, submit_dir=submit_dir), **STEP_EXPORT, "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_SUBMIT_HOST": host, "SLURM_UMASK": umask, "SLURM_PRIO_PROCESS": str(nice),
    }  # fmt: skip
    if slurm_conf:
        environment["SLURM_CONF"] = slurm_conf
    return {"environment": environment, "get_user_environment": True, "profile_types": "none"}
