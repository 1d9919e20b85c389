"""Slurm gateway backend on pyslurm 25.11 (libslurm of the same major.minor: Slurm 25.11).

Written against pyslurm 25.11.2 (PySlurm/pyslurm: pyslurm/core/job/submission.pyx, job.pyx,
node.pyx, partition.pyx, reservation.pyx, slurmctld/base.pyx, core/error.pyx) and proven against
the local Slurm 25.11.7 cluster (``scripts/cluster up --slurm 25.11``; ``scripts/pyslurm`` builds
pyslurm into the venv): tests/slurm/test_gateway_contract.py runs on it.

libslurm holds ONE configuration per process: pyslurm reads ``SLURM_CONF`` when imported. A
gateway given a ``slurm_conf`` (re)initialises libslurm with that file (``_libslurm_for``), so a
process whose environment names another cluster's SLURM_CONF still talks to the right one; two
pyslurm gateways for two clusters cannot live in one process.

Where pyslurm 25.11 lacks what the portal needs, this backend delegates to the CLI backend
(``self._cli``), call by call:

- ``accounting()`` (and the accounting half of ``find_by_comment()``): ``pyslurm.db.Job`` has no
  AllocTRES/ReqTRES (``tres_allocated``/``tres_requested`` are commented out in db/job.pyx), and
  GPU counts and types are what the portal bills;
- associations, accounts, users, limits and usage reset: pyslurm 25.11.0 has no released API to
  create accounts/users or modify association limits (``pyslurm.db.Associations`` is "WIP,
  unreleased" on the 25.11.x branch);
- ``version()``: Slurm's version string (``sinfo --version`` needs no controller);
- ``partitions()``: ``Partition.over_time_limit`` cannot tell OverTimeLimit=0 from none set (see
  ``partitions``); the partitions and their limits are one ``scontrol show partition``;
- ``policy()``: QOS (slurmctld's assoc_mgr), the account's QOS (sacctmgr), MaxArraySize,
  OverTimeLimit and KillWait (scontrol show config); node features come with ``nodes()``
  (``Node.available_features``);
- ``submit()`` of a request pyslurm cannot submit as sbatch would (pyslurm_request.NotExpressible:
  e.g. ``--hint``, ``--mem=0``, ``--begin=now+1hour``).

libslurm calls block with their own timeouts (MessageTimeout and retries); every pyslurm call runs
in a daemon thread and is abandoned after ``timeout`` seconds with ``SlurmUnavailable``.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, TypeVar

from . import parsing
from . import types as t
from .base import SlurmGateway
from .cli import CliGateway, check_script, check_text, submit_dir_of
from .pyslurm_request import NotExpressible, description_kwargs, description_environment

T = TypeVar("T")

_libslurm_lock = threading.Lock()
_DEFAULT_CONF = "(libslurm's default)"
_libslurm_conf: str | None = None  # what libslurm was initialised with; "" not at all; None unknown
_imported_without_init = False  # this module imported pyslurm (with its auto-init off)


def _import_pyslurm() -> Any:
    """``import pyslurm`` without its automatic slurm_init(): libslurm exits the whole process
    (fatal()) when SLURM_CONF names no readable file, so the portal initialises it itself."""
    global _imported_without_init
    if "pyslurm" in sys.modules:  # imported before (by us, or by someone else: then auto-initialised)
        return sys.modules["pyslurm"]
    saved = os.environ.get("PYSLURM_DISABLE_AUTO_INIT")
    os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"
    try:
        import pyslurm  # noqa: PLC0415 - ImportError tells get_gateway() pyslurm is missing
    finally:
        if saved is None:
            del os.environ["PYSLURM_DISABLE_AUTO_INIT"]
        else:
            os.environ["PYSLURM_DISABLE_AUTO_INIT"] = saved
    _imported_without_init = True
    return pyslurm


def pyslurm_version() -> str | None:
    """The installed pyslurm's version ("25.11.2"), None when it is not installed. pyslurm X.Y.z
    talks only to Slurm X.Y (it is built against that libslurm)."""
    try:
        return str(_import_pyslurm().__version__)
    except ImportError:
        return None


def _libslurm_for(slurm_conf: str) -> Any:
    """Import pyslurm with libslurm initialised from ``slurm_conf`` (or SLURM_CONF when empty).

    pyslurm's import runs slurm_init() with the environment's SLURM_CONF (unless
    PYSLURM_DISABLE_AUTO_INIT is set); when that is another file, libslurm is finalised and
    initialised again with ours (pyslurm.slurm_fini/slurm_init)."""
    global _libslurm_conf
    with _libslurm_lock:
        pyslurm = _import_pyslurm()
        if not hasattr(pyslurm, "slurm_init"):  # tests' error-mapping fake
            return pyslurm
        environment = os.environ.get("SLURM_CONF") or _DEFAULT_CONF
        if _libslurm_conf is None:
            _libslurm_conf = "" if _imported_without_init else environment
        wanted = slurm_conf or environment
        if wanted != _libslurm_conf:
            if _libslurm_conf:
                pyslurm.slurm_fini()
            pyslurm.slurm_init(None if wanted == _DEFAULT_CONF else wanted)
            _libslurm_conf = wanted
        return pyslurm


# scontrol's reservation flag names -> pyslurm.ReservationFlags member names.
RESERVATION_FLAGS = {
    "MAINT": "MAINTENANCE",
    "MAINTENANCE": "MAINTENANCE",
    "MAGNETIC": "MAGNETIC",
    "FLEX": "FLEX",
    "IGNORE_JOBS": "IGNORE_RUNNING_JOBS",
    "ANY_NODES": "ANY_NODES",
    "STATIC_ALLOC": "STATIC_NODES",
    "PART_NODES": "PARTITION_NODES_ONLY",
    "PURGE_COMP": "PURGE",
    "SPEC_NODES": "SPECIFIC_NODES",
    "NO_HOLD_JOBS_AFTER_END": "NO_JOB_HOLD_AFTER_END",
    "OVERLAP": "OVERLAP",
    "ALL_NODES": "ALL_NODES",
}


def _ts(value: Any) -> dt.datetime | None:
    """pyslurm times are unix timestamps (int) or None."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.astimezone()
    if isinstance(value, int | float) and value > 0:
        return dt.datetime.fromtimestamp(value, dt.UTC)
    return None


