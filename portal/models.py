"""Teams (Slurm accounts), memberships and roles, user profiles, API tokens, and the cluster
inventory the periodic sync records."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.db.models import Q

from portal.snapshots import INVENTORY, ROLES, SnapshotManager

SLURM_NAME_VALIDATOR = RegexValidator(
    r"^[a-z][a-z0-9_-]{0,63}$",
    "Use 1–64 lower-case letters, digits, '-' or '_', starting with a letter.",
)
UNIX_NAME_VALIDATOR = RegexValidator(
    r"^[a-z_][a-z0-9_-]{0,31}$",
    "Use a Unix user name: 1–32 lower-case letters, digits, '-' or '_'.",
)


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    MANAGER = "manager", "Manager"


class Team(models.Model):
    """A team and its Slurm account: ``slurm_account`` on the default cluster; on every other cluster
    the team has access where a TeamClusterAccount row says so, under that row's account."""

    objects = SnapshotManager(ROLES)

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=64, unique=True)
    slurm_account = models.CharField(max_length=64, unique=True, validators=[SLURM_NAME_VALIDATOR])
    description = models.TextField(blank=True)
    active = models.BooleanField(default=True)
    alert_webhook_url = models.URLField(blank=True, help_text="JSON POST on budget alerts (optional).")
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    # Moved by the database itself whenever a quota or booking of the team changes in a way the
    # budget counts (triggers: accounting migration 0011); never lowered (a save of a stale copy keeps
    # the stored one: portal migration 0010). The budget check reads it under the team's row lock to
    # know whether this process's copies of the quotas and bookings are current
    # (accounting.selectors.budget_copies_current). Never read it from a Team instance.
    budget_version = models.BigIntegerField(db_default=0, editable=False)

    class Meta:
        ordering = ["name"]
        permissions = [("view_cost_reports", "Can read cost reports of every team")]

    def __str__(self) -> str:
        return self.name


class TeamIdlePolicy(models.Model):
    """A team's idle-GPU policy (issue 40 item 3), set by its managers within the site's bounds
    (settings GPU_IDLE_POLICY_*; portal.services.team_idle_policy_set): a running job whose GPUs all
    stayed under ``threshold_percent`` for ``warn_minutes`` warns its submitter, and ``cancel_minutes``
    after the warning the portal cancels it (jobs.services.gpu_alerts). No row, or ``enabled`` off: no
    policy (the default). Minutes may have a fraction (two places)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, primary_key=True, related_name="idle_policy")
    enabled = models.BooleanField(default=False)
    threshold_percent = models.DecimalField(max_digits=5, decimal_places=2)
    warn_minutes = models.DecimalField(max_digits=8, decimal_places=2)
    cancel_minutes = models.DecimalField(max_digits=8, decimal_places=2)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(threshold_percent__gt=0) & Q(threshold_percent__lte=100), name="teamidlepolicy_threshold"),
            models.CheckConstraint(condition=Q(warn_minutes__gt=0) & Q(cancel_minutes__gt=0), name="teamidlepolicy_minutes"),
        ]

    def __str__(self) -> str:
        return f"idle-GPU policy of {self.team_id}"


class TeamClusterAccount(models.Model):
    """A team's access to a cluster other than the default one, and its Slurm account there (often
    the same name as ``Team.slurm_account``). Read by submission (no row: the cluster is refused),
    the relay (``--account``) and the team mirror (associations per cluster)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="cluster_accounts")
    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="team_accounts")
    slurm_account = models.CharField(max_length=64, validators=[SLURM_NAME_VALIDATOR])

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "cluster"], name="teamclusteraccount_unique_team_cluster"),
            models.UniqueConstraint(fields=["cluster", "slurm_account"], name="teamclusteraccount_unique_account"),
        ]

    def __str__(self) -> str:
        return f"{self.team} on {self.cluster}: {self.slurm_account}"


