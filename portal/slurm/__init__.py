"""The Slurm gateway: the one place where the portal talks to Slurm."""

from __future__ import annotations

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
]

_gateway: SlurmGateway | None = None


def get_gateway() -> SlurmGateway:
    """The configured backend (settings.SLURM_BACKEND: auto, cli or pyslurm), built once per process."""
    global _gateway
    if _gateway is None:
        from django.conf import settings

        backend = settings.SLURM_BACKEND
        if backend == "auto":
            try:
                import pyslurm  # noqa: F401

                backend = "pyslurm"
            except ImportError:
                backend = "cli"
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


def reset_gateway() -> None:
    """Forget the cached backend (tests that change settings)."""
    global _gateway
    _gateway = None