def _minutes(value: Any) -> int | None:
    """pyslurm minutes: int, or "UNLIMITED"/None."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _gres_count(value: Any) -> int:
    """Values of pyslurm's GRES dicts: int, or {"count": "2", "indexes": "0-1"} with IDX."""
    if isinstance(value, dict):
        value = value.get("count", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _gres_to_tres_per_node(gres: dict[str, Any] | None) -> str:
    """{"gres/gpu:a100": 2} (pyslurm 25.11.2's keys) or {"gpu:a100": 2} -> "gres:gpu:a100:2" (the
    form squeue's %b prints)."""
    if not gres:
        return ""
    return ",".join(f"gres:{key.removeprefix('gres/')}:{_gres_count(value)}" for key, value in gres.items())


def controller_addresses(slurm_conf: str) -> list[tuple[str, int]]:
    """(address, port) of every SlurmctldHost in slurm.conf: ``SlurmctldHost=name(addr)`` or ``=name``,
    ``SlurmctldPort=6817`` or a range (its first port). [] when the file cannot be read."""
    try:
        text = Path(slurm_conf).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    hosts, port = [], 6817
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].strip().partition("=")
        key, value = key.strip().lower(), value.strip()
        if key == "slurmctldhost" and value:
            name, _, addr = value.partition("(")
            hosts.append(addr.rstrip(")").strip() or name.strip())
        elif key == "slurmctldport" and value:
            try:
                port = int(value.split("-", 1)[0])
            except ValueError:
                return []
    return [(host, port) for host in hosts]