class Membership(models.Model):
    objects = SnapshotManager(ROLES)

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")]
        # visibility selectors filter by user: memberships__user=...
        indexes = [models.Index(fields=["user", "team"], name="membership_user_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class IdentitySource(models.TextChoices):
    """Where a user's account comes from. A directory (LDAP, OIDC) owns the Unix account too: the
    portal records its uid/gid and never creates it (portal.unix.unix_user_ensure)."""

    LOCAL = "local", "Portal (password)"
    LDAP = "ldap", "LDAP directory"
    OIDC = "oidc", "OpenID Connect"


class Profile(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    unix_username = models.CharField(
        max_length=32, blank=True, validators=[UNIX_NAME_VALIDATOR], help_text="Empty: the login name."
    )
    identity_source = models.CharField(
        max_length=8, choices=IdentitySource.choices, default=IdentitySource.LOCAL,
        help_text="Set at each directory login (LDAP/OIDC); such users' Unix accounts belong to the directory.",
    )  # fmt: skip
    unix_uid = models.PositiveIntegerField(null=True, blank=True, help_text="From the directory (uidNumber).")
    unix_gid = models.PositiveIntegerField(null=True, blank=True, help_text="From the directory (gidNumber).")
    time_zone = models.CharField(max_length=64, blank=True, help_text="Empty: the site's time zone.")
    notify_job_end = models.BooleanField(default=False, help_text="Email me when my jobs end.")

    def __str__(self) -> str:
        return f"profile of {self.user}"

    @property
    def cluster_username(self) -> str:
        return self.unix_username or self.user.username

    @property
    def directory_owned(self) -> bool:
        return self.identity_source != IdentitySource.LOCAL


class ApiToken(models.Model):
    """A personal API token. Only a SHA-256 of the key is stored; the key is shown once."""

    PREFIX_LENGTH = 8

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=PREFIX_LENGTH)
    key_hash = models.CharField(max_length=64, unique=True)  # authentication looks tokens up by hash
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def is_expired(self, now=None) -> bool:
        from django.utils import timezone

        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @staticmethod
    def generate_key() -> str:
        return "gpp_" + secrets.token_urlsafe(32)


class Cluster(models.Model):
    """A Slurm (or Kubernetes: ``kind``) cluster the portal serves, as configured (settings.GPUPORTAL_CLUSTERS, portal/slurm/clusters.py)
    and recorded by ``portal.services.clusters_record`` (after every migrate, and by the command
    ``record_clusters``). Settings are the source: the gateway reads them, the row is what the
    inventory, jobs and bookings point at. A cluster no longer configured stays, inactive, with its rows."""

    objects = SnapshotManager(INVENTORY)

    name = models.CharField(max_length=64, unique=True, validators=[SLURM_NAME_VALIDATOR])  # slurmdbd's ClusterName
    backend = models.CharField(max_length=16, default="auto")
    slurm_conf = models.CharField(max_length=1024, blank=True)
    bin_dir = models.CharField(max_length=1024, blank=True)
    lib_dir = models.CharField(max_length=1024, blank=True)
    # which scheduler runs its jobs (portal.slurm.clusters.KINDS): a Kubernetes cluster (issue 41) has
    # no Slurm accounts, associations, reservations or sacct; its jobs are batch/v1 Jobs
    kind = models.CharField(max_length=16, default="slurm")
    kubeconfig = models.CharField(max_length=1024, blank=True)
    is_default = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    recorded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-is_default", "name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=models.Q(is_default=True), name="cluster_one_default"),
        ]

    def __str__(self) -> str:
        return self.name


def clusters_record() -> list[Cluster]:
    """Record the configured clusters (settings.GPUPORTAL_CLUSTERS) as Cluster rows: new ones added, the
    others updated, those no longer configured marked inactive (their rows stay). Idempotent; run
    after every migrate (portal/apps.py) and by ``manage.py record_clusters``. Here, not in
    portal.services, because a row's default cluster (default_cluster_id) may need it first."""
    from portal.slurm import configured_clusters

    configs = configured_clusters()
    with transaction.atomic():
        Cluster.objects.exclude(name=configs[0].name).filter(is_default=True).update(is_default=False)
        Cluster.objects.exclude(name__in=[c.name for c in configs]).update(active=False)
        rows = []
        for index, config in enumerate(configs):
            row, _ = Cluster.objects.update_or_create(
                name=config.name,
                defaults={"backend": config.backend, "slurm_conf": config.slurm_conf, "bin_dir": config.bin_dir,
                          "lib_dir": config.lib_dir, "kind": config.kind, "kubeconfig": config.kubeconfig,
                          "is_default": index == 0, "active": True},
            )  # fmt: skip
            rows.append(row)
    return rows


def user_reference() -> models.ForeignKey:
    """A row's reference to the user who did something (created, decided, cancelled it): optional,
    set to NULL when the user is deleted (the row stays), no reverse accessor on the user."""
    return models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")


def default_cluster_id() -> int:
    """The default cluster's pk (the first configured): the default of every row's ``cluster``, so
    that code written for one cluster keeps working. Recorded on first use when it is not yet."""
    from portal.slurm import cluster_config

    name = cluster_config().name
    pk = Cluster.objects.filter(name=name).values_list("pk", flat=True).first()
    if pk is None:
        clusters_record()
        pk = Cluster.objects.get(name=name).pk
    return pk


