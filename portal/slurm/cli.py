"""Slurm gateway backend that runs Slurm's own commands (sbatch, squeue, sacct, scontrol, sacctmgr).

Rules kept everywhere in this module:

- argv lists only, never a shell: every value (job name, comment, path, account) is one argv
  element, whatever characters it holds;
- a timeout on every call (``timeout`` seconds); a timeout raises ``SlurmUnavailable``;
- one command per method call (two for ``associations()`` and for ``user_add(default=True)``,
  which need the user table as well as the association table);
- the child's environment is ours plus ``SLURM_CONF``, ``SLURM_TIME_FORMAT=standard`` and
  ``TZ=UTC`` (Slurm prints and reads times in UTC: no ambiguous hour at a DST change), minus
  every ``SBATCH_*``/``SQUEUE_*``/``SACCT_*``/... variable that would silently change what the
  commands do (e.g. ``SQUEUE_USERS`` filters squeue).

Output formats were measured on Slurm 22.05.8; see ``_Quirks`` for the version-specific choices.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import re
import shlex
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass

from . import parsing
from .base import SlurmGateway
from .parsing import FIELD_SEP
from .request import spec_options, spec_script
from .types import (
    AccountingRecord,
    Association,
    AssociationLimits,
    ClusterPolicy,
    JobSpec,
    Node,
    Partition,
    QueueEntry,
    Reservation,
    ReservationSpec,
    SlurmRejected,
    SlurmUnavailable,
)

logger = logging.getLogger(__name__)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")
# Environment variables that change what Slurm's commands do; never inherited by them.
_SCRUBBED_ENV_PREFIXES = ("SBATCH_", "SQUEUE_", "SACCT_", "SINFO_", "SCANCEL_", "SCONTROL_", "SACCTMGR_", "SLURM_")

# squeue -o: comment (%k) is last so that, in theory, a separator inside it cannot shift fields.
# %A: the job's own id (an array task's too), %F: its array's id, %K: the array index(es) of the row
QUEUE_FIELDS = ("%i", "%u", "%a", "%P", "%T", "%r", "%N", "%D", "%V", "%S", "%e", "%l", "%b", "%v", "%A", "%F", "%K", "%j", "%k")
QUEUE_FORMAT = FIELD_SEP.join(QUEUE_FIELDS)

# sacct -o: free-text fields (JobName, Comment) last, Comment very last.
SACCT_FIELDS = (
    "JobIDRaw", "User", "Account", "Partition", "State", "ExitCode", "Submit", "Start", "End",
    "ElapsedRaw", "TimelimitRaw", "NNodes", "NodeList", "AllocTRES", "ReqTRES", "Reservation",
    "Cluster", "JobID", "JobName", "Comment",
)  # fmt: skip

# How far back find_by_comment() looks in accounting once the job left the controller.

# Keys of GrpTRES/GrpTRESMins the portal manages (and clears when absent).
_MANAGED_TRES_RE = re.compile(r"^gres/gpu(:[^=,]+)?$")


# ==============================================================================================
# Version-specific choices: the ONE place that knows how Slurm releases differ.
# ==============================================================================================
@dataclass(frozen=True)
class _Quirks:
    """What differs between the Slurm versions this backend talks to.

    Measured on 22.05.8 (Debian 12). Newer releases (Debian 13 ships 24.x) were not measured here:
    re-check squeue/sacct field output before trusting them."""

    version: str
    # 22.05 rejects TRES=gres/gpu=N in reservations ("not supported with reservations");
    # newer Slurm accepts them (pyslurm 25.11's own tests reserve TRES=cpu=2,gres/gpu=2).
    reservation_gpu_tres: bool

    @classmethod
    def for_version(cls, version: str) -> _Quirks:
        match = re.match(r"(\d+)\.(\d+)", version)
        major, minor = (int(match[1]), int(match[2])) if match else (0, 0)
        number = major * 100 + minor
        return cls(version=version, reservation_gpu_tres=number >= 2305)


# ==============================================================================================


def _clean_env(slurm_conf: str, lib_dir: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
    conf = slurm_conf or os.environ.get("SLURM_CONF", "")
    if conf:
        env["SLURM_CONF"] = conf
    if lib_dir:  # the cluster's libslurm first (a Slurm built elsewhere than the system's)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib_dir, env.get("LD_LIBRARY_PATH", "")) if p)
    env["SLURM_TIME_FORMAT"] = "standard"  # 2024-05-01T12:34:56, in TZ's zone:
    env["TZ"] = "UTC"  # every time the gateway parses or sends (parsing.parse_time/format_time)
    return env


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


# --- output parsers (pure, unit-tested on captured output) --------------------------------------


def parse_job_id(stdout: str) -> int:
    """``sbatch --parsable`` prints "123" or "123;cluster"."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job_id = parsing.parse_int(first.split(";", 1)[0], None)
    if job_id is None:
        raise SlurmRejected(f"sbatch printed no job id: {stdout!r}")
    return job_id


