"""The synced inventory as the submit path reads it: each active cluster's partitions (what one
can ever give a job) and policy, which cluster a partition name picks, and a team's accounts on the
clusters. One copy per process (portal.snapshots), moved by ``cluster_sync``."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Case, OuterRef, Subquery, Value, When
from django.db.models.fields.json import KT
from gpuportal_sbatch.directives import release_of

from portal.models import Cluster, ClusterPolicyInfo, NodeInfo, PartitionInfo, SyncStatus
from portal.slurm import cluster_config, configured_clusters
from portal.slurm.types import OVER_TIME_UNLIMITED, TIME_LIMIT_CHECK_SECONDS
from portal.snapshots import INVENTORY, snapshot


def overrun_seconds(*, over_time_limit_minutes: int, kill_wait_seconds: int) -> int | None:
    """The most a job can run (and be charged) past its time limit: slurmctld ends it at the first
    time-limit check (every TIME_LIMIT_CHECK_SECONDS) after limit + OverTimeLimit; KillWait on top as
    the margin of a check that runs late (a busy controller). None: OverTimeLimit=UNLIMITED (no bound)."""
    if over_time_limit_minutes == OVER_TIME_UNLIMITED:
        return None
    return over_time_limit_minutes * 60 + TIME_LIMIT_CHECK_SECONDS + kill_wait_seconds


@dataclass(frozen=True)
class PartitionCapacity:
    """What one partition of one cluster can ever give a job (from the synced inventory), and the
    partition's flags that change what a job is allocated (ClusterPolicyInfo.partition_limits):
    ``exclusive`` (OverSubscribe=EXCLUSIVE: whole nodes), ``exclusive_user`` (measured: AllocTRES
    stays what the job asks), DefMemPerGPU / MaxMemPerNode (MiB), and ``overrun_seconds``, how far
    past its time limit Slurm can charge a job here (None: without bound). ``slurm_release``: the
    cluster's Slurm release in gpuportal_sbatch's option table ("22.05"; None: not read yet, or a
    release the table does not have), whose sbatch options a job's script is checked against."""

    name: str
    default_time_minutes: int | None
    max_time_minutes: int | None
    nodes: tuple[NodeInfo, ...]
    cluster_id: int | None = None
    cluster: str = ""
    # the cluster's row, shared by the threads of the process: a job gets its own copy (cluster_for_job)
    cluster_row: Cluster | None = field(default=None, compare=False, repr=False)
    exclusive: bool = False
    exclusive_user: bool = False
    def_mem_per_gpu_mb: int | None = None
    max_mem_per_node_mb: int | None = None
    overrun_seconds: int | None = 0
    slurm_release: str | None = None

    @property
    def gpu_types(self) -> list[str]:
        return sorted({n.gpu_type for n in self.nodes if n.gpu_type and n.gpus_total})

    def cluster_for_job(self) -> Cluster | None:
        """A copy of the cluster's row for a new job to point at (no query; never the shared row)."""
        return copy.copy(self.cluster_row)

    def eligible_nodes(self, gpu_type: str) -> list[NodeInfo]:
        """Nodes with GPUs of that type ("" = any type)."""
        return [n for n in self.nodes if n.gpus_total and (not gpu_type or n.gpu_type == gpu_type)]


def spec_accounts(team) -> dict:
    """validate_job_spec's account arguments for a team: its one account when the portal serves one
    cluster (no query), else its account on each cluster it has access to (one query)."""
    from portal.selectors import team_cluster_accounts
    from portal.slurm import configured_clusters

    if len(configured_clusters()) == 1:
        return {"account": team.slurm_account}
    return {"accounts": team_cluster_accounts(team)}


class ClusterChoiceError(Exception):
    """The partition alone does not say which cluster (``ambiguous``: its clusters), or the
    requested cluster is not one the portal serves."""

    def __init__(self, message: str, ambiguous: tuple[str, ...] = ()):
        super().__init__(message)
        self.ambiguous = ambiguous


