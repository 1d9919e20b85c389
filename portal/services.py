"""Writes for teams, memberships, tokens and the cluster inventory. Each service owns its
transaction; anything that must reach Slurm is enqueued on commit and done by a Celery task."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from portal.db import copied_fields
from portal.exceptions import ApplicationError, Conflict
from portal.models import clusters_record  # noqa: F401  (recorded by the model layer: default_cluster_id needs it)
from portal.models import (
    ApiToken, Cluster, ClusterPolicyInfo, Lease, Membership, NodeInfo, PartitionInfo, Profile, Role, SyncStatus, Team,
    TeamClusterAccount, TeamIdlePolicy,
)  # fmt: skip
from portal.outbox import after_commit
from portal.proxies import client_address
from portal.slurm import (
    Association, Node, Partition, SlurmError, cluster_config, configured_clusters, get_gateway, relay_backend,
    slurm_clusters,
)  # fmt: skip
from portal.slurm.types import ClusterPolicy

logger = logging.getLogger(__name__)
User = get_user_model()


# ---------------------------------------------------------------- teams and memberships


@transaction.atomic
def team_create(
    *, name: str, slug: str, slurm_account: str, description: str = "", actor=None, request=None
) -> Team:
    team = Team(name=name, slug=slug, slurm_account=slurm_account, description=description)
    team.full_clean()
    team.save()
    audit_record(actor=actor, action="team.create", target=team, team=team, request=request,
                 data={"slug": slug, "slurm_account": slurm_account})
    after_commit("portal.tasks.team_mirror_to_slurm", team.pk)
    return team


@transaction.atomic
def team_set_active(*, team: Team, active: bool, actor=None, request=None) -> Team:
    Team.objects.filter(pk=team.pk).update(active=active)
    team.refresh_from_db()
    audit_record(actor=actor, action="team.set_active", target=team, team=team, request=request, data={"active": active})
    after_commit("portal.tasks.team_mirror_to_slurm", team.pk)
    return team


@transaction.atomic
def membership_set(*, team: Team, user, role: str = Role.MEMBER, actor=None, request=None) -> Membership:
    """Add the user to the team, or change their role."""
    if role not in Role.values:
        raise ApplicationError("Unknown role.", errors={"role": f"Use one of: {', '.join(Role.values)}."})
    profile_ensure(user=user)
    membership, created = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    audit_record(actor=actor, action="team.member_set", target=team, team=team, request=request,
                 data={"user": user.username, "role": role, "added": created})
    if created:
        after_commit("portal.tasks.team_mirror_to_slurm", team.pk)
    return membership


@transaction.atomic
def membership_remove(*, team: Team, user, actor=None, request=None) -> None:
    deleted, _ = Membership.objects.filter(team=team, user=user).delete()
    if not deleted:
        raise ApplicationError("Not a member.", errors={"user": f"{user} is not a member of {team}."}, status_code=404)
    audit_record(actor=actor, action="team.member_remove", target=team, team=team, request=request,
                 data={"user": user.username})
    after_commit("portal.tasks.team_mirror_to_slurm", team.pk)


@transaction.atomic
def team_idle_policy_set(*, team: Team, actor, enabled: bool, threshold_percent: Decimal, warn_minutes: Decimal,
                         cancel_minutes: Decimal, request=None) -> TeamIdlePolicy:  # fmt: skip
    """Set the team's idle-GPU policy (README "Idle-GPU policy"). Only the team's managers (and
    admins) may: a member gets 403. Values outside the admin's bounds (portal.idle_policy): 400 naming
    each field, also when turning the policy off (what is stored must be settable). Audited."""
    from portal.idle_policy import idle_policy_errors
    from portal.roles import is_admin, is_manager

    if not (is_manager(actor, team) or is_admin(actor)):
        raise ApplicationError("Only the team's managers may set its idle-GPU policy.", status_code=403)
    values = {"threshold_percent": Decimal(threshold_percent), "warn_minutes": Decimal(warn_minutes),
              "cancel_minutes": Decimal(cancel_minutes)}  # fmt: skip
    errors = idle_policy_errors(**values)
    if errors:
        raise ApplicationError("The idle-GPU policy is outside the site's limits.", errors=errors)
    policy, _ = TeamIdlePolicy.objects.update_or_create(
        team=team, defaults={"enabled": bool(enabled), **values, "updated_by": actor if actor.is_authenticated else None}
    )
    audit_record(actor=actor, action="team.idle_policy_set", target=team, team=team, request=request,
                 data={"enabled": bool(enabled), **{k: str(v) for k, v in values.items()}})  # fmt: skip
    return policy


def profile_ensure(*, user) -> Profile:
    profile, _ = Profile.objects.get_or_create(user=user)
    return profile


def profile_update(*, user, time_zone: str, notify_job_end: bool) -> Profile:
    """Save the user's own settings (the time zone is validated by the form: an IANA name or empty)."""
    profile = profile_ensure(user=user)
    Profile.objects.filter(pk=profile.pk).update(time_zone=time_zone, notify_job_end=notify_job_end)
    profile.refresh_from_db()
    return profile


