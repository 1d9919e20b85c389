"""Reads. One visibility rule per model, used by pages and API alike."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import QuerySet

from portal.models import ApiToken, Cluster, ClusterPolicyInfo, Membership, NodeInfo, PartitionInfo, Role, SyncStatus, Team, TeamClusterAccount
from portal.slurm import cluster_config, configured_clusters
from portal.roles import can_read_cost_reports, is_admin


def teams_visible_to(user) -> QuerySet[Team]:
    """Admins and finance see every team; everyone else the teams they belong to."""
    if not user.is_authenticated:
        return Team.objects.none()
    if is_admin(user) or can_read_cost_reports(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


def team_visible_or_error(user, slug: str) -> Team:
    """The team a command names, if the user may see it; otherwise the same 400 as for a slug that
    does not exist ("No such team."), so nothing leaks about other teams."""
    from portal.exceptions import ApplicationError

    team = teams_visible_to(user).filter(slug=slug).first()
    if team is None:
        raise ApplicationError("No such team.", errors={"team": ["No such team."]})
    return team


def teams_user_can_submit_to(user) -> QuerySet[Team]:
    """Active teams the user is a member of (admins too only through membership: jobs run as a member)."""
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user, active=True).distinct()


def teams_managed_by(user) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    if is_admin(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user, memberships__role=Role.MANAGER).distinct()


def memberships_visible_to(user) -> QuerySet[Membership]:
    return Membership.objects.filter(team__in=teams_visible_to(user)).select_related("user", "team")


def api_tokens_of(user) -> QuerySet[ApiToken]:
    """A user sees only their own tokens (admins manage others' in the admin)."""
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)


def team_ids_by_account(*, cluster: str, accounts: set[str]) -> dict[str, int]:
    """Team id per Slurm account of one cluster: on the default cluster Team.slurm_account, on
    another its TeamClusterAccount rows. One query."""
    if not accounts:
        return {}
    if cluster == cluster_config().name:
        return dict(Team.objects.filter(slurm_account__in=accounts).values_list("slurm_account", "pk"))
    return dict(
        TeamClusterAccount.objects.filter(cluster__name=cluster, slurm_account__in=accounts).values_list("slurm_account", "team_id")
    )


def team_cluster_accounts(team: Team) -> dict[str, str]:
    """A team's Slurm account on each cluster it has access to ({cluster name: account}): the
    default cluster's is Team.slurm_account, the others' its TeamClusterAccount rows. One query."""
    accounts = {cluster_config().name: team.slurm_account}
    accounts.update(TeamClusterAccount.objects.filter(team=team, cluster__active=True).values_list("cluster__name", "slurm_account"))
    return accounts


def sync_status(kind: str) -> SyncStatus | None:
    return SyncStatus.objects.filter(kind=kind).first()


def several_clusters() -> bool:
    """The portal serves more than one cluster: pages then name each row's cluster (no query)."""
    return len(configured_clusters()) > 1


def _gpu_type_rows(nodes) -> list[dict]:
    """GPUs total/allocated/free per GPU type of these nodes (free: on available nodes only)."""
    by_type: dict[str, dict] = defaultdict(lambda: {"total": 0, "allocated": 0, "free": 0, "nodes": 0, "unavailable": 0})
    for node in nodes:
        if not node.gpus_total:
            continue
        row = by_type[node.gpu_type or "untyped"]
        row["nodes"] += 1
        row["total"] += node.gpus_total
        row["allocated"] += node.gpus_allocated
        if node.available:
            row["free"] += max(node.gpus_total - node.gpus_allocated, 0)
        else:
            row["unavailable"] += node.gpus_total - node.gpus_allocated
    return [{"gpu_type": key, **value} for key, value in sorted(by_type.items())]


def _partition_rows(partitions, nodes, names: dict) -> list[dict]:
    """One row per partition: its limits and its nodes' GPUs (``names``: cluster id → name, empty
    with one cluster)."""
    nodes_by_name = {(node.cluster_id, node.name): node for node in nodes}  # node names repeat across clusters
    rows = []
    for part in partitions:
        members = [nodes_by_name[(part.cluster_id, n)] for n in part.node_names if (part.cluster_id, n) in nodes_by_name]
        types = sorted({n.gpu_type for n in members if n.gpu_type})
        per_node = max((n.gpus_total for n in members), default=0)
        rows.append(
            {
                "name": part.name,
                "cluster": names.get(part.cluster_id, ""),  # "" with one cluster
                "is_default": part.is_default,
                "state": part.state,
                "default_time_minutes": part.default_time_minutes,
                "max_time_minutes": part.max_time_minutes,
                "nodes": len(members),
                "gpu_types": types,
                "max_gpus_per_node": per_node,
                "gpus_total": sum(n.gpus_total for n in members),
                "gpus_allocated": sum(n.gpus_allocated for n in members),
                "gpus_free": sum(max(n.gpus_total - n.gpus_allocated, 0) for n in members if n.available),
            }
        )
    return rows