_environ_lock = threading.Lock()
# A call within this long of one that got slurmctld's answer skips the TCP probe (_controller_answers):
# each probe is a connection slurmctld accepts and reads to its end, ~0.65 ms of its CPU, a quarter of
# what a submission costs it (bench/results.md, twenty-seventh session); slurmctld takes submissions
# one at a time, so in a relay round of many jobs the probe was the controller's largest avoidable cost.
PROBE_SKIP_AFTER_ANSWER_SECONDS = 1.0


def _without_process_slurm_env(submit: Callable[[], T]) -> T:
    """Run ``submit`` with this process's own SLURM_* variables out of os.environ. pyslurm 25.11.2
    copies every one of them into the job (submission.pyx ``_set_environment``, whatever the
    description's environment): the portal's settings (SLURM_BACKEND, SLURM_TIMEOUT, ...) and any
    SLURM_* the process inherited (an input of srun or squeue inside the job) would reach every job.
    sbatch (the cli backend) runs with them scrubbed (cli._clean_env). The description carries the
    SLURM_* variables the job needs (pyslurm_request.description_environment)."""
    with _environ_lock:
        saved = {name: os.environ.pop(name) for name in [n for n in os.environ if n.startswith("SLURM_")]}
        try:
            return submit()
        finally:
            os.environ.update(saved)


