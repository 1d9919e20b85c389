"""API views of the portal app (under /api/v1/): cluster inventory and teams."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.generics import ListAPIView
from rest_framework.views import APIView

from portal.roles import is_admin
from portal.selectors import cluster_summary, clusters_status, team_idle_policy, teams_visible_to
from portal.services import team_idle_policy_set


class ClusterApi(APIView):
    class ClusterGpuTypeSerializer(serializers.Serializer):
        gpu_type = serializers.CharField()
        nodes = serializers.IntegerField()
        total = serializers.IntegerField()
        allocated = serializers.IntegerField()
        free = serializers.IntegerField()
        unavailable = serializers.IntegerField()

    class ClusterPartitionSerializer(serializers.Serializer):
        name = serializers.CharField()
        cluster = serializers.CharField(help_text="Its cluster when the portal serves several (empty with one).")
        is_default = serializers.BooleanField()
        state = serializers.CharField()
        default_time_minutes = serializers.IntegerField(allow_null=True)
        max_time_minutes = serializers.IntegerField(allow_null=True)
        nodes = serializers.IntegerField()
        gpu_types = serializers.ListField(child=serializers.CharField())
        max_gpus_per_node = serializers.IntegerField()
        gpus_total = serializers.IntegerField()
        gpus_allocated = serializers.IntegerField()
        gpus_free = serializers.IntegerField()

    class ClusterNodeSerializer(serializers.Serializer):
        name = serializers.CharField()
        state = serializers.CharField()
        reason = serializers.CharField()

    class ClusterOutputSerializer(serializers.Serializer):
        gpu_types = serializers.ListField(child=serializers.DictField())
        partitions = serializers.ListField(child=serializers.DictField())
        nodes_unavailable = serializers.ListField(child=serializers.DictField())
        last_success_at = serializers.DateTimeField(allow_null=True)
        stale = serializers.BooleanField()
        failing_since = serializers.DateTimeField(allow_null=True)

    @extend_schema(responses=ClusterOutputSerializer, summary="GPUs per type and partition, nodes down, last sync")
    def get(self, request):
        summary = cluster_summary()
        data = {
            "gpu_types": self.ClusterGpuTypeSerializer(summary["gpu_types"], many=True).data,
            "partitions": self.ClusterPartitionSerializer(summary["partitions"], many=True).data,
            "nodes_unavailable": self.ClusterNodeSerializer(summary["nodes_unavailable"], many=True).data,
            "last_success_at": summary["last_success_at"],
            "stale": summary["stale"],
            "failing_since": summary["failing_since"],
        }
        return Response(self.ClusterOutputSerializer(data).data)


class ClusterHealthConditionSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="never_read, sync_failing, policy_unread, nodes_unavailable, …")
    message = serializers.CharField()


class ClusterHealthSerializer(serializers.Serializer):
    ok = serializers.BooleanField(help_text="No condition holds.")
    conditions = ClusterHealthConditionSerializer(many=True, help_text="What is wrong; more codes may come.")


class ClusterStatusSerializer(serializers.Serializer):
    name = serializers.CharField()
    is_default = serializers.BooleanField()
    kind = serializers.ChoiceField(choices=["slurm", "kubernetes"], help_text="Which scheduler runs the cluster's jobs.")
    version = serializers.CharField(
        help_text="The scheduler and its version as the last inventory sync read it: 'Slurm 22.05.8' (sinfo "
        "--version), 'Kubernetes v1.20.2' (the API server's /version); empty: not yet."
    )
    slurm_version = serializers.CharField(help_text="As the last inventory sync read it (sinfo --version); empty: not yet, or not Slurm.")
    relay_backend = serializers.CharField(
        help_text="How jobs are submitted: pyslurm, sbatch or kubernetes (batch/v1 Jobs); empty: not known yet."
    )
    configured_backend = serializers.CharField(help_text="GPUPORTAL_CLUSTERS' backend: auto, cli, pyslurm or kubernetes.")
    health = ClusterHealthSerializer()
    last_success_at = serializers.DateTimeField(allow_null=True)
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    failing_since = serializers.DateTimeField(allow_null=True)
    nodes_total = serializers.IntegerField()
    nodes_available = serializers.IntegerField()
    nodes_unavailable = serializers.ListField(child=serializers.DictField())
    gpu_types = ClusterApi.ClusterGpuTypeSerializer(many=True, help_text="GPUs per type on this cluster.")
    partitions = ClusterApi.ClusterPartitionSerializer(many=True, help_text="Each partition and its limits.")
    max_array_size = serializers.IntegerField(allow_null=True)


class ClusterListApi(ListAPIView):
    """Every cluster the portal serves, as the cluster status page shows it (portal.selectors.clusters_status)."""

    serializer_class = ClusterStatusSerializer
    filter_backends = []  # a handful of clusters, no filters

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator: no rows to read
            return []
        return clusters_status()

    @extend_schema(summary="Every cluster: Slurm version, relay backend, health, last sync, GPUs free, partitions")
    def get(self, request, *args, **kwargs):
        return self.list(request, *args, **kwargs)


class TeamOutputSerializer(serializers.Serializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    slurm_account = serializers.CharField()
    active = serializers.BooleanField()
    role = serializers.SerializerMethodField()

    def get_role(self, team) -> str | None:
        user = self.context["request"].user
        roles = self.context.get("roles")
        if roles is None:
            roles = self.context["roles"] = dict(user.memberships.values_list("team_id", "role"))
        return roles.get(team.pk) or ("admin" if is_admin(user) else None)


class TeamListApi(ListAPIView):
    """Teams visible to you, paginated."""

    serializer_class = TeamOutputSerializer

    def get_queryset(self):
        return teams_visible_to(self.request.user).order_by("name")


class TeamDetailApi(APIView):
    class TeamDetailOutputSerializer(TeamOutputSerializer):
        members = serializers.SerializerMethodField()

        def get_members(self, team) -> list[dict]:
            return [
                {"username": m.user.username, "role": m.role}
                for m in team.memberships.select_related("user").order_by("user__username")
            ]

    @extend_schema(responses=TeamDetailOutputSerializer, summary="One team and its members")
    def get(self, request, slug: str):
        team = get_object_or_404(teams_visible_to(request.user), slug=slug)
        return Response(self.TeamDetailOutputSerializer(team, context={"request": request}).data)


class IdlePolicyValuesSerializer(serializers.Serializer):
    """A team's idle-GPU policy as it applies now (clamped into the bounds)."""

    threshold_percent = serializers.FloatField()
    warn_minutes = serializers.FloatField()
    cancel_minutes = serializers.FloatField()