# ---------------------------------------------------------------- Slurm associations


@dataclass(frozen=True)
class AssociationAction:
    """One difference between the portal and Slurm, and how --apply mends it."""

    kind: str  # missing_account | missing_user | extra_user | missing_default
    account: str
    user: str = ""
    cluster: str = ""  # "" (or the default cluster's name): the default cluster

    def describe(self) -> str:
        return (f"{self.cluster}: " if self.cluster and self.cluster != cluster_config().name else "") + {
            "missing_account": f"account {self.account} is missing in Slurm",
            "missing_user": f"user {self.user} is missing from account {self.account}",
            "extra_user": f"user {self.user} is in account {self.account} but not in the team",
            "missing_default": f"user {self.user} has no default account (should be {self.account})",
        }[self.kind]


def association_plan(
    *, teams: list[Team], associations: list[Association], accounts: dict[int, str] | None = None, cluster: str = ""
) -> list[AssociationAction]:
    """Differences for the given (portal-managed) teams only; accounts the portal does not manage are
    never touched. Inactive teams keep their account (for accounting) but lose their users.
    ``accounts``: each team's account on the cluster ``associations`` come from (team pk → account;
    None: Team.slurm_account, the default cluster's)."""
    account_of = (lambda team: accounts[team.pk]) if accounts is not None else (lambda team: team.slurm_account)
    existing = {a.account for a in associations if not a.user}
    users_in: dict[str, set[str]] = {}
    has_default: set[str] = set()
    for assoc in associations:
        if assoc.user:
            users_in.setdefault(assoc.account, set()).add(assoc.user)
            if assoc.is_default:
                has_default.add(assoc.user)
    all_users = {a.user for a in associations if a.user}

    default_for = default_accounts(accounts=accounts)
    wanted: dict[str, set[str]] = {account_of(t): set() for t in teams}
    for membership in Membership.objects.filter(team__in=[t.pk for t in teams], team__active=True).select_related(
        "user__profile", "team"
    ):
        wanted[account_of(membership.team)].add(_unix_name(membership.user))

    actions: list[AssociationAction] = []
    for team in teams:
        account = account_of(team)
        if account not in existing:
            actions.append(AssociationAction("missing_account", account, cluster=cluster))
        present = users_in.get(account, set())
        for user in sorted(wanted[account] - present):
            actions.append(AssociationAction("missing_user", account, user, cluster=cluster))
        for user in sorted(present - wanted[account]):
            actions.append(AssociationAction("extra_user", account, user, cluster=cluster))
    managed = set(wanted)
    for user, account in sorted(default_for.items()):
        if account in managed and user in all_users and user not in has_default:
            actions.append(AssociationAction("missing_default", account, user, cluster=cluster))
    return actions


def association_apply(
    *, actions: list[AssociationAction], default_for: dict[str, str] | None = None, cluster: str | None = None
) -> None:
    """Carry out a plan through the gateway of ``cluster`` (None: the default cluster). Each step is
    idempotent ("already exists" = success)."""
    gateway = get_gateway(cluster)
    for action in actions:
        if action.kind == "missing_account":
            gateway.account_add(action.account, description=f"gpuportal team {action.account}")
    for action in actions:
        if action.kind in ("missing_user", "missing_default"):
            is_default = (default_for or {}).get(action.user) == action.account or action.kind == "missing_default"
            gateway.user_add(action.user, action.account, default=is_default)
    for action in actions:
        if action.kind == "extra_user":
            gateway.user_remove(action.user, action.account)