def parse_queue(stdout: str) -> list[QueueEntry]:
    entries = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split(FIELD_SEP, len(QUEUE_FIELDS) - 1)
        if len(fields) != len(QUEUE_FIELDS):
            logger.warning("squeue line with %d fields ignored: %r", len(fields), line)
            continue
        (job_id, user, account, partition, state, reason, nodes, num_nodes, submit, start, end,
         limit, tres, reservation, own_id, array_id, array_index, name, comment) = fields  # fmt: skip
        job_id_int = parsing.parse_int(own_id, None)
        if job_id_int is None:
            job_id_int = parsing.parse_int(job_id, None)
        if job_id_int is None:
            continue
        array_tasks = "" if array_index.strip() in ("", "N/A") else array_index.strip().split("%")[0]
        entries.append(
            QueueEntry(
                array_job_id=parsing.parse_int(array_id, None) if array_tasks else None,
                array_tasks=array_tasks,
                job_id=job_id_int,
                name=name,
                user=user,
                account=account,
                partition=partition,
                state=parsing.base_state(state),
                reason=reason,
                comment="" if comment == "(null)" else comment,
                nodes=parsing.null_to_empty(nodes),
                num_nodes=parsing.parse_int(num_nodes, 0) or 0,
                submit_time=parsing.parse_time(submit),
                start_time=parsing.parse_time(start),
                end_time=parsing.parse_time(end),
                time_limit_minutes=parsing.parse_duration_minutes(limit),
                tres_per_node=parsing.tres_per_node(tres),
                reservation=parsing.null_to_empty(reservation),
            )
        )
    return entries


