"""What the CLI backend (portal.slurm.cli) reads from Slurm's commands: the squeue/sacct field lists it
asks for and the parsers of squeue, sacct, scontrol and sacctmgr output into typed results. Pure (no
subprocess): unit-tested on captured output. The low-level pieces (times, TRES, hostlists) are
portal.slurm.parsing."""

from __future__ import annotations

import logging
import re

from . import parsing
from . import types as t
from .parsing import FIELD_SEP

logger = logging.getLogger(__name__)

# squeue -o: comment (%k) is last so that, in theory, a separator inside it cannot shift fields.
# %A: the job's own id (an array task's too), %F: its array's id, %K: the array index(es) of the row.
# %S of a pending job is the backfill scheduler's expected start (``squeue --start`` prints this field)
# and %Q its priority: the one queue read carries both, no second squeue per cycle.
QUEUE_FIELDS = ("%i", "%u", "%a", "%P", "%T", "%r", "%N", "%D", "%V", "%S", "%e", "%l", "%b", "%v", "%A", "%F", "%K", "%Q",
                "%j", "%k")  # fmt: skip
QUEUE_FORMAT = FIELD_SEP.join(QUEUE_FIELDS)

# sacct -o: free-text fields (JobName, Comment) last, Comment very last.
SACCT_FIELDS = (
    "JobIDRaw", "User", "Account", "Partition", "State", "ExitCode", "Submit", "Start", "End",
    "ElapsedRaw", "TimelimitRaw", "NNodes", "NodeList", "AllocTRES", "ReqTRES", "Reservation",
    "Cluster", "JobID", "JobName", "Comment",
)  # fmt: skip

# Keys of GrpTRES/GrpTRESMins the portal manages (and clears when absent).
_MANAGED_TRES_RE = re.compile(r"^gres/gpu(:[^=,]+)?$")