def cluster_summary() -> dict:
    """GPUs total/allocated/free per GPU type and per partition, nodes not available, and when the
    inventory was last read (of every cluster: GPU types summed over them; partitions name their
    cluster). Two queries whatever the clusters' size (three with several clusters)."""
    nodes = list(NodeInfo.objects.all())
    partitions = list(PartitionInfo.objects.all())
    several = several_clusters()
    names = dict(Cluster.objects.values_list("pk", "name")) if several else {}
    status = sync_status("cluster")
    return {
        "gpu_types": _gpu_type_rows(nodes),
        "partitions": _partition_rows(partitions, nodes, names),
        "several_clusters": several,
        "nodes_unavailable": [
            {"name": n.name, "cluster": names.get(n.cluster_id, ""), "state": n.state, "reason": n.reason} for n in nodes if not n.available
        ],
        "nodes": nodes,
        "last_success_at": status.last_success_at if status else None,
        "stale": status.is_stale if status else True,
        "failing_since": status.failing_since if status else None,
        "last_error": status.last_error if status else "",
    }


RELAY_BACKENDS = {"pyslurm": "pyslurm", "sbatch": "sbatch", "kubernetes": "Kubernetes API (batch/v1 Jobs)"}
SCHEDULERS = {"slurm": "Slurm", "kubernetes": "Kubernetes"}  # a cluster's kind, in words


def scheduler_version(kind: str, version: str) -> str:
    """"Slurm 22.05.8", "Kubernetes v1.20.2": the scheduler and the version its last inventory sync read."""
    return f"{SCHEDULERS.get(kind, kind)} {version}" if version else ""


def cluster_health(status: SyncStatus | None, nodes, jobs_status: SyncStatus | None = None) -> dict:
    """A cluster's health as the status page and the API show it: ``ok`` and the conditions that
    are not (each {"code", "message"}); one place to add a condition. ``jobs_status``: the jobs
    sync's (a Kubernetes namespace it had to skip: no right there). No query."""
    conditions = []
    skipped = (jobs_status.data.get("namespaces_skipped") or []) if jobs_status is not None else []
    if skipped:
        conditions.append({"code": "namespaces_skipped", "message": "The jobs sync skipped "
                           + "; ".join(line[:300] for line in skipped[:5])})  # fmt: skip
    if status is None or status.last_success_at is None:
        since = f" (failing since {status.failing_since:%Y-%m-%d %H:%M %Z})" if status and status.failing_since else ""
        conditions.append({"code": "never_read", "message": f"The inventory has not been read yet{since}."})
    elif status.failing_since is not None:
        conditions.append({"code": "sync_failing", "message": f"Slurm could not be read since {status.failing_since:%Y-%m-%d %H:%M %Z}: "
                                                              f"{status.last_error[:200]}"})  # fmt: skip
    if status is not None and status.data.get("policy_error"):
        conditions.append({"code": "policy_unread", "message": f"QOS and limits not read: {status.data['policy_error'][:200]}"})
    down = [n for n in nodes if not n.available]
    if down:
        conditions.append({"code": "nodes_unavailable", "message": f"{len(down)} of {len(nodes)} nodes down or drained: "
                                                                   + ", ".join(f"{n.name} ({n.state})" for n in down[:10])})  # fmt: skip
    # Slurm 22.05 after a controller takeover and failback: nodes IDLE (no job, CPUs free) whose GPUs
    # Slurm still counts allocated, so jobs that need them wait on an idle cluster; `scontrol reconfigure`
    # rebuilds the allocations from the jobs (docs/deploy.md, "A site with failover")
    held = [n for n in nodes if n.gpus_allocated and n.state.split("+")[0] == "IDLE"]
    if held:
        conditions.append({"code": "gpus_held_by_no_job", "message": f"{len(held)} idle nodes with GPUs allocated to no job "
                           "(`scontrol reconfigure` frees them): " + ", ".join(f"{n.name} ({n.gpus_allocated} of {n.gpus_total})"
                                                                                 for n in held[:10])})  # fmt: skip
    return {"ok": not conditions, "conditions": conditions}