def parse_sacct(stdout: str) -> list[AccountingRecord]:
    records = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split(FIELD_SEP, len(SACCT_FIELDS) - 1)
        if len(fields) != len(SACCT_FIELDS):
            logger.warning("sacct line with %d fields ignored: %r", len(fields), line)
            continue
        (job_id, user, account, partition, state, exit_code, submit, start, end, elapsed, limit,
         num_nodes, nodes, alloc_tres, req_tres, reservation, cluster, array_job, name, comment) = fields  # fmt: skip
        job_id_int = parsing.parse_int(job_id, None)
        if job_id_int is None:
            continue
        array_base, underscore, array_tasks = array_job.partition("_")  # "559_3", "559_[2-3%2]"
        array_tasks = array_tasks.strip("[]").split("%")[0] if underscore else ""
        records.append(
            AccountingRecord(
                array_job_id=parsing.parse_int(array_base, None) if array_tasks else None,
                array_tasks=array_tasks,
                job_id=job_id_int,
                name=name,
                user=user,
                account=account,
                partition=partition,
                state=parsing.base_state(state),
                exit_code=parsing.parse_exit_code(exit_code),
                submit_time=parsing.parse_time(submit),
                start_time=parsing.parse_time(start),
                end_time=parsing.parse_time(end),
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


def parse_partitions(stdout: str) -> list[Partition]:
    out = []
    for line in stdout.splitlines():
        if not line.startswith("PartitionName="):
            continue
        kv = parsing.parse_kv_line(line)
        out.append(
            Partition(
                name=kv["PartitionName"],
                is_default=kv.get("Default", "NO").upper() == "YES",
                state=kv.get("State", "UNKNOWN").upper(),
                default_time_minutes=parsing.parse_duration_minutes(kv.get("DefaultTime", "NONE")),
                max_time_minutes=parsing.parse_duration_minutes(kv.get("MaxTime", "UNLIMITED")),
                nodes=parsing.expand_hostlist(kv.get("Nodes", "")),
            )
        )
    return out


def parse_nodes(stdout: str) -> list[Node]:
    out = []
    for line in stdout.splitlines():
        if not line.startswith("NodeName="):
            continue
        kv = parsing.parse_kv_line(line)
        gpu_type, gpus_total = "", 0
        for name, typ, count in parsing.parse_gres(kv.get("Gres", "")):
            if name == "gpu":
                gpus_total += count
                gpu_type = gpu_type or typ
        alloc = parsing.parse_tres(kv.get("AllocTRES", ""))
        out.append(
            Node(
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
            )
        )
    return out


def parse_node_features(stdout: str) -> dict[str, tuple[str, ...]]:
    """``scontrol show node -o`` -> {node: AvailableFeatures} (``(null)``: none)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("NodeName="):
            kv = parsing.parse_kv_line(line)
            out[kv["NodeName"]] = parsing.split_list(kv.get("AvailableFeatures", ""))
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


def parse_reservations(stdout: str) -> list[Reservation]:
    out = []
    for line in stdout.splitlines():
        if not line.startswith("ReservationName="):
            continue  # "No reservations in the system"
        kv = parsing.parse_kv_line(line)
        out.append(
            Reservation(
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


def parse_associations(assoc_stdout: str, users_stdout: str) -> list[Association]:
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
            Association(
                cluster=cluster,
                account=account,
                user=user,
                is_default=bool(user) and defaults.get(user) == account,
                parent=parent,
            )
        )
    return out


def parse_limits(account: str, stdout: str) -> AssociationLimits:
    """``sacctmgr -n -P show assoc where account=A format=Account,User,GrpTRESMins,GrpTRES``."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or parts[0] != account or parts[1]:
            continue  # user rows carry no account limits
        return AssociationLimits(
            account=account,
            grp_tres_mins=parsing.parse_tres(parts[2]),
            grp_tres=parsing.parse_tres(parts[3]),
        )
    raise SlurmRejected(f"Account {account!r} has no association on this cluster")


def limits_update(current: dict[str, int], wanted: dict[str, int]) -> dict[str, int]:
    """What to set so the managed keys equal ``wanted``: wanted values, plus -1 for every managed key
    (gres/gpu, gres/gpu:<type>) currently set but absent from ``wanted``. Unmanaged keys untouched."""
    update = dict(wanted)
    for key in current:
        if _MANAGED_TRES_RE.match(key) and key not in wanted:
            update[key] = -1
    return update


# --- the gateway -------------------------------------------------------------------------------


class CliGateway(SlurmGateway):
    name = "cli"

    def __init__(self, *, cluster: str, timeout: int, slurm_conf: str = "", bin_dir: str = "", lib_dir: str = ""):
        self.cluster = cluster
        self.timeout = timeout
        self.slurm_conf = slurm_conf
        self.bin_dir = bin_dir
        self._env = _clean_env(slurm_conf, lib_dir)

    # -- plumbing --------------------------------------------------------------------------------

    def _exe(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(
        self, argv: list[str], *, stdin: str | None = None, ok_patterns: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> str:
        """Run one Slurm command; return its stdout or raise SlurmUnavailable / SlurmRejected.

        ``ok_patterns``: words that make a nonzero exit an idempotent success (e.g. sacctmgr's
        "Nothing new added." on stdout, with nothing on stderr)."""
        command = os.path.basename(argv[0])
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env=self._env if env is None else env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"{command} did not answer within {self.timeout} s", command=command) from exc
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise SlurmUnavailable(f"{command} cannot be run: {exc}", command=command) from exc
        elapsed_ms = (time.monotonic() - started) * 1000
        logger.debug("%s rc=%s in %.1f ms", command, proc.returncode, elapsed_ms)
        if proc.returncode == 0:
            return proc.stdout
        if ok_patterns and is_idempotent_success(proc.stdout, proc.stderr, ok_patterns):
            return proc.stdout
        raise parsing.classify_failure(
            returncode=proc.returncode, stderr=proc.stderr, stdout=proc.stdout, command=command
        )

    @functools.cached_property
    def _quirks(self) -> _Quirks:
        return _Quirks.for_version(self.version())

    # -- basics ----------------------------------------------------------------------------------

    def version(self) -> str:
        out = self._run([self._exe("sinfo"), "--version"])
        return out.strip().split()[-1] if out.strip() else ""

    def ping(self) -> bool:
        try:
            out = self._run([self._exe("scontrol"), "ping"])
        except SlurmRejected as exc:  # scontrol ping exits 1 when a controller is DOWN
            raise SlurmUnavailable(exc.message, command="scontrol") from exc
        if "is UP" not in out:
            raise SlurmUnavailable(out.strip() or "slurmctld is not responding", command="scontrol")
        return True

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> int:
        argv = sbatch_argv(spec, self._exe("sbatch"))
        script = render_script(spec_script(spec), spec.environment)
        return parse_job_id(self._run(argv, stdin=script))

    def cancel(self, job_id: int) -> None:
        self._run([self._exe("scancel"), str(int(job_id))], ok_patterns=parsing.ALREADY_GONE_PATTERNS)

    def cancel_array_task(self, array_job_id: int, index: int) -> None:
        self._run([self._exe("scancel"), f"{int(array_job_id)}_{int(index)}"], ok_patterns=parsing.ALREADY_GONE_PATTERNS)

    def queue(self) -> list[QueueEntry]:
        out = self._run([self._exe("squeue"), "-h", "-a", "-t", "all", "-o", QUEUE_FORMAT])
        return parse_queue(out)

    def accounting(
        self, start: dt.datetime, end: dt.datetime, *, job_ids: Collection[int] | None = None
    ) -> list[AccountingRecord]:
        argv = [
            self._exe("sacct"), "-X", "-a", "--parsable2", "--noheader", f"--delimiter={FIELD_SEP}",
            "-S", parsing.format_time(start), "-E", parsing.format_time(end),
            "-o", ",".join(SACCT_FIELDS),
        ]  # fmt: skip
        if job_ids is not None:
            if not job_ids:
                return []
            argv += ["-j", ",".join(str(int(job_id)) for job_id in sorted(job_ids))]
        if self.cluster:
            argv += ["-M", self.cluster]
        return parse_sacct(self._run(argv))

    # -- inventory -------------------------------------------------------------------------------

    def partitions(self) -> list[Partition]:
        return parse_partitions(self._run([self._exe("scontrol"), "show", "partition", "-o"]))

    def nodes(self) -> list[Node]:
        return parse_nodes(self._run([self._exe("scontrol"), "show", "node", "-o"]))

    def policy(self) -> ClusterPolicy:
        """Four calls: the QOS slurmctld holds (``scontrol show assoc_mgr flags=qos``: 10 ms, where
        ``sacctmgr show qos`` asks slurmdbd), sacctmgr show assoc, scontrol show config and node."""
        qos = self._run([self._exe("scontrol"), "show", "assoc_mgr", "flags=qos"])
        assoc = self._sacctmgr("show", "assoc", f"cluster={self.cluster}", "format=Account,QOS")
        config = self._run([self._exe("scontrol"), "show", "config"])
        nodes = self._run([self._exe("scontrol"), "show", "node", "-o"])
        return ClusterPolicy(
            qos=parse_assoc_mgr_qos(qos),
            account_qos=parse_account_qos(assoc),
            node_features=parse_node_features(nodes),
            max_array_size=parse_max_array_size(config),
        )

    # -- reservations ----------------------------------------------------------------------------

    @property
    def reservations_support_gpu_counts(self) -> bool:
        return self._quirks.reservation_gpu_tres

    def reservation_argv(self, spec: ReservationSpec) -> list[str]:
        check_text(spec.name, "Reservation name")
        argv = [
            self._exe("scontrol"), "create", "reservation",
            f"ReservationName={spec.name}",
            f"StartTime={parsing.format_time(spec.start)}",
            f"EndTime={parsing.format_time(spec.end)}",
            f"Accounts={','.join(spec.accounts)}",
        ]  # fmt: skip
        if spec.nodes:
            argv.append(f"Nodes={','.join(spec.nodes)}")
        elif spec.tres:
            gpu_keys = [key for key in spec.tres if key.startswith("gres/gpu")]
            if gpu_keys and not self._quirks.reservation_gpu_tres:
                raise SlurmRejected(
                    f"Slurm {self._quirks.version} cannot reserve GPU counts (TRES={parsing.format_tres(spec.tres)});"
                    " reserve whole nodes instead",
                    command="scontrol",
                )
            argv.append(f"TRES={parsing.format_tres(spec.tres)}")
        if spec.partition:
            argv.append(f"PartitionName={spec.partition}")
        if spec.flags:
            argv.append(f"Flags={','.join(spec.flags)}")
        return argv

    def reservation_create(self, spec: ReservationSpec) -> str:
        out = self._run(self.reservation_argv(spec))
        match = re.search(r"Reservation created:\s*(\S+)", out)
        return match[1] if match else spec.name

    def reservation_delete(self, name: str) -> None:
        check_text(name, "Reservation name")
        self._run(
            [self._exe("scontrol"), "delete", f"ReservationName={name}"],
            ok_patterns=parsing.RESERVATION_MISSING_PATTERNS,
        )

    def reservation_list(self) -> list[Reservation]:
        return parse_reservations(self._run([self._exe("scontrol"), "show", "reservation", "-o"]))

    # -- associations ----------------------------------------------------------------------------

    def _sacctmgr(self, *args: str, ok: bool = False) -> str:
        return self._run(
            [self._exe("sacctmgr"), "-i", "-n", "-P", *args],
            ok_patterns=parsing.NOTHING_TO_DO_PATTERNS if ok else (),
        )

    def associations(self) -> list[Association]:
        assoc = self._sacctmgr("show", "assoc", f"cluster={self.cluster}", "format=Cluster,Account,User,ParentName")
        users = self._sacctmgr("show", "user", "withassoc", f"cluster={self.cluster}", "format=User,DefaultAccount")
        return parse_associations(assoc, users)

    def account_add(self, account: str, *, description: str = "", parent: str = "") -> None:
        check_text(account, "Account")
        args = ["add", "account", account, f"Cluster={self.cluster}"]
        if description:
            args.append(f"Description={check_text(description, 'Description')}")
        if parent:
            args.append(f"Parent={check_text(parent, 'Parent account')}")
        self._sacctmgr(*args, ok=True)

    def account_remove(self, account: str) -> None:
        self._sacctmgr("remove", "account", "where", f"name={check_text(account, 'Account')}",
                       f"cluster={self.cluster}", ok=True)  # fmt: skip

    def user_add(self, user: str, account: str, *, default: bool = False) -> None:
        check_text(user, "User")
        check_text(account, "Account")
        args = ["add", "user", user, f"Account={account}", f"Cluster={self.cluster}"]
        if default:
            args.append(f"DefaultAccount={account}")
        self._sacctmgr(*args, ok=True)
        if default:
            # "add user" ignores DefaultAccount for a user who exists already.
            self._sacctmgr("modify", "user", "where", f"name={user}", f"cluster={self.cluster}",
                           "set", f"DefaultAccount={account}", ok=True)  # fmt: skip

    def user_remove(self, user: str, account: str) -> None:
        self._sacctmgr("remove", "user", "where", f"name={check_text(user, 'User')}",
                       f"account={check_text(account, 'Account')}", f"cluster={self.cluster}", ok=True)  # fmt: skip

    def association_limits_get(self, account: str) -> AssociationLimits:
        out = self._sacctmgr("show", "assoc", "where", f"account={check_text(account, 'Account')}",
                             f"cluster={self.cluster}", "format=Account,User,GrpTRESMins,GrpTRES")  # fmt: skip
        return parse_limits(account, out)

    def association_limits_set(self, limits: AssociationLimits) -> None:
        current = self.association_limits_get(limits.account)
        mins = limits_update(current.grp_tres_mins, limits.grp_tres_mins)
        tres = limits_update(current.grp_tres, limits.grp_tres)
        settings = []
        if mins:
            settings.append(f"GrpTRESMins={parsing.format_tres(mins)}")
        if tres:
            settings.append(f"GrpTRES={parsing.format_tres(tres)}")
        if not settings:
            return
        self._sacctmgr("modify", "account", "where", f"name={limits.account}", f"cluster={self.cluster}",
                       "set", *settings, ok=True)  # fmt: skip

    def account_usage_reset(self, account: str) -> None:
        self._sacctmgr("modify", "account", "where", f"name={check_text(account, 'Account')}",
                       f"cluster={self.cluster}", "set", "RawUsage=0", ok=True)  # fmt: skip

    # -- reports ---------------------------------------------------------------------------------

    def account_gpu_minutes(self, start: dt.datetime, end: dt.datetime) -> dict[str, int]:
        argv = sreport_argv(start, end, cluster=self.cluster, sreport=self._exe("sreport"))
        return parsing.parse_account_minutes(self._run(argv))


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


def is_idempotent_success(stdout: str, stderr: str, ok_patterns: tuple[str, ...]) -> bool:
    """A nonzero exit that only says "already so".

    sacctmgr prints " Nothing new added." on stdout both when the thing exists (fine) and when the
    request was wrong (e.g. the account does not exist): then it also writes an error to stderr, so
    an idempotent success needs the words and an empty stderr. scancel/scontrol print their
    "already gone" words on stderr, where they are the whole message."""
    err = stderr.strip()
    if err:
        return parsing.matches_any(err, ok_patterns) and not parsing.is_unavailable_message(err)
    return parsing.matches_any(stdout, ok_patterns)
