"""FAKE pyslurm for what only a fake can do: make every pyslurm call fail (or hang) on demand, to
test how PyslurmGateway maps pyslurm.RPCError, ValueError and a libslurm call that never returns.

Nothing else is proven here: the mapping of real pyslurm 25.11.2 objects to the gateway's typed
values is tested against the real Slurm 25.11 cluster (tests/slurm/test_gateway_contract.py with
the pyslurm backend). Every call raises ``STATE.error`` (once) after sleeping ``STATE.delay`` s.
"""

from __future__ import annotations

import time
import types
from typing import Any


class RPCError(Exception):
    """pyslurm.RPCError(errno=..., msg=...) (pyslurm/core/error.pyx)."""

    def __init__(self, errno: int = -1, msg: str | None = None):
        self.errno = errno
        self.msg = msg or f"errno {errno}"
        super().__init__(self.msg)


class _State:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.error: BaseException | None = None  # raised by the next call
        self.delay: float = 0.0  # seconds every call sleeps (to test the gateway's timeout)


STATE = _State()


def _rpc(result: Any = None) -> Any:
    if STATE.delay:
        time.sleep(STATE.delay)  # slow on purpose: time must pass (the gateway's timeout is tested)
    if STATE.error is not None:
        error, STATE.error = STATE.error, None
        raise error
    return result


class JobSubmitDescription:
    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)

    def submit(self) -> int:
        return _rpc(1)


class Job:
    def __init__(self, job_id: int):
        self.id = job_id

    def cancel(self) -> None:
        _rpc()


class Reservation:
    def __init__(self, name: str | None = None, **attrs: Any):
        self.name = name

    def delete(self) -> None:
        _rpc()


def _load() -> dict:
    return _rpc({})


Jobs = types.SimpleNamespace(load=_load)
Partitions = types.SimpleNamespace(load=_load)
slurmctld = types.SimpleNamespace(ping_primary=lambda: _rpc(types.SimpleNamespace(is_responding=True)))
__version__ = "25.11.0-fake"