class PartitionInfo(models.Model):
    """A Slurm partition of one cluster as last seen by sync_cluster."""

    objects = SnapshotManager(INVENTORY)

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="partitions", default=default_cluster_id)
    name = models.CharField(max_length=64)
    is_default = models.BooleanField(default=False)
    state = models.CharField(max_length=16)
    default_time_minutes = models.PositiveIntegerField(null=True, blank=True)
    max_time_minutes = models.PositiveIntegerField(null=True, blank=True)  # None = unlimited
    node_names = models.JSONField(default=list)
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["-is_default", "name"]
        # sync_cluster's upsert; a partition name may exist on several clusters (submission then needs `cluster`)
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="partitioninfo_unique_cluster_name")]

    def __str__(self) -> str:
        return self.name


class NodeInfo(models.Model):
    """A Slurm node of one cluster as last seen by sync_cluster."""

    objects = SnapshotManager(INVENTORY)

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes", default=default_cluster_id)
    name = models.CharField(max_length=64)
    state = models.CharField(max_length=64)
    available = models.BooleanField(default=True)
    partitions = models.JSONField(default=list)
    gpu_type = models.CharField(max_length=32, blank=True)
    gpus_total = models.PositiveIntegerField(default=0)
    gpus_allocated = models.PositiveIntegerField(default=0)
    cpus_total = models.PositiveIntegerField(default=0)
    cpus_allocated = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveBigIntegerField(default=0)
    features = models.JSONField(default=list)  # AvailableFeatures (what --constraint names)
    reason = models.CharField(max_length=255, blank=True)
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="nodeinfo_unique_cluster_name")]

    def __str__(self) -> str:
        return self.name


class ClusterPolicyInfo(models.Model):
    """What a cluster allows beyond partitions and nodes, as last seen by sync_cluster (one row per
    cluster): its QOS, the QOS each account may use, MaxArraySize."""

    objects = SnapshotManager(INVENTORY)

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="policy", default=default_cluster_id)
    qos = models.JSONField(default=list)
    account_qos = models.JSONField(default=dict)  # account -> [QOS, ...]; an account absent: not known
    max_array_size = models.PositiveIntegerField(null=True, blank=True)  # None: Slurm did not say
    # how far past its time limit a job can run (scontrol show config): OverTimeLimit in minutes
    # (-1: UNLIMITED, portal.slurm.types.OVER_TIME_UNLIMITED) and KillWait; Slurm's defaults until read
    over_time_limit_minutes = models.IntegerField(default=0)
    kill_wait_seconds = models.PositiveIntegerField(default=30)
    # partition -> its flags that change an allocation (portal.slurm.types.PartitionLimits as a dict)
    partition_limits = models.JSONField(default=dict, blank=True)
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"cluster policy of {self.seen_at:%Y-%m-%d %H:%M}"


class SyncStatus(models.Model):
    """When a periodic Slurm read last succeeded or failed (one row per kind: cluster, jobs, usage;
    per cluster: the default cluster's kinds are the bare names, another's are "cluster:NAME" …,
    ``portal.selectors.sync_kind``)."""

    kind = models.CharField(max_length=32, unique=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    failing_since = models.DateTimeField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)  # e.g. usage high-water mark, cycle duration

    def __str__(self) -> str:
        return self.kind

    @staticmethod
    def kind_for(kind: str, cluster: str | None = None) -> str:
        """The row of one periodic read of one cluster: the bare kind for the default cluster (what a
        one-cluster portal always had), "kind:NAME" for another."""
        from portal.slurm import cluster_config

        return kind if not cluster or cluster == cluster_config().name else f"{kind}:{cluster}"

    @property
    def is_stale(self) -> bool:
        return self.failing_since is not None or self.last_success_at is None


class Lease(models.Model):
    """Work that must run in one process across the site, whichever host it is on (Celery beat:
    portal/beat.py): one row per kind of work, held by one process until ``expires_at`` (the
    database's clock) unless renewed; another takes it once it has expired (portal.services.lease_claim).
    The row lives in the database because the database is what every host shares and what itself
    fails over; an operator reads who holds what here (``holder``: host:pid:random)."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField(null=True, blank=True)  # when this holder took it

    def __str__(self) -> str:
        return f"{self.name}: {self.holder or 'nobody'} until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class AuditEvent(models.Model):
    """Append-only trail of who did what, when and from where (quota, booking, rate, team, job actions).
    Rows are only ever inserted (``portal.services.audit_record``); the admin shows them read-only."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = user_reference()
    actor_name = models.CharField(max_length=150, blank=True)  # kept when the user is deleted
    action = models.CharField(max_length=64)  # e.g. "job.submit", "quota.approve", "team.member_add"
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    address = models.GenericIPAddressField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        # the admin's filter: one object's history
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target_type}:{self.target_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("Audit events are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("Audit events are append-only.")
