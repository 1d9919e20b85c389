"""A job's effective request (``request.spec_request``) as the ``job_desc_msg_t`` that sbatch 22.05
would send for it: the fields, the job's environment and the submit line. Pure: unit-tested; the
oracle is sbatch itself (tests/jobs/test_native_same_request.py submits every accepted script of the
corpus both ways and compares Slurm's view of the two jobs, and the environment they run with).

Read against Slurm 22.05.8: ``slurm_opt_create_job_desc`` (src/common/slurm_opt.c, with
set_defaults), ``_fill_job_desc_from_opts``, ``_set_*_env`` and ``set_envs`` (src/sbatch/sbatch.c,
opt.c), ``_opt_verify``'s "massage the numbers", ``set_env_from_opts`` (src/common/env.c). The
portal's command line is always ``sbatch --parsable --export=NONE <options>`` with the script on
stdin (cli_argv.sbatch_argv), so the job starts as ``--export=NONE`` does: the SLURM_* variables of
the submitting process and those sbatch sets itself.

An option outside ``_MAPPED`` (or a value form this module does not read the way sbatch does) raises
``NotExpressible``: the gateway submits that job with ``sbatch`` (one decision, in
``native.NativeSubmitter.fields`` callers: ``CliGateway.submit``), so a job never gets a request
that differs from what sbatch would have sent.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Mapping
from typing import Any

from gpuportal_cli.sbatch_directives import DirectiveError, parse_time_minutes

from .pyslurm_request import NotExpressible
from .request import spec_request
from .types import JobSpec, SlurmRejected

# slurm.h 22.05
NO_VAL = 0xFFFFFFFE
INFINITE = 0xFFFFFFFF
NICE_OFFSET = 0x80000000
MEM_PER_CPU = 0x8000000000000000
JOB_NTASKS_SET = 1 << 14
JOB_CPUS_SET = 1 << 15
SLURM_DIST_UNKNOWN = 0x2000
JOB_SHARED_NONE, JOB_SHARED_OK = 0, 1
OPEN_MODE_APPEND, OPEN_MODE_TRUNCATE = 1, 2

# sbatch's PropagateResourceLimits default (ALL): every limit of src/common/slurm_rlimits_info.c
RLIMITS = ("CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS")

# Options that change only how sbatch itself behaves, not the job: nothing to pass.
_CLIENT_ONLY = frozenset({"parsable", "quiet", "verbose", "ignore-pbs"})

_INT_RE = re.compile(r"^\d+$")
_NODES_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_MEMORY_RE = re.compile(r"^(\d+)([MGT]?)$", re.IGNORECASE)


def _int(option: str, value: str | None) -> int:
    if value is None or not _INT_RE.match(value):
        raise NotExpressible(option, f"only a plain count is passed natively, not {value!r}")
    return int(value)


def _minutes(option: str, value: str | None) -> int:
    try:
        minutes = parse_time_minutes(value or "", option=option)
    except DirectiveError as exc:
        raise SlurmRejected(f"sbatch: error: {exc}") from None
    return INFINITE if minutes is None else int(minutes)


def _megabytes(option: str, value: str | None) -> int:
    match = _MEMORY_RE.match(value or "")
    if not match:
        raise NotExpressible(option, f"only MiB, G or T sizes are passed natively, not {value!r}")
    number, unit = int(match.group(1)), match.group(2).upper()
    return number * {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]


def _text(option: str, value: str | None) -> str:
    if not value:
        raise NotExpressible(option, "an empty value")
    return value


def _tres(prefix: str, value: str) -> str:
    """src/common/proc_args.c xfmt_tres: each comma item as ``prefix:item``."""
    return ",".join(f"{prefix}:{item}" for item in value.split(",") if item)


def _gres(value: str) -> str:
    """src/common/gres.c gres_prepend_tres_type."""
    return ("gres:" + value).replace(",", ",gres:").replace("gres:gres:", "gres:")


class _Options:
    """sbatch's ``opt`` after its two passes, for the options this module maps."""

    def __init__(self, cwd: str, uid: int, gid: int):
        self.values: dict[str, Any] = {}
        self.chdir, self.uid, self.gid = cwd, uid, gid
        self.ntasks, self.ntasks_set = 1, False
        self.min_nodes, self.max_nodes, self.nodes_set = 1, 0, False
        self.cpus_per_task, self.cpus_set = 0, False