@dataclass(frozen=True)
class Inventory:
    """The synced inventory of every active cluster as the submit path reads it: each partition's
    capacity and each cluster's policy. Shared by the threads of a process (portal.snapshots):
    read-only."""

    partitions: dict[tuple[str, str], PartitionCapacity]  # (cluster name, partition name) -> capacity
    defaults: dict[str, str]  # cluster name -> its default partition
    default_cluster: str | None
    clusters: frozenset[str]  # the active clusters' names
    policies: dict[int, ClusterPolicyInfo]  # cluster id -> its policy

    def capacity(self, partition: str, cluster: str = "") -> PartitionCapacity | None:
        """The partition's capacity, or None when it is not in the inventory ("" = the default
        partition; of the default cluster unless ``cluster`` names one). A partition name alone picks
        its cluster when exactly one cluster has it, or the default cluster when it is one of several
        (as sbatch without --clusters submits to the local cluster); several others:
        ClusterChoiceError naming them, an unknown ``cluster`` too. No query."""
        if cluster:
            if cluster not in self.clusters:
                raise ClusterChoiceError(f"No such cluster: {cluster!r} ({self.served()}).")
            name = partition or self.defaults.get(cluster)
            return self.partitions.get((cluster, name)) if name else None
        if not partition:
            name = self.defaults.get(self.default_cluster or "")
            return self.partitions.get((self.default_cluster, name)) if name else None
        found = [cap for (_cluster, name), cap in self.partitions.items() if name == partition]
        if len(found) > 1:
            # as sbatch without --clusters: the local (default) cluster when it has the partition
            local = [c for c in found if c.cluster == self.default_cluster]
            if local:
                return local[0]
            found.sort(key=lambda c: c.cluster)
            names = tuple(c.cluster for c in found)
            raise ClusterChoiceError(
                f"Partition {partition!r} exists on clusters {', '.join(names)}: name one in `cluster`.", ambiguous=names
            )
        return found[0] if found else None

    def served(self) -> str:
        """The clusters the portal serves, for error messages: "clusters here: a, b"."""
        return "clusters here: " + (", ".join(sorted(self.clusters)) or "none")

    def policy(self, capacity: PartitionCapacity) -> ClusterPolicyInfo | None:
        return self.policies.get(capacity.cluster_id) if capacity.cluster_id is not None else None


def _slurm_version():
    """The Slurm version the cluster's last inventory sync read (its SyncStatus row, whose kind
    SyncStatus.kind_for names), as a subquery of a PartitionInfo query."""
    kinds = [When(cluster__name=c.name, then=Value(SyncStatus.kind_for("cluster", c.name))) for c in configured_clusters()]
    rows = SyncStatus.objects.filter(kind=OuterRef("sync_kind")).values_list(KT("data__slurm_version"))[:1]
    return {"sync_kind": Case(*kinds, default=Value("")), "slurm_version": Subquery(rows)}


def _inventory_load() -> Inventory:
    """Four queries: active clusters' partitions (with their cluster and its Slurm version), nodes,
    policies, clusters."""
    parts = list(PartitionInfo.objects.filter(cluster__active=True).select_related("cluster").annotate(**_slurm_version()))
    nodes = {(n.cluster_id, n.name): n for n in NodeInfo.objects.order_by("name")}
    policies = {policy.cluster_id: policy for policy in ClusterPolicyInfo.objects.all()}
    capacities = {
        (p.cluster.name, p.name): PartitionCapacity(
            p.name, p.default_time_minutes, p.max_time_minutes,
            tuple(nodes[(p.cluster_id, name)] for name in sorted(p.node_names) if (p.cluster_id, name) in nodes),
            cluster_id=p.cluster_id, cluster=p.cluster.name, cluster_row=p.cluster,
            slurm_release=release_of(p.slurm_version), **_partition_flags(policies.get(p.cluster_id), p.name),
        )
        for p in parts
    }  # fmt: skip
    defaults = {p.cluster.name: p.name for p in parts if p.is_default}
    clusters = list(Cluster.objects.filter(active=True).order_by("name"))
    # the configured first cluster by name, not the recorded flag (which may lag a settings change)
    default_cluster = cluster_config().name
    return Inventory(capacities, defaults, default_cluster, frozenset(c.name for c in clusters), policies)


def _partition_flags(policy: ClusterPolicyInfo | None, partition: str) -> dict:
    """PartitionCapacity's flags of one partition from its cluster's policy (None: not read yet: no
    flags, and the overrun of SLURM_OVERRUN_SECONDS_UNREAD)."""
    if policy is None:
        return {"overrun_seconds": settings.SLURM_OVERRUN_SECONDS_UNREAD}
    limits = (policy.partition_limits or {}).get(partition) or {}
    over_time = limits.get("over_time_limit_minutes")
    return {
        "exclusive": bool(limits.get("exclusive")), "exclusive_user": bool(limits.get("exclusive_user")),
        "def_mem_per_gpu_mb": limits.get("def_mem_per_gpu_mb"), "max_mem_per_node_mb": limits.get("max_mem_per_node_mb"),
        "overrun_seconds": overrun_seconds(
            over_time_limit_minutes=policy.over_time_limit_minutes if over_time is None else over_time,
            kill_wait_seconds=policy.kill_wait_seconds,
        ),
    }  # fmt: skip


def inventory() -> Inventory:
    """The inventory as of the last cluster_sync: this process's copy (portal.snapshots; no query
    while it is current), else four queries."""
    return snapshot(INVENTORY, _inventory_load)


def partition_capacity(partition: str, cluster: str = "") -> PartitionCapacity | None:
    """The partition's capacity (Inventory.capacity): from this process's copy of the inventory."""
    return inventory().capacity(partition, cluster)
