"""Reads. One visibility rule per model, used by pages and API alike."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import QuerySet

from portal.models import ApiToken, Cluster, Membership, NodeInfo, PartitionInfo, Role, SyncStatus, Team, TeamClusterAccount
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


def cluster_summary() -> dict:
    """GPUs total/allocated/free per GPU type and per partition, nodes not available, and when the
    inventory was last read (of every cluster: GPU types summed over them; partitions name their
    cluster). Two queries whatever the clusters' size (three with several clusters)."""
    nodes = list(NodeInfo.objects.all())
    partitions = list(PartitionInfo.objects.all())
    several = len(configured_clusters()) > 1
    names = dict(Cluster.objects.values_list("pk", "name")) if several else {}
    status = sync_status("cluster")

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
    nodes_by_name = {(node.cluster_id, node.name): node for node in nodes}  # node names repeat across clusters
    part_rows = []
    for part in partitions:
        members = [nodes_by_name[(part.cluster_id, n)] for n in part.node_names if (part.cluster_id, n) in nodes_by_name]
        types = sorted({n.gpu_type for n in members if n.gpu_type})
        per_node = max((n.gpus_total for n in members), default=0)
        part_rows.append(
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
    return {
        "gpu_types": [{"gpu_type": key, **value} for key, value in sorted(by_type.items())],
        "partitions": part_rows,
        "nodes_unavailable": [
            {"name": n.name, "state": n.state, "reason": n.reason} for n in nodes if not n.available
        ],
        "nodes": nodes,
        "last_success_at": status.last_success_at if status else None,
        "stale": status.is_stale if status else True,
        "failing_since": status.failing_since if status else None,
        "last_error": status.last_error if status else "",
    }