def _apply(opt: _Options, option: str, value: str | None, cwd: str) -> None:
    v = opt.values
    if option == "job-name":
        v["name"] = _text(option, value)
    elif option in ("account", "partition", "qos", "reservation", "comment", "dependency", "array"):
        v[option] = _text(option, value)
    elif option == "constraint":
        v["features"] = _text(option, value)
    elif option == "exclude":
        if "/" in _text(option, value):  # sbatch reads a file of node names (opt.c _valid_node_list)
            raise NotExpressible(option, "a file of node names is read by sbatch only")
        v["exclude"] = value
    elif option == "chdir":
        path = _text(option, value)
        opt.chdir = path if path.startswith("/") else f"{cwd}/{path}"
    elif option in ("output", "error", "input"):
        v[option] = _text(option, value)
    elif option == "uid":
        opt.uid = _int(option, value)
    elif option == "gid":
        opt.gid = _int(option, value)
    elif option == "nodes":
        match = _NODES_RE.match(value or "")
        if not match:
            raise NotExpressible(option, f"only N or N-M nodes are passed natively, not {value!r}")
        # proc_args.c verify_node_count: "N" is N to N
        opt.min_nodes = int(match.group(1))
        opt.max_nodes = int(match.group(2)) if match.group(2) else opt.min_nodes
        opt.nodes_set = True
    elif option == "ntasks":
        opt.ntasks, opt.ntasks_set = _int(option, value), True
    elif option == "ntasks-per-node":
        v["ntasks_per_node"] = _int(option, value)
    elif option == "cpus-per-task":
        opt.cpus_per_task, opt.cpus_set = _int(option, value), True
    elif option == "cpus-per-gpu":
        v["cpus_per_gpu"] = _int(option, value)
    elif option == "mem":
        v["mem"] = _megabytes(option, value)
        v.pop("mem_per_cpu", None)
    elif option == "mem-per-cpu":
        v["mem_per_cpu"] = _megabytes(option, value)
        v.pop("mem", None)
    elif option == "gres":
        v["gres"] = _text(option, value)
    elif option == "gpus":
        v["gpus"] = _text(option, value)
    elif option == "gpus-per-node":
        v["gpus_per_node"] = _text(option, value)
    elif option in ("time", "time-min"):
        v[option] = _minutes(option, value)
    elif option == "hold":
        v["hold"] = True
    elif option in ("requeue", "no-requeue"):
        v["requeue"] = 1 if option == "requeue" else 0
    elif option == "nice":
        number = 100 if value is None else int(value) if re.fullmatch(r"-?\d+", value) else None
        if number is None or abs(number) > NICE_OFFSET - 3:
            raise NotExpressible(option, f"a --nice value sbatch would refuse: {value!r}")
        v["nice"] = number
    elif option == "exclusive":
        if value is not None:
            raise NotExpressible(option, f"--exclusive={value} is passed by sbatch only")
        v["shared"] = JOB_SHARED_NONE
    elif option == "oversubscribe":
        v["shared"] = JOB_SHARED_OK
    elif option == "contiguous":
        v["contiguous"] = 1
    elif option == "open-mode":
        mode = (value or "").lower()
        if mode not in ("append", "truncate", "a", "t"):
            raise NotExpressible(option)
        v["open_mode"] = OPEN_MODE_APPEND if mode[0] == "a" else OPEN_MODE_TRUNCATE
    else:
        raise NotExpressible(option, "not passed natively (sbatch submits it)")


