"""Slurm's own words for "the message was lost on the way", as the libslurm that sbatch loads spells
them (slurm_strerror, on Debian's 22.05 and on 25.11): each is "unavailable: try again", never a
refusal, on both backends (the CLI's message patterns, pyslurm's errno values).

A job sent in the second a controller dies gets one of these back (make test-site, issue 42: a job of
the form client ended SUBMIT_FAILED at the primary slurmctld's SIGKILL): the relay looks a job up by its
tag before it sends it again, so a retry never makes a second one."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

import pytest

from portal.slurm import parsing
from portal.slurm.types import SlurmRejected, SlurmUnavailable
from tests.support import DEFAULT_RELEASE, cluster_env

pytestmark = pytest.mark.slurm

# slurm_errno.h: the transport's failures (SLURM_COMMUNICATIONS_*, the socket layer), the controller's
# rate limit and standby, a job record the controller could not make now
LOST_ON_THE_WAY = {
    1001: "SLURM_COMMUNICATIONS_CONNECTION_ERROR", 1002: "SLURM_COMMUNICATIONS_SEND_ERROR",
    1003: "SLURM_COMMUNICATIONS_RECEIVE_ERROR", 1004: "SLURM_COMMUNICATIONS_SHUTDOWN_ERROR",
    1008: "SLURM_PROTOCOL_INSANE_MSG_LENGTH", 1013: "SLURM_COMMUNICATIONS_MISSING_SOCKET_ERROR",
    1800: "SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR", 1801: "SLURMCTLD_COMMUNICATIONS_SEND_ERROR",
    1802: "SLURMCTLD_COMMUNICATIONS_RECEIVE_ERROR", 1803: "SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR",
    1804: "SLURMCTLD_COMMUNICATIONS_BACKOFF", 1805: "SLURMCTLD_COMMUNICATIONS_HARD_DROP",
    2007: "ESLURM_ERROR_ON_DESC_TO_RECORD_COPY", 2027: "ESLURM_IN_STANDBY_MODE",
    5003: "ESLURM_PROTOCOL_INCOMPLETE_PACKET", 5004: "SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT",
    5005: "SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT",
    11: "EAGAIN", 32: "EPIPE", 104: "ECONNRESET", 110: "ETIMEDOUT", 111: "ECONNREFUSED", 113: "EHOSTUNREACH",
}  # fmt: skip
NEWER_THAN_22_05 = {1804, 1805}  # slurmctld's rate limiting (Slurm 23.02)
# ... and what the controller means as an answer: these stay refusals
REFUSALS = {2000: "ESLURM_INVALID_PARTITION_NAME", 2002: "ESLURM_ACCESS_DENIED", 2017: "ESLURM_INVALID_JOB_ID", 2045: "ESLURM_INVALID_ACCOUNT",
            2051: "ESLURM_INVALID_TIME_LIMIT", 1005: "SLURM_PROTOCOL_VERSION_ERROR"}  # fmt: skip


def _libslurm(release: str):
    """The libslurm the release's sbatch loads (ldd), with slurm_strerror."""
    bin_dir = os.path.dirname(shutil.which("sbatch") or "/usr/bin/sbatch") if release == DEFAULT_RELEASE \
        else cluster_env(release)["SLURM_BIN_DIR"]  # fmt: skip
    linked = subprocess.run(["ldd", os.path.join(bin_dir, "sbatch")], capture_output=True, text=True, check=True).stdout
    path = re.search(r"=>\s*(\S*libslurm\S*\.so\S*)", linked)
    assert path, linked
    lib = ctypes.CDLL(path.group(1))
    lib.slurm_strerror.restype = ctypes.c_char_p
    lib.slurm_strerror.argtypes = [ctypes.c_int]
    return lib


@pytest.mark.parametrize("release", ["22.05", "25.11"])
def test_slurms_words_for_a_message_lost_on_the_way_mean_try_again_on_both_backends(release):
    lib = _libslurm(release)
    for code, name in LOST_ON_THE_WAY.items():
        words = lib.slurm_strerror(code).decode()
        if words.startswith("Unknown error") and release == "22.05" and code in NEWER_THAN_22_05:
            continue
        assert not words.startswith("Unknown error"), (release, name, words)
        stderr = f"sbatch: error: Batch job submission failed: {words}"
        assert isinstance(parsing.classify_failure(returncode=1, stderr=stderr, command="sbatch"), SlurmUnavailable), (
            release, name, words)  # fmt: skip
        assert code in parsing.UNAVAILABLE_ERRNOS, (name, words)
    for code, name in REFUSALS.items():
        words = lib.slurm_strerror(code).decode()
        stderr = f"sbatch: error: Batch job submission failed: {words}"
        assert isinstance(parsing.classify_failure(returncode=1, stderr=stderr, command="sbatch"), SlurmRejected), (
            release, name, words)  # fmt: skip
        assert code not in parsing.UNAVAILABLE_ERRNOS, (name, words)
