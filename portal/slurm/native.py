"""Native submission for the cli gateway: the job descriptor sbatch would build (native_request),
sent by ``slurm_submit_batch_job`` in a helper process (native_helper) instead of one ``sbatch``
process per job.

Measured on the local 22.05 cluster (bench/results.md): ``sbatch`` costs ~3.1 ms of CPU per job
(exec, dynamic linking of libslurmfull, reading slurm.conf, then the RPC); the helper's submit
~0.3 ms. Slurm's answer, its job id and its refusals are the same: the request is the one sbatch
sends (the corpus is submitted both ways in tests/jobs/test_native_same_request.py).

When it is used (``native_reason`` says why not, once per gateway, in the worker's log):
- the module ``_gpuportal_libslurm`` is built (``make native``) for the cluster's Slurm release;
- the cluster's slurm.conf runs nothing in sbatch itself that the helper would skip: no
  ``CliFilterPlugins``, no SPANK plugin stack (``PlugStackConfig`` or a non-empty
  ``plugstack.conf`` beside slurm.conf), no ``PropagateResourceLimits``/``...Except`` (sbatch's
  default, every limit, is what native_request sends);
- the job's options are all ones native_request maps; any other job goes through ``sbatch``.

One helper per gateway per process, started on first use and again after it dies; calls are
serialised on its pipe (each is one RPC to slurmctld, which takes jobs one at a time anyway), and
the relay sends a round's jobs in one exchange (``CliGateway.submit_many``). A
helper that does not answer within the gateway's timeout is killed: SlurmUnavailable, as a hung
``sbatch`` is, and the relay's claim and find-by-tag adoption make the retry exactly-once.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import parsing
from . import types as t

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MODULE = "_gpuportal_libslurm"
# errno values on which sbatch itself sleeps and retries (sbatch.c): here the relay retries later
RETRY_ERRNOS = frozenset({11, 2007, 2016})  # EAGAIN, ESLURM_ERROR_ON_DESC_TO_RECORD_COPY, ESLURM_NODES_BUSY
_CLIENT_SIDE_KEYS = re.compile(
    r"^\s*(CliFilterPlugins|PlugStackConfig|PropagateResourceLimits|PropagateResourceLimitsExcept)\s*=\s*(\S*)",
    re.IGNORECASE | re.MULTILINE,
)


@functools.cache
def built_release() -> str | None:
    """The Slurm release ("22.05") the native module was built for, None when it is not built.
    Read from the built file without loading libslurm into this process (a child Python, once per
    process: the module does not change under a running process)."""
    import importlib.util

    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.origin:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", f"import {MODULE} as m; n = m.lib.SLURM_VERSION_NUMBER; print(f'{{n >> 16}}.{{(n >> 8) & 255:02d}}')"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return probe.stdout.strip() or None if probe.returncode == 0 else None


def client_side_plugins(slurm_conf: str) -> str:
    """What of slurm.conf sbatch itself would run or apply that the helper does not ("" if nothing)."""
    try:
        text = Path(slurm_conf).read_text(errors="replace")
    except OSError as exc:
        return f"slurm.conf unreadable ({exc.strerror})"
    for key, value in _CLIENT_SIDE_KEYS.findall(text):
        if value:
            return f"slurm.conf sets {key}={value}"
    plugstack = Path(slurm_conf).with_name("plugstack.conf")
    try:
        lines = [line for line in plugstack.read_text(errors="replace").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    except OSError:
        lines = []
    return f"{plugstack} loads SPANK plugins" if lines else ""


class NativeSubmitter:
    """The helper process of one cluster in this process (see the module docstring)."""

    def __init__(self, *, env: Mapping[str, str], timeout: int, cwd: str | None = None):
        from .native_request import sbatch_process_environment

        self._env = dict(env)
        self.timeout = timeout
        self.cwd = cwd or os.getcwd()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = -1
        # sbatch's own SLURM_* variables: the same for every job this process submits
        self.process_env = sbatch_process_environment(self._env, cwd=self.cwd, host=socket.gethostname())

    def descriptor(self, spec: t.JobSpec, *, script: str, submit_line: str) -> dict[str, Any]:
        """native_request.job_descriptor for this process (raises NotExpressible, SlurmRejected)."""
        from .native_request import job_descriptor

        return job_descriptor(spec, script=script, process_env=self.process_env, cwd=self.cwd, submit_line=submit_line)

    # -- the helper ------------------------------------------------------------------------------

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None and self._pid == os.getpid():
            return self._proc
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "portal.slurm.native_helper"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env, cwd=self.cwd,
            close_fds=True, start_new_session=True,
        )  # fmt: skip
        self._pid = os.getpid()  # a forked child (a Celery pool process) starts its own
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.stdin.close()
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._kill()
            self._proc = None

    def _exchange(self, jobs: list[dict[str, Any]], *, seconds: float) -> list[tuple]:
        proc = self._start()
        payload = pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL)
        deadline = time.monotonic() + seconds
        try:
            proc.stdin.write(_HEADER.pack(len(payload)) + payload)
            proc.stdin.flush()
            header = self._read(proc, _HEADER.size, deadline)
            (size,) = _HEADER.unpack(header)
            return pickle.loads(self._read(proc, size, deadline))
        except (BrokenPipeError, EOFError) as exc:
            code = proc.poll()
            self._kill()
            logger.warning("the native submit helper ended (exit %s) with %d jobs in hand; the next submit starts another",
                           code, len(jobs))  # fmt: skip
            raise t.SlurmUnavailable(f"the native submit helper ended (exit {code})", command="sbatch") from exc
        except TimeoutError as exc:
            self._kill()
            logger.warning("the native submit helper did not answer within %.0f s for %d jobs: killed", seconds, len(jobs))
            raise t.SlurmUnavailable(f"sbatch did not answer within {seconds:.0f} s", command="sbatch") from exc

    @staticmethod
    def _read(proc: subprocess.Popen, size: int, deadline: float) -> bytes:
        fd, data = proc.stdout.fileno(), b""
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, size - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def submit(self, job: dict[str, Any]) -> int:
        """One descriptor → Slurm's job id; SlurmRejected / SlurmUnavailable as sbatch's would be."""
        (outcome,) = self.submit_many([job])
        if isinstance(outcome, t.SlurmError):
            raise outcome
        return outcome

    def submit_many(self, jobs: list[dict[str, Any]]) -> list[int | t.SlurmError]:
        """Descriptors → Slurm's job id or the error for each, in order: ONE exchange with the helper,
        which submits them one after the other (each its own RPC, as sbatch would). Raises
        SlurmUnavailable when the helper ends or does not answer in time (``timeout`` and 50 ms a
        job): which of the jobs reached Slurm is then unknown, as with an sbatch that hung — the
        relay releases them all and adopts any that did by its tag."""
        if not jobs:
            return []
        with self._lock:
            answers = self._exchange(jobs, seconds=self.timeout + 0.05 * len(jobs))
        return [self._outcome(answer) for answer in answers]

    @staticmethod
    def _outcome(answer: tuple) -> int | t.SlurmError:
        kind, first, second = answer
        if kind == "ok":
            return int(first)
        message = f"sbatch: error: Batch job submission failed: {second}"
        if first in parsing.UNAVAILABLE_ERRNOS or first in RETRY_ERRNOS or parsing.is_unavailable_message(second):
            return t.SlurmUnavailable(message, command="sbatch")
        return t.SlurmRejected(message, command="sbatch")