def default_accounts(*, accounts: dict[int, str] | None = None) -> dict[str, str]:
    """Each member's default Slurm account: the account of their oldest active membership (of a team
    in ``accounts``, team pk → account on one cluster; None: every team, Team.slurm_account)."""
    default_for: dict[str, str] = {}
    for membership in (
        Membership.objects.filter(team__active=True).select_related("user__profile", "team").order_by("created_at", "pk")
    ):
        if accounts is None:
            default_for.setdefault(_unix_name(membership.user), membership.team.slurm_account)
        elif membership.team_id in accounts:
            default_for.setdefault(_unix_name(membership.user), accounts[membership.team_id])
    return default_for


def team_mirror(*, team: Team) -> list[AssociationAction]:
    """Make Slurm's associations for one team match the portal. Returns what was done."""
    return _teams_mirror([team])


def team_mirror_sweep() -> list[AssociationAction]:
    """The sweeper of team_mirror_to_slurm (a mirror the broker lost): every team at once, one read of
    Slurm's associations and a fix only where they differ (nothing to do when in sync)."""
    return _teams_mirror(list(Team.objects.all()))


def _teams_mirror(teams: list[Team]) -> list[AssociationAction]:
    """Per cluster: the default cluster holds every team under Team.slurm_account (as a one-cluster
    portal always did); another cluster the teams with a TeamClusterAccount there, under its account.
    One association read per cluster that has any of these teams."""
    actions: list[AssociationAction] = []
    default_name = cluster_config().name
    for config in slurm_clusters():  # a Kubernetes cluster has no associations (its teams: namespaces)
        if config.name == default_name:
            here, accounts = teams, None
        else:
            accounts = dict(
                TeamClusterAccount.objects.filter(cluster__name=config.name, team__in=[t.pk for t in teams])
                .values_list("team_id", "slurm_account")
            )  # fmt: skip
            here = [t for t in teams if t.pk in accounts]
            if not here:
                continue
        plan = association_plan(teams=here, associations=get_gateway(config.name).associations(), accounts=accounts,
                                cluster=config.name)  # fmt: skip
        association_apply(actions=plan, default_for=default_accounts(accounts=accounts), cluster=config.name)
        actions.extend(plan)
    return actions


def _unix_name(user) -> str:
    profile = getattr(user, "profile", None)
    return (profile.unix_username if profile and profile.unix_username else user.username)


# ---------------------------------------------------------------- API tokens