def check_script(script: str) -> None:
    """sbatch's own checks of the script it reads (sbatch.c ``_get_script_buffer``), in its words:
    SlurmRejected as the cli backend gets them from sbatch's stderr."""
    lines = None
    if not script:
        lines = ["Batch script is empty!"]
    elif not script.strip():  # xstring_is_whitespace
        lines = ["Batch script contains only whitespace!"]
    elif not script.startswith("#!"):  # has_shebang
        lines = ["This does not look like a batch script.  The first",
                 "line must start with #! followed by the path to an interpreter.", "For instance: #!/bin/sh"]  # fmt: skip
    elif "\0" in script:
        lines = ["The Slurm controller does not allow scripts that", "contain a NULL character '\\0'."]
    elif "\r\n" in script:
        lines = ["Batch script contains DOS line breaks (\\r\\n)", "instead of expected UNIX line breaks (\\n)."]
    if lines:
        raise SlurmRejected("\n".join(f"sbatch: error: {line}" for line in lines))


def sbatch_process_environment(environ: Mapping[str, str], *, cwd: str, host: str) -> dict[str, str]:
    """The SLURM_* variables sbatch has before it reads the job's options: the submitting process's
    (its environment: the gateway's clean one), then SLURM_PRIO_PROCESS, SLURM_SUBMIT_DIR,
    SLURM_SUBMIT_HOST, SLURM_UMASK and the resource limits (sbatch.c ``_set_*_env``): the same for
    every job a process submits."""
    env = {k: v for k, v in environ.items() if k.startswith("SLURM")}
    for name in RLIMITS:
        if f"SLURM_RLIMIT_{name}" not in env:
            current = resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))[0]
            env[f"SLURM_RLIMIT_{name}"] = str(current % (1 << 64))  # RLIM_INFINITY as C's unsigned long
    env.setdefault("SLURM_PRIO_PROCESS", str(os.getpriority(os.PRIO_PROCESS, 0)))
    env["SLURM_SUBMIT_DIR"] = cwd
    env["SLURM_SUBMIT_HOST"] = host
    if "SLURM_UMASK" not in env:
        mask = os.umask(0)
        os.umask(mask)
        env["SLURM_UMASK"] = f"0{(mask >> 6) & 7}{(mask >> 3) & 7}{mask & 7}"
    return env