def clusters_status() -> list[dict]:
    """Every active cluster as its status page and ``GET /api/v1/clusters/`` show it: name, Slurm
    version and relay backend (as the last inventory sync found them), health, last sync, nodes and
    GPUs free per type, partitions with their limits, the policy's MaxArraySize. Five queries
    whatever the number of clusters."""
    clusters = list(Cluster.objects.filter(active=True))
    nodes = list(NodeInfo.objects.filter(cluster__active=True).order_by("name"))
    partitions = list(PartitionInfo.objects.filter(cluster__active=True))
    kinds = [SyncStatus.kind_for(kind, c.name) for c in clusters for kind in ("cluster", "jobs")]
    statuses = {s.kind: s for s in SyncStatus.objects.filter(kind__in=kinds)}
    policies = dict(ClusterPolicyInfo.objects.values_list("cluster_id", "max_array_size"))
    names = {c.pk: c.name for c in clusters}
    default = cluster_config().name
    out = []
    for cluster in sorted(clusters, key=lambda c: (c.name != default, c.name)):
        status = statuses.get(SyncStatus.kind_for("cluster", cluster.name))
        mine = [n for n in nodes if n.cluster_id == cluster.pk]
        data = status.data if status else {}
        out.append({
            "name": cluster.name,
            "is_default": cluster.name == default,
            "kind": cluster.kind,
            "version": scheduler_version(cluster.kind, data.get("slurm_version", "")),
            "slurm_version": data.get("slurm_version", "") if cluster.kind == "slurm" else "",
            "relay_backend": data.get("relay_backend", ""),
            "relay_backend_label": RELAY_BACKENDS.get(data.get("relay_backend", ""), data.get("relay_backend", "")),
            "configured_backend": cluster.backend,
            "health": cluster_health(status, mine, statuses.get(SyncStatus.kind_for("jobs", cluster.name))),
            "last_success_at": status.last_success_at if status else None,
            "last_attempt_at": status.last_attempt_at if status else None,
            "failing_since": status.failing_since if status else None,
            "nodes_total": len(mine),
            "nodes_available": sum(1 for n in mine if n.available),
            "nodes_unavailable": [{"name": n.name, "state": n.state, "reason": n.reason} for n in mine if not n.available],
            "gpu_types": _gpu_type_rows(mine),
            "partitions": _partition_rows([p for p in partitions if p.cluster_id == cluster.pk], mine, names),
            "max_array_size": policies.get(cluster.pk),
        })  # fmt: skip
    return out


def team_idle_policy(team: Team) -> dict:
    """The team's idle-GPU policy as its page and the API show it: the stored values (no row: off, with
    the values a manager starts from: the site's idle threshold and alert delay within the bounds, the
    shortest cancel delay), the ``effective`` ones (clamped into the bounds in force: what the GPU check
    applies while ``enabled``) and the admin's ``bounds``. One query."""
    from decimal import Decimal

    from django.conf import settings

    from portal.idle_policy import IdlePolicy, IdlePolicyBounds
    from portal.models import TeamIdlePolicy

    bounds = IdlePolicyBounds.current()
    row = TeamIdlePolicy.objects.filter(team=team).first()
    if row is None:
        values = {
            "enabled": False,
            "threshold_percent": min(Decimal(str(settings.GPU_IDLE_THRESHOLD_PERCENT)), bounds.max_threshold_percent),
            "warn_minutes": min(max(Decimal(settings.GPU_IDLE_ALERT_MINUTES), bounds.min_warn_minutes), bounds.max_minutes),
            "cancel_minutes": bounds.min_cancel_minutes,
            "updated_at": None, "updated_by": "",
        }  # fmt: skip
    else:
        values = {"enabled": row.enabled, "threshold_percent": row.threshold_percent, "warn_minutes": row.warn_minutes,
                  "cancel_minutes": row.cancel_minutes, "updated_at": row.updated_at,
                  "updated_by": row.updated_by.username if row.updated_by else ""}  # fmt: skip
    effective = IdlePolicy.effective(threshold_percent=values["threshold_percent"], warn_minutes=values["warn_minutes"],
                                     cancel_minutes=values["cancel_minutes"], bounds=bounds)  # fmt: skip
    values["effective"] = {"threshold_percent": effective.threshold_percent,
                           "warn_minutes": effective.warn.total_seconds() / 60,
                           "cancel_minutes": effective.cancel.total_seconds() / 60}  # fmt: skip
    values["bounds"] = bounds.as_dict()
    return values