@transaction.atomic
def api_token_create(*, user, name: str, expires_in_days: int | None = None) -> tuple[ApiToken, str]:
    """Create a token; returns it and the key, which is never stored and cannot be shown again.
    ``expires_in_days`` None: never expires — unless API_TOKEN_MAX_DAYS caps every token's life, then
    that many days."""
    from django.conf import settings

    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ApplicationError("Give the token a name.", errors={"name": "Required, at most 100 characters."})
    cap = settings.API_TOKEN_MAX_DAYS
    if expires_in_days is None and cap:
        expires_in_days = cap
    if expires_in_days is not None and not 1 <= expires_in_days <= (cap or 3650):
        raise ApplicationError(
            "The token's lifetime is out of range.", errors={"expires_in_days": f"From 1 to {cap or 3650} days."}
        )
    now = timezone.now()
    active = ApiToken.objects.filter(user=user, revoked_at__isnull=True).exclude(expires_at__lte=now)
    if active.count() >= 50:
        raise Conflict("Too many active tokens.", errors={"name": "Revoke an old token first (limit 50)."})
    key = ApiToken.generate_key()
    token = ApiToken.objects.create(
        user=user, name=name, prefix=key[4 : 4 + ApiToken.PREFIX_LENGTH], key_hash=ApiToken.hash_key(key),
        expires_at=now + dt.timedelta(days=expires_in_days) if expires_in_days else None,
    )  # fmt: skip
    return token, key


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token: refused from the next request on (its cached lookup is dropped)."""
    from portal.authentication import api_token_forget

    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    api_token_forget(token.key_hash)
    token.refresh_from_db()
    return token


# ---------------------------------------------------------------- sync status


def sync_record_success(kind: str, *, data: dict | None = None, at: dt.datetime | None = None) -> None:
    now = at or timezone.now()
    values = {"last_success_at": now, "last_attempt_at": now, "last_error": "", "failing_since": None}
    status, created = SyncStatus.objects.get_or_create(kind=kind, defaults=values | {"data": data or {}})
    if not created:
        if data is not None:
            values["data"] = {**status.data, **data}
        SyncStatus.objects.filter(pk=status.pk).update(**values)


def sync_record_failure(kind: str, *, error: str) -> None:
    now = timezone.now()
    status, _ = SyncStatus.objects.get_or_create(kind=kind)
    SyncStatus.objects.filter(pk=status.pk).update(
        last_attempt_at=now, last_error=error[:2000], failing_since=status.failing_since or now
    )


# ---------------------------------------------------------------- cluster inventory


def cluster_row(name: str | None = None) -> Cluster:
    """The Cluster row of a configured cluster (None: the default), recorded first if it is not yet."""
    from portal.slurm import cluster_config

    config = cluster_config(name)
    row = Cluster.objects.filter(name=config.name).first()
    if row is None:
        clusters_record()
        row = Cluster.objects.get(name=config.name)
    return row


def team_cluster_account_set(*, team: Team, cluster: str, slurm_account: str = "") -> TeamClusterAccount | None:
    """Give a team access to a cluster other than the default one, under ``slurm_account`` there
    (empty: the same name as its Team.slurm_account), and mirror it to that cluster's associations
    after commit. The default cluster needs no row (None is returned)."""
    row = cluster_row(cluster)
    if row.is_default:
        return None
    account = slurm_account or team.slurm_account
    with transaction.atomic():
        link, _ = TeamClusterAccount.objects.update_or_create(team=team, cluster=row, defaults={"slurm_account": account})
        after_commit("portal.tasks.team_mirror_to_slurm", team.pk)
    return link


def clusters_sync() -> dict[str, dict | str]:
    """cluster_sync of every configured cluster, one after the other: a cluster that does not answer
    is recorded as failing and the others are still read. {name: counts, or the error}."""
    results: dict[str, dict | str] = {}
    for config in configured_clusters():
        try:
            results[config.name] = cluster_sync(cluster=config.name)
        except SlurmError as exc:
            results[config.name] = f"unavailable: {exc}"
    return results


# What cluster_sync copies unchanged from the gateway's Partition / Node onto PartitionInfo / NodeInfo:
# named once, for the new row and for the upsert's update_fields.
PARTITION_COPIED = ("is_default", "state", "default_time_minutes", "max_time_minutes")
NODE_COPIED = ("state", "available", "gpu_type", "gpus_total", "gpus_allocated", "cpus_total", "cpus_allocated", "memory_mb")


def cluster_sync(*, cluster: str | None = None) -> dict:
    """Read one cluster's partitions (with their allocation flags, ``Partition.limits``), nodes (with
    their features) and policy (QOS, MaxArraySize, OverTimeLimit, KillWait: a fixed number of Slurm
    calls, ``gateway.policy()``) and record them in bulk (``cluster`` None: the default cluster).
    Each of nodes and partitions is read once per cycle. On a Slurm error that cluster's previous
    inventory stays and its sync status says since when it is stale; the other clusters' rows are
    not touched. Without the policy (sacctmgr needs slurmdbd) the last policy row stays as it was
    (partition limits included); the nodes' features, read with the nodes, are recorded all the same."""
    row = cluster_row(cluster)
    gateway = get_gateway(row.name)
    kind = SyncStatus.kind_for("cluster", row.name)
    started = time.monotonic()
    try:
        partitions = gateway.partitions()
        nodes = gateway.nodes()
    except SlurmError as exc:
        sync_record_failure(kind, error=str(exc))
        raise
    policy, policy_error = _policy_read(gateway)
    version = _version_read(gateway)
    now = timezone.now()
    with transaction.atomic():
        _inventory_record(row, partitions, nodes, now=now)
        if policy is not None:  # else the last policy read stays (with the partition limits stored in it)
            _policy_record(row, policy, partitions, now=now)
        data = {"duration_ms": round((time.monotonic() - started) * 1000, 1), "relay_backend": relay_backend(gateway)}
        if version:  # the cluster status page's (portal.selectors.clusters_status)
            data["slurm_version"] = version
        if policy_error:
            data["policy_error"] = policy_error
        sync_record_success(kind, at=now, data=data)
    return {"partitions": len(partitions), "nodes": len(nodes)}


def _policy_read(gateway) -> tuple[ClusterPolicy | None, str]:
    """The cluster's policy (gateway.policy()) and, when it could not be read, why (None, the error)."""
    try:  # sacctmgr needs slurmdbd: without it the partitions and nodes are still worth recording
        return gateway.policy(), ""
    except SlurmError as exc:
        logger.warning("cluster sync: the policy (QOS, MaxArraySize, OverTimeLimit) was not read: %s", exc)
        return None, str(exc)[:500]


