"""Typed values exchanged with the Slurm gateway.

Everything the rest of the portal learns from Slurm arrives as one of these frozen dataclasses;
no caller ever sees raw command output or pyslurm objects.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


class SlurmError(Exception):
    """Base class of the gateway's two errors."""

    def __init__(self, message: str, *, command: str = ""):
        super().__init__(message)
        self.message = message
        self.command = command


class SlurmUnavailable(SlurmError):
    """The controller (or slurmdbd) did not answer, or answered too late. Retry later."""


class SlurmRejected(SlurmError):
    """Slurm refused the request; ``message`` is Slurm's own words. Never retried."""


class NotPermitted(SlurmUnavailable):
    """The scheduler's authorizer denied the portal's own account something it asks for (Kubernetes: a
    403 of RBAC, "User ... cannot create resource ..."). The portal asks only for what its account is
    granted, so such a denial means the grant is not in force *now* — an API server that is starting
    answers so until its RBAC caches are synced, a namespace's RoleBinding may be missing or being
    restored — and the request is retried as for a scheduler that does not answer (a SlurmUnavailable),
    never taken for a refusal of the job. ``namespace``: where it was denied ("" cluster-wide)."""

    def __init__(self, message: str, *, command: str = "", namespace: str = ""):
        super().__init__(message, command=command)
        self.namespace = namespace


Option = tuple[str, "str | None"]  # (long option, value or None), as sbatch's command line has it


@dataclass(frozen=True)
class JobRequest:
    """What the portal asks a scheduler to run: ONE value, built once when the job is submitted
    (``portal.slurm.request.job_request``), stored with the job, handed to the gateway unchanged.
    Each backend only translates it (the cli backend: sbatch's argv and stdin; pyslurm: a
    ``JobSubmitDescription``). Times in minutes."""

    # The script exactly as Slurm gets it: the directives the command line replaces (the same option,
    # or one Slurm holds mutually exclusive with it) and those that choose a cluster turned into comments.
    script: str
    # sbatch's command line, in order: the given fields, the portal's output files where the script
    # names none, the team's account and the portal's tag (--comment). Never a cluster option.
    command_line: tuple[Option, ...]
    # Every option Slurm applies, in order: the script's directives the command line leaves, then the
    # command line (what a backend that does not read #SBATCH lines submits).
    options: tuple[Option, ...]
    lines: tuple[int, ...]  # the script's line of each option (0: the command line), for display
    name: str  # the job's name as Slurm holds it (the last --job-name; sbatch's own for none)
    workdir: str  # where the job starts
    submit_dir: str  # where it is submitted from (SLURM_SUBMIT_DIR; sbatch's cwd)
    submit_dir_default: bool = False  # the user's default directory: created, as the user, when missing
    environment: tuple[tuple[str, str], ...] = ()  # the job's own variables (NAME, value), sorted
    # The GPU shape (the estimate and the budget hold count it): GPUs Slurm allocates to one job (one
    # array task), their type ("" any), nodes, the time limit and the array's tasks.
    gpus: int = 0
    gpu_type: str = ""
    nodes: int = 1
    time_limit_minutes: int = 0
    array_tasks: int = 1
    # the portal jobs it waits for (their ids): the relay sends it once each has a Slurm id, as
    # --dependency=afterok on them (JobSubmission.dependency); a script's own --dependency is in ``options``
    depends_on: tuple[str, ...] = ()
    image: str = ""  # the container image a Kubernetes Job runs in ("": the site's default); never Slurm's

    @property
    def variables(self) -> dict[str, str]:
        return dict(self.environment)

    def to_json(self) -> dict:
        """What is stored with the job (Job.request)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["command_line"] = [list(option) for option in self.command_line]
        data["options"] = [list(option) for option in self.options]
        data["lines"] = list(self.lines)
        data["environment"] = dict(self.environment)
        data["depends_on"] = list(self.depends_on)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "JobRequest":
        return cls(**{
            **data,
            "command_line": tuple((option, value) for option, value in data["command_line"]),
            "options": tuple((option, value) for option, value in data["options"]),
            "lines": tuple(data["lines"]),
            "environment": tuple(sorted(data.get("environment", {}).items())),
            "depends_on": tuple(data.get("depends_on", ())),
        })  # fmt: skip


@dataclass(frozen=True)
class JobSubmission:
    """A stored request as the relay hands it to a gateway, with what only the relay knows: the
    booking's reservation (checked when the job is sent) and the Unix ids it runs as (the submitter
    must be root to pass them), the dependency on its parents' Slurm ids (known once each has one)."""

    request: JobRequest
    reservation: str = ""
    uid: int | None = None
    gid: int | None = None
    dependency: str = ""  # afterok:<Slurm ids> of the request's depends_on not yet COMPLETED

    @property
    def relay_options(self) -> list[Option]:
        """The options the relay adds after the request's command line."""
        options: list[Option] = [("dependency", self.dependency)] if self.dependency else []
        options += [("reservation", self.reservation)] if self.reservation else []
        if self.uid is not None:
            options.append(("uid", str(int(self.uid))))
        if self.gid is not None:
            options.append(("gid", str(int(self.gid))))
        return options

    @property
    def command_line(self) -> list[Option]:
        return [*self.request.command_line, *self.relay_options]

    @property
    def options(self) -> list[Option]:
        return [*self.request.options, *self.relay_options]