def job_descriptor(spec: JobSpec, *, script: str, process_env: Mapping[str, str], cwd: str,
                   submit_line: str) -> dict[str, Any]:  # fmt: skip
    """The helper's job: ``{"fields": {...}, "environment": [...], "argv": []}`` for this spec, as
    sbatch 22.05 builds it. ``process_env``: sbatch_process_environment's answer. Raises
    NotExpressible (the caller submits with sbatch) or SlurmRejected (a value sbatch refuses)."""
    check_script(script)
    opt = _Options(cwd, os.getuid(), os.getgid())
    for option, value in spec_request(spec):  # in order: a later occurrence wins, as in sbatch
        if option not in _CLIENT_ONLY:
            _apply(opt, option, value, cwd)
    v = opt.values

    # _opt_verify: tasks per node on a fixed node count set the task count; cpus per task the CPUs
    # per node; then "massage the numbers"
    if v.get("ntasks_per_node") and not opt.ntasks_set and (opt.max_nodes == 0 or opt.min_nodes == opt.max_nodes):
        opt.ntasks, opt.ntasks_set = opt.min_nodes * v["ntasks_per_node"], True
    if opt.nodes_set and (opt.min_nodes == opt.max_nodes or opt.max_nodes == 0) and not opt.ntasks_set:
        opt.ntasks = max(opt.min_nodes, 1)
    elif opt.nodes_set and opt.ntasks_set:
        if opt.ntasks < opt.max_nodes:
            opt.max_nodes = opt.ntasks
        if opt.ntasks < opt.min_nodes:
            opt.min_nodes = opt.max_nodes = opt.ntasks

    fields: dict[str, Any] = {
        "name": v.get("name", "sbatch"), "contiguous": v.get("contiguous", 0), "mail_type": 0,
        "user_id": opt.uid, "group_id": opt.gid, "task_dist": SLURM_DIST_UNKNOWN,
        "warn_flags": 0, "warn_signal": 0, "warn_time": 0, "work_dir": opt.chdir, "script": script,
        "submit_line": submit_line,
    }  # fmt: skip
    for option, field in (("account", "account"), ("partition", "partition"), ("qos", "qos"),
                          ("reservation", "reservation"), ("comment", "comment"), ("dependency", "dependency"),
                          ("features", "features"), ("array", "array_inx"), ("exclude", "exc_nodes")):  # fmt: skip
        if option in v:
            fields[field] = v[option]
    bitflags = 0
    if opt.ntasks_set:
        bitflags |= JOB_NTASKS_SET
        fields["num_tasks"] = opt.ntasks
    if opt.cpus_set:
        fields["min_cpus"] = opt.ntasks * opt.cpus_per_task
        bitflags |= JOB_CPUS_SET
        fields["cpus_per_task"] = opt.cpus_per_task
        fields["pn_min_cpus"] = opt.cpus_per_task
    elif opt.nodes_set and opt.min_nodes == 0:
        fields["min_cpus"] = 0
    else:
        fields["min_cpus"] = opt.ntasks
    if bitflags:
        fields["bitflags"] = bitflags
    if opt.nodes_set:
        fields["min_nodes"] = opt.min_nodes
        if opt.max_nodes:
            fields["max_nodes"] = opt.max_nodes
    if "ntasks_per_node" in v:
        fields["ntasks_per_node"] = v["ntasks_per_node"]
    if "cpus_per_gpu" in v:
        fields["cpus_per_tres"] = f"gres:gpu:{v['cpus_per_gpu']}"
    if v.get("mem") is not None:
        fields["pn_min_memory"] = v["mem"]
    elif v.get("mem_per_cpu") is not None:
        fields["pn_min_memory"] = v["mem_per_cpu"] | MEM_PER_CPU
    if "nice" in v:
        fields["nice"] = NICE_OFFSET + v["nice"]
    if v.get("hold"):
        fields["priority"] = 0
    if "shared" in v:
        fields["shared"] = v["shared"]
    if "requeue" in v:
        fields["requeue"] = v["requeue"]
    if "open_mode" in v:
        fields["open_mode"] = v["open_mode"]
    if "time" in v:
        fields["time_limit"] = v["time"]
    if "time-min" in v:
        fields["time_min"] = v["time-min"]
    if "gpus" in v:
        fields["tres_per_job"] = _tres("gres:gpu", v["gpus"])
    per_node = _tres("gres:gpu", v["gpus_per_node"]) if "gpus_per_node" in v else ""
    if v.get("gres") and v["gres"].lower() != "none":
        per_node = f"{per_node},{_gres(v['gres'])}" if per_node else _gres(v["gres"])
    if per_node:
        fields["tres_per_node"] = per_node
    for option, field in (("output", "std_out"), ("error", "std_err"), ("input", "std_in")):
        path = v.get(option, "/dev/null" if option == "input" else None)
        if path is not None:
            fields[field] = path if path.startswith("/") else f"{opt.chdir}/{path}"

    env = dict(process_env)  # sbatch's own SLURM_* (sbatch_process_environment), then what it sets
    if "name" in v:
        env["SLURM_JOB_NAME"] = v["name"]
    if "open_mode" in v:
        env["SLURM_OPEN_MODE"] = "a" if v["open_mode"] == OPEN_MODE_APPEND else "t"
    if "dependency" in v:
        env["SLURM_JOB_DEPENDENCY"] = v["dependency"]
    env.setdefault("SLURM_EXPORT_ENV", "NONE")
    env["SLURM_GET_USER_ENV"] = "1"
    if "cpus_per_gpu" in v:  # set_env_from_opts
        env["SLURM_CPUS_PER_GPU"] = str(v["cpus_per_gpu"])
    if "gpus" in v:
        env["SLURM_GPUS"] = v["gpus"]
    if "gpus_per_node" in v:
        env["SLURM_GPUS_PER_NODE"] = v["gpus_per_node"]
    if opt.cpus_set:  # set_envs
        env["SLURM_CPUS_PER_TASK"] = str(opt.cpus_per_task)
    if opt.ntasks_set and opt.ntasks > 0:
        env["SLURM_NPROCS"] = env["SLURM_NTASKS"] = str(opt.ntasks)
    if "ntasks_per_node" in v:
        env["SLURM_NTASKS_PER_NODE"] = str(v["ntasks_per_node"])
    return {"fields": fields, "environment": [f"{k}={val}" for k, val in env.items()], "argv": []}