class IdlePolicyBoundsSerializer(serializers.Serializer):
    """The admin's bounds on the teams' idle-GPU policies (settings GPU_IDLE_POLICY_*)."""

    max_threshold_percent = serializers.DecimalField(max_digits=5, decimal_places=2, coerce_to_string=True)
    min_warn_minutes = serializers.DecimalField(max_digits=10, decimal_places=2, coerce_to_string=True)
    min_cancel_minutes = serializers.DecimalField(max_digits=10, decimal_places=2, coerce_to_string=True)
    max_minutes = serializers.DecimalField(max_digits=10, decimal_places=2, coerce_to_string=True)


class TeamIdlePolicyApi(APIView):
    """The team's idle-GPU policy (README "Idle-GPU policy"): read by its members, set by its managers
    within the admin's bounds (settings GPU_IDLE_POLICY_*)."""

    class IdlePolicyInputSerializer(serializers.Serializer):
        enabled = serializers.BooleanField()
        threshold_percent = serializers.DecimalField(max_digits=5, decimal_places=2,
                                                     help_text="A GPU under this utilisation (%) is idle.")  # fmt: skip
        warn_minutes = serializers.DecimalField(max_digits=8, decimal_places=2,
                                                help_text="All of a job's GPUs idle this long: its submitter is warned.")  # fmt: skip
        cancel_minutes = serializers.DecimalField(max_digits=8, decimal_places=2,
                                                  help_text="This long after the warning, still idle: the job is cancelled.")  # fmt: skip

    class IdlePolicyOutputSerializer(serializers.Serializer):
        enabled = serializers.BooleanField(help_text="Off by default: no job of the team is warned or cancelled by it.")
        threshold_percent = serializers.DecimalField(max_digits=5, decimal_places=2, coerce_to_string=True)
        warn_minutes = serializers.DecimalField(max_digits=8, decimal_places=2, coerce_to_string=True)
        cancel_minutes = serializers.DecimalField(max_digits=8, decimal_places=2, coerce_to_string=True)
        effective = serializers.SerializerMethodField(help_text="What applies now: the values clamped into the bounds in force.")
        bounds = serializers.SerializerMethodField(help_text="The admin's limits.")
        updated_at = serializers.DateTimeField(allow_null=True)
        updated_by = serializers.CharField()

        @extend_schema_field(IdlePolicyValuesSerializer)
        def get_effective(self, policy) -> dict:
            return IdlePolicyValuesSerializer(policy["effective"]).data

        @extend_schema_field(IdlePolicyBoundsSerializer)
        def get_bounds(self, policy) -> dict:
            return IdlePolicyBoundsSerializer(policy["bounds"]).data

    @extend_schema(responses=IdlePolicyOutputSerializer, summary="The team's idle-GPU policy and the site's bounds")
    def get(self, request, slug: str):
        team = get_object_or_404(teams_visible_to(request.user), slug=slug)
        return Response(self.IdlePolicyOutputSerializer(team_idle_policy(team)).data)

    @extend_schema(
        request=IdlePolicyInputSerializer, responses=IdlePolicyOutputSerializer,
        summary="Set the team's idle-GPU policy (its managers)",
        description="A value outside the admin's bounds answers 400 naming the field; a member who is not a manager, 403.",
    )  # fmt: skip
    def put(self, request, slug: str):
        team = get_object_or_404(teams_visible_to(request.user), slug=slug)
        serializer = self.IdlePolicyInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        team_idle_policy_set(team=team, actor=request.user, request=request, **serializer.validated_data)
        return Response(self.IdlePolicyOutputSerializer(team_idle_policy(team)).data)