def _version_read(gateway) -> str:
    """The cluster's Slurm version ("" when it cannot be read): shown on the cluster status page."""
    try:  # sinfo --version (no controller needed)
        return gateway.version()
    except SlurmError:
        return ""


def _inventory_record(row: Cluster, partitions: list[Partition], nodes: list[Node], *, now: dt.datetime) -> None:
    """The cluster's partitions and nodes as read: the rows of those gone deleted, the others
    upserted in bulk."""
    PartitionInfo.objects.filter(cluster=row).exclude(name__in=[p.name for p in partitions]).delete()
    NodeInfo.objects.filter(cluster=row).exclude(name__in=[n.name for n in nodes]).delete()
    PartitionInfo.objects.bulk_create(
        [
            PartitionInfo(
                cluster=row, name=p.name, **copied_fields(p, PARTITION_COPIED), node_names=list(p.nodes), seen_at=now
            )
            for p in partitions
        ],
        update_conflicts=True,
        unique_fields=["cluster", "name"],
        update_fields=[*PARTITION_COPIED, "node_names", "seen_at"],
    )
    NodeInfo.objects.bulk_create(
        [
            NodeInfo(
                cluster=row,
                name=n.name,
                **copied_fields(n, NODE_COPIED),
                partitions=list(n.partitions),
                features=list(n.features),
                reason=n.reason[:255],
                seen_at=now,
            )
            for n in nodes
        ],
        update_conflicts=True,
        unique_fields=["cluster", "name"],
        update_fields=[*NODE_COPIED, "partitions", "features", "reason", "seen_at"],
    )


def _policy_record(row: Cluster, policy: ClusterPolicy, partitions: list[Partition], *, now: dt.datetime) -> None:
    """The cluster's policy as read, with its partitions' limits (Partition.limits), in its one row."""
    ClusterPolicyInfo.objects.update_or_create(
        cluster=row,
        defaults={
            "qos": list(policy.qos),
            "account_qos": {account: list(names) for account, names in policy.account_qos.items()},
            "max_array_size": policy.max_array_size,
            "over_time_limit_minutes": policy.over_time_limit_minutes,
            "kill_wait_seconds": policy.kill_wait_seconds,
            "partition_limits": {p.name: asdict(p.limits) for p in partitions},
            "seen_at": now,
        },
    )


# ---------------------------------------------------------------- audit trail


def audit_record(
    *, actor, action: str, target, team: Team | None = None, request=None, data: dict | None = None
) -> None:
    """Append one audit event. ``target`` is a model instance; ``data`` what changed (JSON-able)."""
    audit_event(actor=actor, action=action, target=target, team=team, request=request, data=data).save(force_insert=True)


def audit_event(*, actor, action: str, target, team: Team | None = None, request=None, data: dict | None = None):
    """The audit event ``audit_record`` appends, not saved yet (a service that bulk-creates it)."""
    from portal.models import AuditEvent

    return AuditEvent(
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        actor_name=getattr(actor, "username", "") or "system",
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        team=team,
        address=client_address(request),
        data=data or {},
    )


def lease_claim(*, name: str, holder: str, seconds: float) -> bool:
    """Take or keep the lease ``name`` (portal.models.Lease) for ``seconds`` from now, by the
    database's clock: True when ``holder`` holds it now. One conditional UPDATE (the holder's own
    lease, or one that has expired), so two processes never both succeed for the same period; the
    row is created, expired, the first time."""
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    Lease.objects.bulk_create([Lease(name=name, holder="", expires_at=epoch)], ignore_conflicts=True)
    until = ExpressionWrapper(Now() + Value(dt.timedelta(seconds=seconds)), output_field=DateTimeField())
    taken = Case(When(holder=holder, then=F("acquired_at")), default=Now(), output_field=DateTimeField())
    updated = Lease.objects.filter(Q(holder=holder) | Q(expires_at__lt=Now()), name=name).update(
        holder=holder, expires_at=until, acquired_at=taken
    )
    return updated == 1


def lease_release(*, name: str, holder: str) -> bool:
    """Give the lease up at once (a clean stop): another process takes it at its next claim."""
    return Lease.objects.filter(name=name, holder=holder).update(expires_at=Now()) == 1

