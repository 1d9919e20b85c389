"""API of accounting: the cost report (admins and finance) and a team's usage (its members)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting.forms import default_range, validate_range
from accounting.reports import rows_to_csv
from accounting.selectors import GROUP_BY_CHOICES, can_see_user_breakdown, cost_report, usage_teams_visible_to
from portal.roles import can_read_cost_reports


class CsvRenderer(BaseRenderer):
    """Lets ``?format=csv`` through DRF's content negotiation; the view hands it CSV text."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data.encode(self.charset)
        # an error ({"detail", "errors"}) asked for as CSV: one "detail" column
        detail = data.get("detail", "") if isinstance(data, dict) else str(data)
        return f'detail\n"{str(detail).replace(chr(34), chr(39))}"\n'.encode(self.charset)


class UsageRangeQuerySerializer(serializers.Serializer):
    start = serializers.DateField(required=False, help_text="First day (billing time zone). Default: 1st of this month.")
    end = serializers.DateField(required=False, help_text="Last day, inclusive. Default: today.")

    def validate(self, attrs):
        default = default_range()
        attrs["start"] = attrs.get("start") or default[0]
        attrs["end"] = attrs.get("end") or default[1]
        errors = validate_range(attrs["start"], attrs["end"])
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class CostReportQuerySerializer(UsageRangeQuerySerializer):
    group_by = serializers.ChoiceField(choices=GROUP_BY_CHOICES, required=False, default="team")


class CostReportRowSerializer(serializers.Serializer):
    group_by = serializers.CharField()
    key = serializers.CharField()
    label = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=2)
    requested_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=2)
    efficiency = serializers.FloatField(allow_null=True, help_text="Used / requested GPU-hours.")
    cost = serializers.DecimalField(max_digits=18, decimal_places=2)
    unpriced_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=2, help_text="Hours with no rate.")
    provisional = serializers.BooleanField(help_text="Includes jobs still running.")
    currency = serializers.CharField()


class CostReportSerializer(serializers.Serializer):
    start = serializers.DateField()
    end = serializers.DateField()
    group_by = serializers.CharField()
    results = CostReportRowSerializer(many=True)


class CostReportApi(APIView):
    """GPU-hours, efficiency and cost between two dates grouped by team, user, GPU type or month.
    Admins and finance only. ``?format=csv`` answers the same rows as CSV."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[CostReportQuerySerializer, OpenApiParameter("format", str, enum=["json", "csv"])],
        responses=CostReportSerializer,
    )
    def get(self, request):
        if not can_read_cost_reports(request.user):
            raise PermissionDenied("Cost reports are for admins and finance.")
        params = CostReportQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        query = params.validated_data
        rows = cost_report(start=query["start"], end=query["end"], group_by=query["group_by"])
        if request.accepted_renderer.format == "csv":
            filename = f"cost-{query['group_by']}-{query['start']}-{query['end']}.csv"
            return Response(
                rows_to_csv(rows), content_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{filename}"'}
            )
        data = {"start": query["start"], "end": query["end"], "group_by": query["group_by"], "results": rows}
        return Response(CostReportSerializer(data).data)


class TeamUsageSerializer(serializers.Serializer):
    team = serializers.SlugField()
    start = serializers.DateField()
    end = serializers.DateField()
    months = CostReportRowSerializer(many=True)
    users = CostReportRowSerializer(many=True, allow_null=True, help_text="Per-user breakdown (managers, admins, finance); null otherwise.")


class TeamUsageApi(APIView):
    """A team's GPU-hours and cost per month; managers (and admins, finance) also get the per-user
    breakdown. Teams the caller cannot see answer 404."""

    @extend_schema(parameters=[UsageRangeQuerySerializer], responses=TeamUsageSerializer)
    def get(self, request, slug: str):
        team = get_object_or_404(usage_teams_visible_to(request.user), slug=slug)
        params = UsageRangeQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        start, end = params.validated_data["start"], params.validated_data["end"]
        months = cost_report(start=start, end=end, group_by="month", team=team)
        users = cost_report(start=start, end=end, group_by="user", team=team) if can_see_user_breakdown(request.user, team) else None
        data = {"team": team.slug, "start": start, "end": end, "months": months, "users": users}
        return Response(TeamUsageSerializer(data).data)