@dataclass(frozen=True)
class QueueEntry:
    """One job as the controller holds it now (squeue)."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state: str  # Slurm base state, upper case: PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, ...
    reason: str  # pending reason or "None"
    comment: str
    nodes: str  # node list ("" while pending)
    num_nodes: int
    submit_time: dt.datetime | None
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    time_limit_minutes: int | None
    tres_per_node: str  # e.g. "gres:gpu:a100:2"
    reservation: str = ""
    array_job_id: int | None = None  # the array's id (squeue %F) for a row of an array job
    array_tasks: str = ""  # the row's array index ("4") or pending indexes ("5-9", "1,3"); "" if no array
    # The scheduler's priority (squeue %Q): pending jobs are planned highest first. None: not given.
    # A pending job's start_time is the backfill scheduler's expected start (what ``squeue --start``
    # prints: the same %S field), None until it has planned the job.
    priority: int | None = None

    @property
    def gpu_type(self) -> str:
        """The GPU type the job asks for per node ("a100"); "" for any type or no GPUs."""
        for item in self.tres_per_node.split(","):
            parts = item.split(":")  # gres:gpu:a100:2, gres:gpu:2
            if len(parts) >= 3 and parts[1] == "gpu" and not parts[2].isdigit():
                return parts[2]
        return ""


@dataclass(frozen=True)
class AccountingRecord:
    """One job allocation from slurmdbd (sacct -X)."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state: str  # base state, e.g. COMPLETED, FAILED, CANCELLED, TIMEOUT, RUNNING, PENDING
    exit_code: int | None
    submit_time: dt.datetime | None
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    elapsed_seconds: int
    time_limit_minutes: int | None
    num_nodes: int
    nodes: str
    alloc_tres: dict[str, int]  # {"gres/gpu": 2, "gres/gpu:a100": 2, "cpu": 2, "mem": 2048 (MiB), ...}
    req_tres: dict[str, int]
    comment: str
    reservation: str = ""
    cluster: str = ""
    array_job_id: int | None = None  # an array task's array id (JobID 559_3)
    array_tasks: str = ""  # its index ("3"), or the pending indexes of a never-started remainder
    # the signal that ended the batch step (sacct's ExitCode "0:9": 9), 0 for none; None where unknown
    exit_signal: int | None = None

    @property
    def gpus(self) -> int:
        return self.alloc_tres.get("gres/gpu", 0)

    @property
    def gpu_type(self) -> str:
        """The allocated GPU type ("a100"), "" when none or untyped."""
        for key, value in self.alloc_tres.items():
            if key.startswith("gres/gpu:") and value:
                return key.split(":", 1)[1]
        return ""

    @property
    def requested_gpus(self) -> int:
        return self.req_tres.get("gres/gpu", 0)


