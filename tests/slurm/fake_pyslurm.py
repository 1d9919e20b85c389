"""FAKE pyslurm for unit tests only: mimics the few pyslurm 25.11 names PyslurmGateway uses.

Not Slurm, not pyslurm: a stand-in so the mapping of pyslurm objects to the gateway's typed values
(and of pyslurm.RPCError to SlurmUnavailable/SlurmRejected) can be tested on machines whose Slurm
(22.05) pyslurm 25.11 cannot be built against. The attribute names and shapes follow pyslurm 25.11
(core/job/job.pyx, core/job/submission.pyx, core/node.pyx, core/partition.pyx,
core/reservation.pyx, core/slurmctld/base.pyx, core/error.pyx). Tests set ``STATE`` to script what
the "controller" holds or which error it raises.
"""

from __future__ import annotations

import enum
import types
from pathlib import Path
from typing import Any


class RPCError(Exception):
    """pyslurm.RPCError(errno=..., msg=...)."""

    def __init__(self, errno: int = -1, msg: str | None = None):
        self.errno = errno
        self.msg = msg or f"errno {errno}"
        super().__init__(self.msg)


class _State:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.nodes: dict[str, Node] = {}
        self.partitions: dict[str, Partition] = {}
        self.reservations: dict[str, Reservation] = {}
        self.submitted: list[dict[str, Any]] = []  # every JobSubmitDescription's attributes + script text
        self.cancelled: list[int] = []
        self.error: BaseException | None = None  # raised by the next RPC
        self.delay: float = 0.0  # seconds every RPC sleeps (to test the gateway's timeout)
        self.next_job_id = 100


STATE = _State()


def _rpc() -> None:
    if STATE.delay:
        import time

        time.sleep(STATE.delay)
    if STATE.error is not None:
        error, STATE.error = STATE.error, None
        raise error


class _Map(dict):
    """pyslurm's MultiClusterMap: dict-like, values() yields the objects."""


class JobSubmitDescription:
    def __init__(self, **kwargs: Any):
        for key, value in kwargs.items():
            setattr(self, key, value)
        self._attrs = kwargs

    def submit(self) -> int:
        _rpc()
        script = self._attrs["script"]
        record = dict(self._attrs)
        # pyslurm reads the script from the path when it is a file.
        record["script_text"] = Path(script).read_text() if Path(script).is_file() else script
        STATE.submitted.append(record)
        job_id = STATE.next_job_id
        STATE.next_job_id += 1
        return job_id


class Job:
    def __init__(self, job_id: int, **attrs: Any):
        self.id = job_id
        defaults = {
            "name": "job", "user_name": "alice", "account": "vision", "partition": "gpu",
            "state": "PENDING", "state_reason": "None", "comment": None, "allocated_nodes": None,
            "num_nodes": 1, "submit_time": None, "start_time": None, "end_time": None,
            "time_limit": 60, "gres_per_node": {}, "reservation": None,
        }  # fmt: skip
        for key, value in {**defaults, **attrs}.items():
            setattr(self, key, value)

    def cancel(self) -> None:
        _rpc()
        STATE.cancelled.append(self.id)


class Jobs(_Map):
    @staticmethod
    def load(preload_passwd_info: bool = False, frozen: bool = False) -> Jobs:
        _rpc()
        return Jobs(STATE.jobs)


class Node:
    def __init__(self, name: str, **attrs: Any):
        self.name = name
        defaults = {
            "state": "IDLE", "partitions": ["gpu"], "configured_gres": {}, "allocated_gres": {},
            "total_cpus": 32, "allocated_cpus": 0, "real_memory": 256000, "reason": None,
        }  # fmt: skip
        for key, value in {**defaults, **attrs}.items():
            setattr(self, key, value)


class Nodes(_Map):
    @staticmethod
    def load() -> Nodes:
        _rpc()
        return Nodes(STATE.nodes)


class Partition:
    def __init__(self, name: str, **attrs: Any):
        self.name = name
        defaults = {"is_default": False, "state": "UP", "default_time": 60, "max_time": "UNLIMITED", "nodes": None}
        for key, value in {**defaults, **attrs}.items():
            setattr(self, key, value)


class Partitions(_Map):
    @staticmethod
    def load() -> Partitions:
        _rpc()
        return Partitions(STATE.partitions)


class ReservationFlags(enum.Flag):
    MAINTENANCE = enum.auto()
    MAGNETIC = enum.auto()
    FLEX = enum.auto()
    IGNORE_RUNNING_JOBS = enum.auto()
    ANY_NODES = enum.auto()
    STATIC_NODES = enum.auto()
    PARTITION_NODES_ONLY = enum.auto()
    PURGE = enum.auto()
    SPECIFIC_NODES = enum.auto()
    NO_JOB_HOLD_AFTER_END = enum.auto()
    OVERLAP = enum.auto()
    ALL_NODES = enum.auto()

    @classmethod
    def from_list(cls, names: list[str]) -> ReservationFlags:
        flag = cls(0)
        for name in names:
            flag |= cls[name]
        return flag


class Reservation:
    def __init__(self, name: str | None = None, **attrs: Any):
        self.name = name
        defaults = {"start_time": None, "end_time": None, "accounts": [], "nodes": None, "tres": {},
                    "partition": None, "flags": ReservationFlags(0), "is_active": False}  # fmt: skip
        for key, value in {**defaults, **attrs}.items():
            setattr(self, key, value)

    def create(self) -> Reservation:
        _rpc()
        if self.name in STATE.reservations:
            raise RPCError(2044, "Duplicate reservation name")  # illustrative errno
        STATE.reservations[self.name] = self
        return self

    def delete(self) -> None:
        _rpc()
        if self.name not in STATE.reservations:
            raise RPCError(2048, "Requested reservation is invalid")
        del STATE.reservations[self.name]


class Reservations(_Map):
    @staticmethod
    def load() -> Reservations:
        _rpc()
        return Reservations(STATE.reservations)


class _PingResponse:
    def __init__(self, responding: bool):
        self.is_responding = responding
        self.is_primary = True
        self.hostname = "ctld"


def _ping_primary() -> _PingResponse:
    _rpc()
    return _PingResponse(True)


slurmctld = types.SimpleNamespace(ping_primary=_ping_primary)
__version__ = "25.11.0-fake"