def parse_job_id(stdout: str) -> int:
    """``sbatch --parsable`` prints "123" or "123;cluster"."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job_id = parsing.parse_int(first.split(";", 1)[0], None)
    if job_id is None:
        raise t.SlurmRejected(f"sbatch printed no job id: {stdout!r}")
    return job_id


def _rows(stdout: str, fields: tuple[str, ...], command: str):
    """The non-blank lines of squeue/sacct output, each split into ``len(fields)`` values (the last one,
    the comment, may hold anything); a line with fewer is logged and skipped."""
    for line in stdout.splitlines():
        if not line.strip():
            continue
        values = line.split(FIELD_SEP, len(fields) - 1)
        if len(values) != len(fields):
            logger.warning("%s line with %d fields ignored: %r", command, len(values), line)
            continue
        yield values


def _job_columns(*, job_id: int, array_id: str, array_tasks: str, name: str, user: str, account: str, partition: str,
                 state: str, submit: str, start: str, end: str) -> dict:  # fmt: skip
    """The columns squeue and sacct both print, read the same way into the fields QueueEntry and
    AccountingRecord share (``array_id``: the array's id, read only for a row of an array job)."""
    return {
        "array_job_id": parsing.parse_int(array_id, None) if array_tasks else None,
        "array_tasks": array_tasks,
        "job_id": job_id,
        "name": name,
        "user": user,
        "account": account,
        "partition": partition,
        "state": parsing.base_state(state),
        "submit_time": parsing.parse_time(submit),
        "start_time": parsing.parse_time(start),
        "end_time": parsing.parse_time(end),
    }


def parse_queue(stdout: str) -> list[t.QueueEntry]:
    entries = []
    for fields in _rows(stdout, QUEUE_FIELDS, "squeue"):
        (job_id, user, account, partition, state, reason, nodes, num_nodes, submit, start, end,
         limit, tres, reservation, own_id, array_id, array_index, priority, name, comment) = fields  # fmt: skip
        job_id_int = parsing.parse_int(own_id, None)
        if job_id_int is None:
            job_id_int = parsing.parse_int(job_id, None)
        if job_id_int is None:
            continue
        array_tasks = "" if array_index.strip() in ("", "N/A") else array_index.strip().split("%")[0]
        entries.append(
            t.QueueEntry(
                **_job_columns(job_id=job_id_int, array_id=array_id, array_tasks=array_tasks, name=name, user=user,
                               account=account, partition=partition, state=state, submit=submit, start=start, end=end),
                reason=reason,
                comment="" if comment == "(null)" else comment,
                nodes=parsing.null_to_empty(nodes),
                num_nodes=parsing.parse_int(num_nodes, 0) or 0,
                time_limit_minutes=parsing.parse_duration_minutes(limit),
                tres_per_node=parsing.tres_per_node(tres),
                reservation=parsing.null_to_empty(reservation),
                priority=parsing.parse_int(priority, None),
            )
        )
    return entries


def parse_sacct(stdout: str) -> list[t.AccountingRecord]:
    records = []
    for fields in _rows(stdout, SACCT_FIELDS, "sacct"):
        (job_id, user, account, partition, state, exit_code, submit, start, end, elapsed, limit,
         num_nodes, nodes, alloc_tres, req_tres, reservation, cluster, array_job, name, comment) = fields  # fmt: skip
        job_id_int = parsing.parse_int(job_id, None)
        if job_id_int is None:
            continue
        array_base, underscore, array_tasks = array_job.partition("_")  # "559_3", "559_[2-3%2]"
        array_tasks = array_tasks.strip("[]").split("%")[0] if underscore else ""
        code, signal = parsing.parse_exit_status(exit_code)
        records.append(
            t.AccountingRecord(
                **_job_columns(job_id=job_id_int, array_id=array_base, array_tasks=array_tasks, name=name, user=user,
                               account=account, partition=partition, state=state, submit=submit, start=start, end=end),
                exit_code=code, exit_signal=signal,
                elapsed_seconds=parsing.parse_int(elapsed, 0) or 0,
                time_limit_minutes=parsing.parse_minutes_raw(limit),
                num_nodes=parsing.parse_int(num_nodes, 0) or 0,
                nodes="" if nodes == "None assigned" else parsing.null_to_empty(nodes),
                alloc_tres=parsing.parse_tres(alloc_tres),
                req_tres=parsing.parse_tres(req_tres),
                comment=comment,
                reservation=reservation,
                cluster=cluster,
            )
        )
    return records


def _scontrol_records(stdout: str, key: str):
    """The records of ``scontrol show … -o`` output (one a line, starting ``key=``), each as its
    {field: value}; other lines ("No reservations in the system") are skipped."""
    for line in stdout.splitlines():
        if line.startswith(f"{key}="):
            yield parsing.parse_kv_line(line)


def parse_partitions(stdout: str) -> list[t.Partition]:
    out = []
    for kv in _scontrol_records(stdout, "PartitionName"):
        out.append(
            t.Partition(
                name=kv["PartitionName"],
                is_default=kv.get("Default", "NO").upper() == "YES",
                state=kv.get("State", "UNKNOWN").upper(),
                default_time_minutes=parsing.parse_duration_minutes(kv.get("DefaultTime", "NONE")),
                max_time_minutes=parsing.parse_duration_minutes(kv.get("MaxTime", "UNLIMITED")),
                nodes=parsing.expand_hostlist(kv.get("Nodes", "")),
                limits=_partition_limits(kv),
            )
        )
    return out


def parse_nodes(stdout: str) -> list[t.Node]:
    out = []
    for kv in _scontrol_records(stdout, "NodeName"):
        gpu_type, gpus_total = "", 0
        for name, typ, count in parsing.parse_gres(kv.get("Gres", "")):
            if name == "gpu":
                gpus_total += count
                gpu_type = gpu_type or typ
        alloc = parsing.parse_tres(kv.get("AllocTRES", ""))
        out.append(
            t.Node(
                name=kv["NodeName"],
                state=kv.get("State", "UNKNOWN").upper(),
                partitions=parsing.split_list(kv.get("Partitions", "")),
                gpu_type=gpu_type,
                gpus_total=gpus_total,
                gpus_allocated=alloc.get("gres/gpu", 0),
                cpus_total=parsing.parse_int(kv.get("CPUTot", "0"), 0) or 0,
                cpus_allocated=parsing.parse_int(kv.get("CPUAlloc", "0"), 0) or 0,
                memory_mb=parsing.parse_int(kv.get("RealMemory", "0"), 0) or 0,
                reason=parsing.null_to_empty(kv.get("Reason", "")),
                features=parsing.split_list(kv.get("AvailableFeatures", "")),  # "(null)": none
            )
        )
    return out


def parse_account_qos(stdout: str) -> dict[str, tuple[str, ...]]:
    """``sacctmgr -n -P show assoc format=Account,QOS`` -> {account: every QOS one of its
    associations (the account's or a user's in it) allows}. An association whose QOS column is
    empty says nothing, so an account with only such rows is left out (nothing known, nothing refused)."""
    out: dict[str, set[str]] = {}
    for line in stdout.splitlines():
        account, sep, qos = line.partition("|")
        if sep and account and qos.strip():
            out.setdefault(account, set()).update(q for q in qos.strip().split(",") if q)
    return {account: tuple(sorted(names)) for account, names in out.items()}


def parse_assoc_mgr_qos(stdout: str) -> tuple[str, ...]:
    """``scontrol show assoc_mgr flags=qos`` -> the QOS names (records start ``QOS=name(id)``)."""
    return tuple(sorted(set(re.findall(r"^QOS=(.+)\(\d+\)\s*$", stdout, re.M))))


def parse_max_array_size(stdout: str) -> int | None:
    """``scontrol show config`` -> MaxArraySize (None when absent)."""
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", stdout, re.M)
    return int(match.group(1)) if match else None


def _config_value(stdout: str, name: str) -> str:
    match = re.search(rf"^{name}\s*=\s*(.*?)\s*$", stdout, re.M)
    return match.group(1) if match else ""


def _over_time(value: str) -> int | None:
    """OverTimeLimit ("0 min", "5", "UNLIMITED"; a partition's "NONE": the cluster's) -> minutes,
    t.OVER_TIME_UNLIMITED, or None (not set)."""
    value = value.strip().upper()
    if value in ("", "NONE", "N/A", "(NULL)"):
        return None
    if value.startswith("UNLIMITED") or value == "INFINITE":
        return t.OVER_TIME_UNLIMITED
    return parsing.parse_int(value.split()[0], None)


def parse_overrun_config(stdout: str) -> tuple[int, int]:
    """``scontrol show config`` -> (OverTimeLimit in minutes or t.OVER_TIME_UNLIMITED, KillWait in
    seconds); Slurm's defaults (0, 30) for what it does not print."""
    over = _over_time(_config_value(stdout, "OverTimeLimit"))
    kill_wait = parsing.parse_int((_config_value(stdout, "KillWait").split() or ["30"])[0], 30)
    return (0 if over is None else over), (30 if kill_wait is None else kill_wait)


def _memory_limit(value: str) -> int | None:
    """DefMemPerGPU / MaxMemPerNode ("UNLIMITED", "(null)", "4096", "4G") -> MiB, None when not set."""
    value = (value or "").strip()
    if not value or value.upper() in ("UNLIMITED", "(NULL)", "NONE", "N/A", "0"):
        return None
    return parsing.parse_memory_mib(value) or None


def _partition_limits(kv: dict[str, str]) -> t.PartitionLimits:
    """One ``scontrol show partition -o`` record -> its PartitionLimits. DefMemPerGPU is in
    ``JobDefaults=DefMemPerGPU=N`` (MiB); OverSubscribe=EXCLUSIVE gives every job whole nodes."""
    match = re.search(r"DefMemPerGPU=(\d+)", kv.get("JobDefaults", ""))
    return t.PartitionLimits(
        exclusive=kv.get("OverSubscribe", "NO").upper().startswith("EXCLUSIVE"),
        exclusive_user=kv.get("ExclusiveUser", "NO").upper() == "YES",
        over_time_limit_minutes=_over_time(kv.get("OverTimeLimit", "NONE")),
        def_mem_per_gpu_mb=int(match.group(1)) if match else None,
        max_mem_per_node_mb=_memory_limit(kv.get("MaxMemPerNode", "")),
    )


def parse_reservations(stdout: str) -> list[t.Reservation]:
    out = []
    for kv in _scontrol_records(stdout, "ReservationName"):
        out.append(
            t.Reservation(
                name=kv["ReservationName"],
                start=parsing.parse_time(kv.get("StartTime", "")),
                end=parsing.parse_time(kv.get("EndTime", "")),
                accounts=parsing.split_list(kv.get("Accounts", "")),
                nodes=parsing.null_to_empty(kv.get("Nodes", "")),
                tres=parsing.null_to_empty(kv.get("TRES", "")),
                state=kv.get("State", "").upper(),
            )
        )
    return out


def parse_associations(assoc_stdout: str, users_stdout: str) -> list[t.Association]:
    """``sacctmgr -n -P show assoc format=Cluster,Account,User,ParentName`` plus
    ``sacctmgr -n -P show user withassoc format=User,DefaultAccount`` (user -> default account)."""
    defaults: dict[str, str] = {}
    for line in users_stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[0]:
            defaults[parts[0]] = parts[1]
    out = []
    for line in assoc_stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 4:
            continue
        cluster, account, user, parent = parts[:4]
        out.append(
            t.Association(
                cluster=cluster,
                account=account,
                user=user,
                is_default=bool(user) and defaults.get(user) == account,
                parent=parent,
            )
        )
    return out


def parse_limits(account: str, stdout: str) -> t.AssociationLimits:
    """``sacctmgr -n -P show assoc where account=A format=Account,User,GrpTRESMins,GrpTRES``."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or parts[0] != account or parts[1]:
            continue  # user rows carry no account limits
        return t.AssociationLimits(
            account=account,
            grp_tres_mins=parsing.parse_tres(parts[2]),
            grp_tres=parsing.parse_tres(parts[3]),
        )
    raise t.SlurmRejected(f"Account {account!r} has no association on this cluster")


def limits_update(current: dict[str, int], wanted: dict[str, int]) -> dict[str, int]:
    """What to set so the managed keys equal ``wanted``: wanted values, plus -1 for every managed key
    (gres/gpu, gres/gpu:<type>) currently set but absent from ``wanted``. Unmanaged keys untouched."""
    update = dict(wanted)
    for key in current:
        if _MANAGED_TRES_RE.match(key) and key not in wanted:
            update[key] = -1
    return update
