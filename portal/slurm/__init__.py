"""The Slurm gateway: the one place where the portal talks to Slurm."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .base import SlurmGateway
from .types import (
    AccountingRecord,
    Association,
    AssociationLimits,
    JobSpec,
    Node,
    Partition,
    QueueEntry,
    Reservation,
    ReservationSpec,
    SlurmError,
    SlurmRejected,
    SlurmUnavailable,
)

__all__ = [
    "AccountingRecord",
    "Association",
    "AssociationLimits",
    "JobSpec",
    "Node",
    "Partition",
    "QueueEntry",
    "Reservation",
    "ReservationSpec",
    "SlurmError",
    "SlurmGateway",
    "SlurmRejected",
    "SlurmUnavailable",
    "get_gateway",
    "use_gateway",
]

_gateway: SlurmGateway | None = None
_override: list[SlurmGateway] = []  # use_gateway's stack (module-wide: threads the test starts see it too)


@contextlib.contextmanager
def use_gateway(gateway: SlurmGateway) -> Iterator[SlurmGateway]:
    """While the block runs, get_gateway() answers ``gateway`` (tests, benchmarks): the one override
    point of the gateway. Nests; the innermost wins."""
    _override.append(gateway)
    try:
        yield gateway
    finally:
        _override.remove(gateway)


def get_gateway() -> SlurmGateway:
    """use_gateway's gateway while one is in use, else the configured backend (settings.SLURM_BACKEND: auto, cli or pyslurm), built once per process.

    ``auto`` is pyslurm when it is installed AND built for the cluster's Slurm major.minor
    (``sinfo --version`` of SLURM_BIN_DIR, which needs no controller): pyslurm 25.11 cannot talk
    to a 22.05 controller, and one venv serves both local clusters."""
    global _gateway
    if _override:
        return _override[-1]
    if _gateway is None:
        from django.conf import settings

        backend = settings.SLURM_BACKEND
        if backend == "auto":
            from .pyslurm import pyslurm_version

            installed = pyslurm_version()
            backend = "cli"
            if installed:
                from .cli import CliGateway

                cli = CliGateway(cluster=settings.SLURM_CLUSTER, timeout=settings.SLURM_TIMEOUT,
                                 slurm_conf=settings.SLURM_CONF, bin_dir=settings.SLURM_BIN_DIR)  # fmt: skip
                try:
                    cluster_version = cli.version()
                except SlurmError:
                    cluster_version = ""
                if same_release(installed, cluster_version):
                    backend = "pyslurm"
        if backend == "pyslurm":
            from .pyslurm import PyslurmGateway

            _gateway = PyslurmGateway(
                cluster=settings.SLURM_CLUSTER,
                timeout=settings.SLURM_TIMEOUT,
                slurm_conf=settings.SLURM_CONF,
                bin_dir=settings.SLURM_BIN_DIR,
            )
        else:
            from .cli import CliGateway

            _gateway = CliGateway(
                cluster=settings.SLURM_CLUSTER,
                timeout=settings.SLURM_TIMEOUT,
                slurm_conf=settings.SLURM_CONF,
                bin_dir=settings.SLURM_BIN_DIR,
            )
    return _gateway


def same_release(a: str, b: str) -> bool:
    """Two version strings name the same Slurm release (major.minor): "25.11.2" ~ "25.11.7"."""
    return a.split(".")[:2] == b.split(".")[:2] and len(a.split(".")) >= 2


def reset_gateway() -> None:
    """Forget the cached backend (tests that change settings)."""
    global _gateway
    _gateway = None
