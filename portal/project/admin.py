from django.contrib import admin, messages

from portal import services
from portal.authentication import api_token_forget
from portal.models import (
    ApiToken, AuditEvent, Cluster, ClusterPolicyInfo, Membership, NodeInfo, PartitionInfo, Profile, SyncStatus, Team,
    TeamClusterAccount,
)  # fmt: skip


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class TeamClusterAccountInline(admin.TabularInline):
    """The team's access to clusters other than the default one, and its account there (saving the
    team mirrors it to every cluster's associations)."""

    model = TeamClusterAccount
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    """As configured (GPUPORTAL_CLUSTERS) and recorded by record_clusters / migrate: read-only here."""

    list_display = [
        "name", "is_default", "active", "slurm_version", "relay_backend", "backend", "last_sync", "accounting_rollup",
        "slurm_conf", "recorded_at",
    ]  # fmt: skip
    readonly_fields = [
        "name", "backend", "slurm_conf", "bin_dir", "lib_dir", "is_default", "active", "recorded_at", "accounting_rollup",
    ]  # fmt: skip

    @admin.display(description="accounting roll-up")
    def accounting_rollup(self, obj):
        """How far the cluster's slurmdbd has rolled usage up (sreport's reach): STALE when late."""
        from accounting.selectors import rollup_status

        if not obj.active:
            return "—"
        status = rollup_status(obj.name)
        return f"STALE: {status.message}" if status.stale else status.message

    def _sync(self, obj):
        """The cluster's inventory sync status (its Slurm version and relay backend), one query per row: a few clusters."""
        from portal.models import SyncStatus

        return SyncStatus.objects.filter(kind=SyncStatus.kind_for("cluster", obj.name)).first()

    @admin.display(description="Slurm version")
    def slurm_version(self, obj) -> str:
        status = self._sync(obj)
        return status.data.get("slurm_version", "") if status else ""

    @admin.display(description="relay backend")
    def relay_backend(self, obj) -> str:
        status = self._sync(obj)
        return status.data.get("relay_backend", "") if status else ""

    @admin.display(description="last sync")
    def last_sync(self, obj):
        status = self._sync(obj)
        return status.last_success_at if status else None

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "slurm_account", "active"]
    list_filter = ["active"]
    search_fields = ["name", "slug", "slurm_account"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline, TeamClusterAccountInline]
    actions = ["mirror_to_slurm"]

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        # Creating a team or changing its members in the admin is mirrored to Slurm too.
        services.team_set_active(team=form.instance, active=form.instance.active, actor=request.user, request=request)

    @admin.action(description="Mirror to Slurm associations now")
    def mirror_to_slurm(self, request, queryset):
        for team in queryset:
            services.team_set_active(team=team, active=team.active, actor=request.user, request=request)
        messages.info(request, f"Queued {queryset.count()} team(s) for mirroring.")


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ["user", "unix_username", "identity_source", "unix_uid", "unix_gid", "time_zone", "notify_job_end"]
    list_filter = ["identity_source"]
    readonly_fields = ["identity_source", "unix_uid", "unix_gid"]  # the directory's, set at each directory login
    search_fields = ["user__username", "unix_username"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at"]
    readonly_fields = ["user", "prefix", "key_hash", "created_at", "last_used_at"]
    search_fields = ["user__username", "name", "prefix"]

    def has_add_permission(self, request):
        return False  # tokens are created by their owner (shown once) or by create_api_token

    # a token revoked, given an expiry or deleted here is refused from the next request on
    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        api_token_forget(obj.key_hash)

    def delete_model(self, request, obj):
        api_token_forget(obj.key_hash)
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for key_hash in queryset.values_list("key_hash", flat=True):
            api_token_forget(key_hash)
        super().delete_queryset(request, queryset)


@admin.register(PartitionInfo)
class PartitionInfoAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "is_default", "state", "default_time_minutes", "max_time_minutes", "seen_at"]
    list_filter = ["cluster"]


@admin.register(NodeInfo)
class NodeInfoAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "state", "gpu_type", "gpus_total", "gpus_allocated", "features", "seen_at"]
    list_filter = ["cluster"]


@admin.register(ClusterPolicyInfo)
class ClusterPolicyInfoAdmin(admin.ModelAdmin):
    list_display = ["qos", "max_array_size", "seen_at"]


@admin.register(SyncStatus)
class SyncStatusAdmin(admin.ModelAdmin):
    list_display = ["kind", "last_success_at", "failing_since", "last_error"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the trail is append-only."""

    list_display = ["at", "actor_name", "action", "target_type", "target_id", "team", "address"]
    list_filter = ["action", "target_type", "team"]
    search_fields = ["actor_name", "target_id", "action"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
