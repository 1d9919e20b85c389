"""The Slurm gateway: the one place where the portal talks to Slurm."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .base import SlurmGateway
from .clusters import ClusterConfig
from .types import (
    AccountingRecord,
    Association,
    AssociationLimits,
    JobRequest,
    JobSubmission,
    Node,
    NotPermitted,
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
    "ClusterConfig",
    "JobRequest",
    "JobSubmission",
    "Node",
    "NotPermitted",
    "Partition",
    "QueueEntry",
    "Reservation",
    "ReservationSpec",
    "SlurmError",
    "SlurmGateway",
    "SlurmRejected",
    "SlurmUnavailable",
    "cluster_config",
    "configured_clusters",
    "slurm_clusters",
    "get_gateway",
    "relay_backend",
    "use_gateway",
]

_gateways: dict[str, SlurmGateway] = {}  # cluster name -> its gateway, built once per process
_pyslurm_cluster: list[str] = []  # the one cluster this process talks to through pyslurm (libslurm: one config per process)
_override: list[SlurmGateway] = []  # use_gateway's stack (module-wide: threads the test starts see it too)


@contextlib.contextmanager
def use_gateway(gateway: SlurmGateway) -> Iterator[SlurmGateway]:
    """While the block runs, get_gateway() answers ``gateway`` (tests, benchmarks): the one override
    point of the gateway. Nests; the innermost wins. A gateway with a ``clusters`` attribute (a
    mapping name -> gateway, tests' per-cluster doubles) answers for each cluster it names."""
    _override.append(gateway)
    try:
        yield gateway
    finally:
        _override.remove(gateway)


def configured_clusters() -> tuple[ClusterConfig, ...]:
    """The clusters the portal serves, the default first: settings.GPUPORTAL_CLUSTERS, or when that is
    empty the one cluster of SLURM_CLUSTER, SLURM_BACKEND, SLURM_CONF, SLURM_BIN_DIR, SLURM_LIB_DIR
    (read at each call: tests change them)."""
    from django.conf import settings

    if settings.GPUPORTAL_CLUSTERS:
        return tuple(settings.GPUPORTAL_CLUSTERS)
    return (ClusterConfig(name=settings.SLURM_CLUSTER, backend=settings.SLURM_BACKEND, slurm_conf=settings.SLURM_CONF,
                          bin_dir=settings.SLURM_BIN_DIR, lib_dir=getattr(settings, "SLURM_LIB_DIR", "")),)  # fmt: skip


def slurm_clusters() -> tuple[ClusterConfig, ...]:
    """The configured clusters Slurm runs (kind ``slurm``), the default first: what the Slurm-only
    reads and writes go through (associations, reservations, sacct usage, sreport), never a
    Kubernetes cluster."""
    return tuple(config for config in configured_clusters() if not config.is_kubernetes)


def cluster_config(name: str | None = None) -> ClusterConfig:
    """One configured cluster by name (None or "": the default). An unknown name raises KeyError."""
    clusters = configured_clusters()
    if not name:
        return clusters[0]
    for config in clusters:
        if config.name == name:
            return config
    raise KeyError(f"cluster {name!r} is not configured (GPUPORTAL_CLUSTERS: {', '.join(c.name for c in clusters)})")


def get_gateway(cluster: str | None = None) -> SlurmGateway:
    """The gateway of one cluster (a name; None: the default cluster): use_gateway's gateway while
    one is in use, else that cluster's backend (auto, cli or pyslurm), built once per process.

    ``auto`` is pyslurm when it is installed AND built for the cluster's Slurm major.minor
    (``sinfo --version`` of the cluster's bin dir, which needs no controller): pyslurm 25.11 cannot
    talk to a 22.05 controller, and one venv serves both local clusters. libslurm holds one
    configuration per process, so one process talks to at most one cluster through pyslurm: a
    second pyslurm cluster gets its CLI gateway in that process (a worker started with that
    cluster's environment, e.g. on a queue of its own, can use pyslurm for it)."""
    if _override:
        override = _override[-1]
        per_cluster = getattr(override, "clusters", None)
        if per_cluster is not None and cluster in per_cluster:
            return per_cluster[cluster]
        return override
    config = cluster_config(cluster)
    gateway = _gateways.get(config.name)
    if gateway is None:
        gateway = _gateways[config.name] = _build_gateway(config)
    return gateway


def _build_gateway(config: ClusterConfig) -> SlurmGateway:
    import logging

    from django.conf import settings

    from .cli import CliGateway

    if config.is_kubernetes:
        from .kubernetes import KubernetesGateway

        return KubernetesGateway(cluster=config.name, kubeconfig=config.kubeconfig or settings.GPUPORTAL_K8S_KUBECONFIG,
                                 timeout=settings.SLURM_TIMEOUT, image=settings.GPUPORTAL_K8S_IMAGE,
                                 gpu_type_label=settings.GPUPORTAL_K8S_GPU_TYPE_LABEL)  # fmt: skip
    options = {"cluster": config.name, "timeout": settings.SLURM_TIMEOUT, "slurm_conf": config.slurm_conf,
               "bin_dir": config.bin_dir}  # fmt: skip
    backend = config.backend
    if backend == "auto":
        from .pyslurm import pyslurm_version

        installed = pyslurm_version()
        backend = "cli"
        if installed:
            try:
                cluster_version = CliGateway(**options, lib_dir=config.lib_dir).version()
            except SlurmError:
                cluster_version = ""
            if same_release(installed, cluster_version):
                backend = "pyslurm"
    if backend == "pyslurm" and _pyslurm_cluster and _pyslurm_cluster[0] != config.name:
        logging.getLogger(__name__).warning(
            "cluster %s: this process already talks to %s through pyslurm (one libslurm configuration per "
            "process): %s uses the CLI backend here", config.name, _pyslurm_cluster[0], config.name,
        )  # fmt: skip
        backend = "cli"
    if backend == "pyslurm":
        from .pyslurm import PyslurmGateway

        gateway = PyslurmGateway(**options)
        _pyslurm_cluster[:] = [config.name]
        return gateway
    return CliGateway(**options, lib_dir=config.lib_dir)


def relay_backend(gateway: SlurmGateway) -> str:
    """How this gateway submits jobs: "pyslurm" or "sbatch" (the cli gateway); another gateway (a
    test's) answers its ``name``."""
    return "sbatch" if gateway.name == "cli" else gateway.name


def same_release(a: str, b: str) -> bool:
    """Two version strings name the same Slurm release (major.minor): "25.11.2" ~ "25.11.7"."""
    return a.split(".")[:2] == b.split(".")[:2] and len(a.split(".")) >= 2


def reset_gateway() -> None:
    """Forget the cached backends (tests that change settings)."""
    _gateways.clear()
    _pyslurm_cluster.clear()