@dataclass(frozen=True)
class PartitionLimits:
    """A partition's flags that change what a job is allocated or how long it may run past its
    limit (``scontrol show partition``), read with the partition (``Partition.limits``):
    OverSubscribe=EXCLUSIVE (every job gets whole nodes), ExclusiveUser, OverTimeLimit (None: the
    cluster's; OVER_TIME_UNLIMITED), DefMemPerGPU and MaxMemPerNode (MiB; None: not set)."""

    exclusive: bool = False
    exclusive_user: bool = False
    over_time_limit_minutes: int | None = None
    def_mem_per_gpu_mb: int | None = None
    max_mem_per_node_mb: int | None = None


@dataclass(frozen=True)
class Partition:
    name: str
    is_default: bool
    state: str  # UP, DOWN, DRAIN, INACTIVE
    default_time_minutes: int | None
    max_time_minutes: int | None  # None = UNLIMITED
    nodes: tuple[str, ...]
    limits: PartitionLimits = PartitionLimits()  # read in the same call as the rest


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # e.g. IDLE, MIXED, ALLOCATED, DOWN, DRAINED, DRAINING (flags like "+DRAIN" folded in)
    partitions: tuple[str, ...]
    gpu_type: str  # "" when the node has no typed GPUs
    gpus_total: int
    gpus_allocated: int
    cpus_total: int
    cpus_allocated: int
    memory_mb: int
    reason: str = ""
    features: tuple[str, ...] = ()  # AvailableFeatures (--constraint), read in the same call as the rest

    @property
    def available(self) -> bool:
        """True when the node can run new work (not down, drained or draining)."""
        bad = ("DOWN", "DRAIN", "FAIL", "MAINT", "NOT_RESPONDING", "POWER")
        return not any(flag in self.state for flag in bad)


# slurmctld checks running jobs against their time limits every PERIODIC_TIMEOUT seconds
# (src/slurmctld/slurmctld.h, compiled in: 30 in 22.05 and 25.11) and ends a job at the first check
# after its limit plus OverTimeLimit: the end accounting records (measured 2026-12-03, KillWait=5:
# three --time=1 jobs ended together at one check, 14, 21 and 28 s past their limits).
TIME_LIMIT_CHECK_SECONDS = 30
OVER_TIME_UNLIMITED = -1  # OverTimeLimit=UNLIMITED: a job may run past its limit without end


@dataclass(frozen=True)
class ClusterPolicy:
    """What the cluster allows a job beyond partitions and nodes (read once per inventory sync):
    QOS names, the QOS each account's associations may use, MaxArraySize and how far past its time
    limit a job can run (OverTimeLimit, KillWait). Node features and partition limits are read with
    the nodes and partitions (``Node.features``, ``Partition.limits``), not here."""

    qos: tuple[str, ...]
    account_qos: dict[str, tuple[str, ...]]  # account -> QOS its associations allow (union)
    max_array_size: int | None  # None: Slurm did not say
    over_time_limit_minutes: int = 0  # OverTimeLimit (OVER_TIME_UNLIMITED: UNLIMITED); Slurm's default 0
    kill_wait_seconds: int = 30  # KillWait; Slurm's default 30


@dataclass(frozen=True)
class ReservationSpec:
    name: str
    start: dt.datetime
    end: dt.datetime
    accounts: tuple[str, ...]
    nodes: tuple[str, ...] = ()  # whole nodes (Slurm 22.05)
    tres: dict[str, int] = field(default_factory=dict)  # {"gres/gpu:a100": 2} where Slurm supports it
    partition: str = ""
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reservation:
    name: str
    start: dt.datetime | None
    end: dt.datetime | None
    accounts: tuple[str, ...]
    nodes: str
    tres: str
    state: str  # ACTIVE / INACTIVE


@dataclass(frozen=True)
class AssociationLimits:
    """Limits on one account association. None = no limit set."""

    account: str
    grp_tres_mins: dict[str, int] = field(default_factory=dict)  # {"gres/gpu": 6000, "gres/gpu:a100": 3000}
    grp_tres: dict[str, int] = field(default_factory=dict)  # {"gres/gpu": 4}


@dataclass(frozen=True)
class Association:
    """One row of sacctmgr show assoc: an account (user == "") or a user in an account."""

    cluster: str
    account: str
    user: str
    is_default: bool = False  # for user rows: this account is the user's default account
    parent: str = ""