def _process_umask() -> str:
    """This process's umask as sbatch passes it (SLURM_UMASK, "0022"), read without changing it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return "0" + line.split()[1][-3:]
    except OSError:
        pass
    return "0022"


class PyslurmGateway(SlurmGateway):
    name = "pyslurm"

    def __init__(self, *, cluster: str, timeout: int, slurm_conf: str = "", bin_dir: str = ""):
        self._pyslurm = _libslurm_for(slurm_conf)
        self._controllers = controller_addresses(slurm_conf or os.environ.get("SLURM_CONF", ""))
        self._answered_at = 0.0  # time.monotonic() of the last call slurmctld answered (_call)
        self.cluster = cluster
        self.timeout = timeout
        self._cli = CliGateway(cluster=cluster, timeout=timeout, slurm_conf=slurm_conf, bin_dir=bin_dir)
        self._slurm_conf = slurm_conf or os.environ.get("SLURM_CONF", "")

    # -- plumbing --------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one pyslurm call with the gateway's timeout and error mapping.

        pyslurm 25.11.2 calls libslurm without releasing the GIL, so a call blocked in libslurm
        freezes every thread of the process and the thread join below cannot end it early: libslurm
        retries a refused connection for MessageTimeout seconds (measured: 10 s with the local
        clusters' MessageTimeout=10 under a 5 s SLURM_TIMEOUT). A stopped controller is therefore
        detected first, by a TCP connect to slurmctld's address (``_controller_answers``), unless a call
        got its answer within PROBE_SKIP_AFTER_ANSWER_SECONDS (a burst of submissions probes once); a
        controller that stops inside that second costs one blocked call, after which every call probes
        again until one succeeds. A controller that accepts but hangs still blocks the process for up
        to MessageTimeout."""
        answered = time.monotonic() - self._answered_at < PROBE_SKIP_AFTER_ANSWER_SECONDS
        if not answered and not self._controller_answers():
            raise t.SlurmUnavailable(f"{what}: slurmctld does not accept connections ({self._controllers_text()})",
                                   command=what)  # fmt: skip
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=target, name=f"pyslurm-{what}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            self._answered_at = 0.0
            raise t.SlurmUnavailable(f"{what}: Slurm did not answer within {self.timeout} s", command=what)
        if "error" in box:
            error = self._map_error(what, box["error"])
            if isinstance(error, t.SlurmUnavailable):
                self._answered_at = 0.0  # the next call probes again
            raise error from box["error"]
        self._answered_at = time.monotonic()
        return box["result"]

    def _controller_answers(self) -> bool:
        """Some slurmctld of the cluster accepts a TCP connection (True when slurm.conf names none)."""
        if not self._controllers:
            return True
        for host, port in self._controllers:
            try:
                socket.create_connection((host, port), timeout=min(self.timeout, 2)).close()
                return True
            except OSError:
                continue
        return False

    def _controllers_text(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self._controllers)

    def _map_error(self, what: str, exc: BaseException) -> BaseException:
        """pyslurm.RPCError (errno, msg) -> SlurmUnavailable / SlurmRejected; ValueError (pyslurm's
        own validation of a description) -> SlurmRejected; anything else is a bug: re-raised."""
        if isinstance(exc, self._pyslurm.RPCError):
            errno = getattr(exc, "errno", None)
            message = str(getattr(exc, "msg", None) or exc)
            if errno in parsing.UNAVAILABLE_ERRNOS or parsing.is_unavailable_message(message):
                return t.SlurmUnavailable(message, command=what)
            return t.SlurmRejected(message, command=what)
        if isinstance(exc, ValueError):
            return t.SlurmRejected(str(exc), command=what)
        return exc

    @staticmethod
    def _values(collection: Any) -> Iterable[Any]:
        """pyslurm collections are (multi-cluster) maps; db collections may be lists."""
        return collection.values() if hasattr(collection, "values") else collection

    # -- basics ----------------------------------------------------------------------------------

    def version(self) -> str:
        return self._cli.version()

    def ping(self) -> bool:
        response = self._call("ping", lambda: self._pyslurm.slurmctld.ping_primary())
        if not getattr(response, "is_responding", False):
            raise t.SlurmUnavailable("slurmctld is not responding", command="ping")
        return True

    # -- jobs ------------------------------------------------------------------------------------

    def job_description(self, submission: t.JobSubmission, script_path: str) -> Any:
        """The JobSubmitDescription for a submission's effective request (the script's #SBATCH lines
        and the portal's options, pyslurm_request); the script is passed as a file path (see submit).
        Raises NotExpressible when pyslurm cannot submit the request as sbatch would."""
        check_text(submission.request.name, "Job name")
        kwargs = description_kwargs(submission)
        kwargs |= description_environment(submission, submit_dir=submit_dir_of(submission.request), slurm_conf=self._slurm_conf,
                                          host=socket.gethostname(), umask=_process_umask(),
                                          nice=os.getpriority(os.PRIO_PROCESS, 0))  # fmt: skip
        return self._pyslurm.JobSubmitDescription(script=script_path, **kwargs)

    def submit(self, submission: t.JobSubmission) -> int:
        """pyslurm gets the script as Slurm gets it from sbatch (the request's ``script``: the
        directives the command line replaces commented out) and the effective request as attributes. A request pyslurm cannot express is submitted by the cli backend:
        the one place that decides it (pyslurm_request's docstring lists those options)."""
        script = check_script(submission.request.script)
        # pyslurm's `script` is "a path or the script's content": it first tries Path(script).is_file()
        # and reads that file. Passing content would let a job "script" that happens to be a path
        # make the portal read (as root) and submit any file, and long content raises
        # ENAMETOOLONG in Python 3.11's pathlib. So the script always goes through our own file.
        with tempfile.NamedTemporaryFile("w", prefix="gpuportal-job-", suffix=".sh", encoding="utf-8") as handle:
            handle.write(script)
            handle.flush()
            try:
                desc = self.job_description(submission, handle.name)
            except NotExpressible:
                return self._cli.submit(submission)
            return int(self._call("submit", lambda: _without_process_slurm_env(desc.submit)))

    def cancel(self, job_id: int) -> None:
        def cancel() -> None:
            try:
                self._pyslurm.Job(int(job_id)).cancel()
            except self._pyslurm.RPCError as exc:
                message = str(getattr(exc, "msg", None) or exc)
                if getattr(exc, "errno", None) in parsing.GONE_ERRNOS or parsing.matches_any(
                    message, parsing.ALREADY_GONE_PATTERNS
                ):
                    return
                raise

        self._call("cancel", cancel)

    def admin_comment_set(self, job_id: int, text: str) -> None:
        # scontrol's documented update (as the inventory reads): one call per policy cancel, rare
        self._cli.admin_comment_set(job_id, text)

    def queue(self) -> list[t.QueueEntry]:
        jobs = self._call("queue", lambda: self._pyslurm.Jobs.load())
        out = []
        for job in self._values(jobs):
            out.append(
                t.QueueEntry(
                    job_id=int(job.id),
                    name=job.name or "",
                    user=job.user_name or "",
                    account=job.account or "",
                    partition=job.partition or "",
                    state=parsing.base_state(job.state or ""),
                    reason=job.state_reason or "None",
                    comment=job.comment or "",
                    nodes=job.allocated_nodes or "",
                    num_nodes=job.num_nodes or 0,
                    submit_time=_ts(job.submit_time),
                    start_time=_ts(job.start_time),
                    end_time=_ts(job.end_time),
                    time_limit_minutes=_minutes(job.time_limit),
                    tres_per_node=_gres_to_tres_per_node(job.gres_per_node),
                    reservation=job.reservation or "",
                    priority=job.priority,
                )
            )
        return out

    def accounting(
        self, start: dt.datetime, end: dt.datetime, *, job_ids: Collection[int] | None = None
    ) -> list[t.AccountingRecord]:
        # pyslurm.db.Job lacks AllocTRES/ReqTRES in 25.11: sacct it is.
        return self._cli.accounting(start, end, job_ids=job_ids)

    # -- inventory -------------------------------------------------------------------------------

    def partitions(self) -> list[t.Partition]:
        """The partitions with their limits in one call: ``scontrol show partition -o`` (the cli
        backend's reading). pyslurm 25.11.2's Partition gives OverSubscribe, ExclusiveUser,
        DefMemPerGPU and MaxMemPerNode as scontrol does, but its ``over_time_limit`` reads a
        partition's OverTimeLimit=0 as None, like one that sets none (pyslurm.utils.uint.u16_parse
        treats 0 as "no value"): measured on the 25.11.7 cluster, a partition created with
        OverTimeLimit=0 reads None through pyslurm and 0 through scontrol. 0 (jobs of this partition
        may not overrun) and None (the cluster's OverTimeLimit applies) hold different budgets, so
        the one partitions read is scontrol's, not pyslurm's plus a second one for that flag."""
        return self._cli.partitions()

    def nodes(self) -> list[t.Node]:
        nodes = self._call("nodes", lambda: self._pyslurm.Nodes.load())
        out = []
        for node in self._values(nodes):
            gpu_type, total, allocated = "", 0, 0
            for key, value in (node.configured_gres or {}).items():
                name, _, typ = key.partition(":")
                if name == "gpu":
                    total += _gres_count(value)
                    gpu_type = gpu_type or typ
            for key, value in (node.allocated_gres or {}).items():
                if key.partition(":")[0] == "gpu":
                    allocated += _gres_count(value)
            out.append(
                t.Node(
                    name=node.name,
                    state=(node.state or "UNKNOWN").upper(),
                    partitions=tuple(node.partitions or ()),
                    gpu_type=gpu_type,
                    gpus_total=total,
                    gpus_allocated=allocated,
                    cpus_total=node.total_cpus or 0,
                    cpus_allocated=node.allocated_cpus or 0,
                    memory_mb=node.real_memory or 0,
                    reason=node.reason or "",
                    features=tuple(node.available_features or ()),  # scontrol's AvailableFeatures
                )
            )
        return out

    # -- reservations ----------------------------------------------------------------------------

    @property
    def reservations_support_gpu_counts(self) -> bool:
        return True  # pyslurm 25.11 builds only against Slurm 25.11, which reserves GPU counts

    def reservation_object(self, spec: t.ReservationSpec) -> Any:
        check_text(spec.name, "Reservation name")
        kwargs: dict[str, Any] = {
            "start_time": int(spec.start.timestamp()),
            "end_time": int(spec.end.timestamp()),
            "accounts": list(spec.accounts),
        }
        if spec.nodes:
            kwargs["nodes"] = ",".join(spec.nodes)
        elif spec.tres:
            kwargs["tres"] = dict(spec.tres)  # Slurm 25.11 accepts GPU counts in reservations
        if spec.partition:
            kwargs["partition"] = spec.partition
        if spec.flags:
            unknown = [flag for flag in spec.flags if flag.upper() not in RESERVATION_FLAGS]
            if unknown:
                raise t.SlurmRejected(f"Unknown reservation flags: {', '.join(unknown)}")
            names = [RESERVATION_FLAGS[flag.upper()] for flag in spec.flags]
            kwargs["flags"] = self._pyslurm.ReservationFlags.from_list(names)
        return self._pyslurm.Reservation(spec.name, **kwargs)

    def reservation_create(self, spec: t.ReservationSpec) -> str:
        resv = self.reservation_object(spec)
        self._call("reservation_create", resv.create)
        return spec.name

    def reservation_delete(self, name: str) -> None:
        check_text(name, "Reservation name")

        def delete() -> None:
            try:
                self._pyslurm.Reservation(name).delete()
            except self._pyslurm.RPCError as exc:
                if parsing.matches_any(str(getattr(exc, "msg", None) or exc), parsing.RESERVATION_MISSING_PATTERNS):
                    return
                raise

        self._call("reservation_delete", delete)

    def reservation_list(self) -> list[t.Reservation]:
        reservations = self._call("reservation_list", lambda: self._pyslurm.Reservations.load())
        return [
            t.Reservation(
                name=resv.name,
                start=_ts(resv.start_time),
                end=_ts(resv.end_time),
                accounts=tuple(resv.accounts or ()),
                nodes=resv.nodes or "",
                tres=parsing.format_tres(resv.tres or {}),
                state="ACTIVE" if resv.is_active else "INACTIVE",
            )
            for resv in self._values(reservations)
        ]

    # -- associations: pyslurm 25.11 has no released API for these; sacctmgr --------------------

    def associations(self) -> list[t.Association]:
        return self._cli.associations()

    def runaway_jobs_fix(self) -> list[int]:
        return self._cli.runaway_jobs_fix()  # pyslurm 25.11 has no runaway-jobs API

    def policy(self) -> t.ClusterPolicy:
        # QOS, account QOS, MaxArraySize, OverTimeLimit, KillWait: read as the cli backend reads them
        # (three calls; none reads the nodes or partitions again: nodes() and partitions() carry
        # the features and limits)
        return self._cli.policy()

    def account_add(self, account: str, *, description: str = "", parent: str = "") -> None:
        self._cli.account_add(account, description=description, parent=parent)

    def account_remove(self, account: str) -> None:
        self._cli.account_remove(account)

    def user_add(self, user: str, account: str, *, default: bool = False) -> None:
        self._cli.user_add(user, account, default=default)

    def user_remove(self, user: str, account: str) -> None:
        self._cli.user_remove(user, account)

    def association_limits_set(self, limits: t.AssociationLimits) -> None:
        self._cli.association_limits_set(limits)

    def association_limits_get(self, account: str) -> t.AssociationLimits:
        return self._cli.association_limits_get(account)

    def account_usage_reset(self, account: str) -> None:
        self._cli.account_usage_reset(account)

    def account_gpu_minutes(self, start: dt.datetime, end: dt.datetime) -> dict[str, int]:
        return self._cli.account_gpu_minutes(start, end)  # pyslurm 25.11 has no sreport API

    def usage_rolled_up(self, start: dt.datetime, end: dt.datetime) -> bool:
        return self._cli.usage_rolled_up(start, end)
