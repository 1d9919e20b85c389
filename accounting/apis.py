"""API of accounting: the cost report (admins and finance) and a team's usage (its members)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.generics import ListAPIView
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting.forms import (
    DAY_OR_DATETIME_INVALID,
    day_or_datetime,
    default_range,
    report_range,
    validate_range,
)
from accounting.models import QUOTA_MAX_GPUS
from accounting.reports import rows_to_csv
from accounting.selectors import GROUP_BY_CHOICES, can_see_user_breakdown, cost_report, usage_teams_visible_to
from portal.fields import DecimalStringField, StrictCharField
from portal.roles import can_read_cost_reports
from portal.schema import ErrorSerializer


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


@extend_schema_field(OpenApiTypes.STR)
class DayOrDateTimeField(serializers.Field):
    """A day (``2026-12-03``) or an ISO 8601 datetime (``2026-12-03T12:00:00Z``; without an offset:
    the billing time zone): accounting.forms.day_or_datetime, as the report page's form."""

    default_error_messages = {"invalid": DAY_OR_DATETIME_INVALID}

    def to_internal_value(self, data):
        try:
            return day_or_datetime(data)
        except ValueError:
            self.fail("invalid")

    def to_representation(self, value):
        return value.isoformat()


class CostReportQuerySerializer(serializers.Serializer):
    """The cost report's range: whole days (``end`` inclusive, billing time zone), or any range of
    ISO datetimes [start, end) — one hour, say; a day and a datetime mix (accounting.forms.report_range,
    the report page's rule)."""

    start = DayOrDateTimeField(required=False, help_text="First day, or a date and time (ISO 8601). Default: 1st of this month.")
    end = DayOrDateTimeField(required=False, help_text="Last day (inclusive), or a date and time (exclusive). Default: today.")
    group_by = serializers.ChoiceField(choices=GROUP_BY_CHOICES, required=False, default="team")
    cluster = serializers.CharField(required=False, default="", allow_blank=True, max_length=64,
                                    help_text="Only this cluster's usage and bookings (a cluster name); empty: every cluster.")  # fmt: skip

    def validate(self, attrs):
        span, errors = report_range(attrs.get("start"), attrs.get("end"))
        if errors:
            raise serializers.ValidationError({field: [message] for field, message in errors.items()})
        attrs.update(start=span.start, end=span.end, start_at=span.start_at, end_at=span.end_at, range=span)
        return attrs


class CostReportRowSerializer(serializers.Serializer):
    group_by = serializers.CharField()
    key = serializers.CharField()
    label = serializers.CharField()
    gpu_hours = DecimalStringField()
    requested_gpu_hours = DecimalStringField()
    efficiency = serializers.FloatField(allow_null=True, help_text="Used / requested GPU-hours.")
    cost = DecimalStringField(help_text="usage_cost + bookings_cost.")
    usage_cost = DecimalStringField(required=False)
    bookings_cost = DecimalStringField(required=False, help_text="Reserved GPU-hours of bookings.")
    unpriced_gpu_hours = DecimalStringField(help_text="Hours with no rate.")
    provisional = serializers.BooleanField(help_text="Includes jobs still running.")
    currency = serializers.CharField()
    monitored_gpu_hours = DecimalStringField(allow_null=True, help_text="GPU-hours paid whose GPUs the GPU monitoring saw.")
    busy_gpu_hours = DecimalStringField(allow_null=True, help_text="What those GPUs computed (utilisation-weighted GPU-hours).")
    gpu_efficiency = serializers.FloatField(allow_null=True, help_text="Busy / monitored GPU-hours.")
    idle_cost = DecimalStringField(allow_null=True, help_text="The cost of the idle share of the monitored GPU-hours.")


class CostReportSerializer(serializers.Serializer):
    start = DayOrDateTimeField(help_text="As asked: a day, or a date and time.")
    end = DayOrDateTimeField(help_text="As asked: a day (inclusive), or a date and time (exclusive).")
    start_at = serializers.DateTimeField(help_text="The range's start.")
    end_at = serializers.DateTimeField(help_text="The range's end (exclusive).")
    group_by = serializers.CharField()
    results = CostReportRowSerializer(many=True)


class CostReportApi(APIView):
    """GPU-hours, efficiency and cost between two days or any two ISO datetimes grouped by team, user, GPU type, month or
    cluster, optionally of one cluster. Admins and finance only. ``?format=csv`` answers the same rows as CSV."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[CostReportQuerySerializer, OpenApiParameter("format", str, enum=["json", "csv"])],
        responses={
            (200, "application/json"): CostReportSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="`?format=csv`: the rows as CSV."),
            403: OpenApiResponse(ErrorSerializer, description="Not an admin or finance user."),
        },
        description="A range whose end is before its start, or longer than the limit, answers 400 naming `end`.",
    )
    def get(self, request):
        if not can_read_cost_reports(request.user):
            raise PermissionDenied("Cost reports are for admins and finance.")
        params = CostReportQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        query = params.validated_data
        rows = cost_report(start_at=query["start_at"], end_at=query["end_at"], group_by=query["group_by"], cluster=query["cluster"])
        if request.accepted_renderer.format == "csv":
            filename = query["range"].csv_filename(query["group_by"])
            return Response(
                rows_to_csv(rows), content_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{filename}"'}
            )
        data = {"start": query["start"], "end": query["end"], "start_at": query["start_at"], "end_at": query["end_at"],
                "group_by": query["group_by"], "results": rows}  # fmt: skip
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




# ---------------------------------------------------------------- bookings


class BookingOutputSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    team = serializers.CharField(source="team.slug")
    cluster = serializers.CharField(source="cluster.name", help_text="The cluster whose GPUs are booked (its reservation is there).")
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    gpu_hours = DecimalStringField(max_digits=14)
    note = serializers.CharField()
    status = serializers.CharField()
    auto_approved = serializers.BooleanField()
    created_by = serializers.CharField(source="created_by.username", default="")
    created_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True)
    decision_note = serializers.CharField()
    cancelled_at = serializers.DateTimeField(allow_null=True)
    reservation_name = serializers.CharField()
    nodes = serializers.ListField(child=serializers.CharField())
    reservation_state = serializers.CharField()
    reservation_error = serializers.CharField()


def validated(serializer_class, request) -> dict:
    """The request body's data as ``serializer_class`` validates it (a 400 naming the fields otherwise)."""
    serializer = serializer_class(data=request.data, context={"request": request})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _team_input(request, serializer_class) -> tuple[dict, object]:
    """The request body's validated data and the team it names (portal.selectors.team_visible_or_error:
    400 naming ``team`` for a team that does not exist or that the user cannot see)."""
    from portal.selectors import team_visible_or_error

    data = validated(serializer_class, request)
    return data, team_visible_or_error(request.user, data["team"])


def _booking_for(request, booking_id):
    """A booking the user may see, else 404 (whether it exists or not)."""
    from accounting.selectors import bookings_visible_to

    booking = bookings_visible_to(request.user).select_related("cluster").filter(pk=booking_id).first()
    if booking is None:
        from django.http import Http404

        raise Http404
    return booking


class BookingCollectionApi(ListAPIView):
    """GET: the bookings you may see (your teams'; admins and finance: all), newest window first,
    paginated; filters ``team`` (slug), ``status``, ``gpu_type``, ``cluster`` (name). POST: book GPUs
    for a team (its managers and admins) on one cluster: 201 approved at once or awaiting approval,
    400 bad input (``gpus`` must be a multiple of a node's GPUs where Slurm reserves whole nodes;
    ``cluster`` unknown, needed, or one where the team has no account), 409 naming the window that
    is full."""

    serializer_class = BookingOutputSerializer

    class BookingCreateInputSerializer(serializers.Serializer):
        team = serializers.CharField(help_text="Team slug.")
        cluster = serializers.CharField(required=False, allow_blank=True, default="", max_length=64,
                                        help_text="Cluster name. Empty: the one cluster that has the GPU type "
                                        "(needed when several have it).")  # fmt: skip
        gpu_type = serializers.CharField()
        gpus = serializers.IntegerField(min_value=1)
        start = serializers.DateTimeField(help_text="ISO 8601; without an offset: the site's time zone.")
        end = serializers.DateTimeField()
        note = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)

    def get_queryset(self):
        from accounting.selectors import bookings_visible_to

        queryset = bookings_visible_to(self.request.user).select_related("cluster").order_by("-start", "-created_at")
        params = self.request.query_params
        if params.get("team"):
            queryset = queryset.filter(team__slug=params["team"])
        if params.get("cluster"):
            queryset = queryset.filter(cluster__name=params["cluster"])
        if params.get("status"):
            queryset = queryset.filter(status=params["status"])
        if params.get("gpu_type"):
            queryset = queryset.filter(gpu_type=params["gpu_type"])
        return queryset

    @extend_schema(summary="Bookings you may see", responses=BookingOutputSerializer(many=True), parameters=[
        OpenApiParameter(name, str, description=text) for name, text in (
            ("team", "A team's slug."), ("status", "requested, approved, rejected, cancelled."),
            ("gpu_type", "A GPU type."), ("cluster", "A cluster's name."))])  # fmt: skip
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(summary="Book GPUs", request=BookingCreateInputSerializer, responses={201: BookingOutputSerializer},
                   description="201: approved at once, or awaiting an admin. A schema-valid body that a booking rule "
                   "refuses answers 400 naming the field: a team that does not exist or that you cannot see, an unknown "
                   "GPU type, an end not after the start, a window in the past, too short or too long, GPUs not a multiple "
                   "of a node's where Slurm reserves whole nodes; an unknown cluster, one where the team has no Slurm "
                   "account, or none given when several clusters have the GPU type (`cluster`, listing them). 409: the "
                   "window is full or over budget.")  # fmt: skip
    def post(self, request, *args, **kwargs):
        from accounting.services import booking_create

        data, team = _team_input(request, self.BookingCreateInputSerializer)
        booking = booking_create(
            team=team, gpu_type=data["gpu_type"], gpus=data["gpus"], start=data["start"], end=data["end"],
            note=data["note"], actor=request.user, request=request, cluster=data["cluster"] or None,
        )  # fmt: skip
        return Response(BookingOutputSerializer(booking).data, status=201)


class BookingDetailApi(APIView):
    """One booking you may see (your teams'; admins and finance: any); 404 otherwise."""

    @extend_schema(summary="A booking", responses=BookingOutputSerializer)
    def get(self, request, booking_id):
        return Response(BookingOutputSerializer(_booking_for(request, booking_id)).data)


class BookingDecisionInputSerializer(serializers.Serializer):
    note = StrictCharField(required=False, allow_blank=True, default="", max_length=500)


class BookingCancelApi(APIView):
    @extend_schema(summary="Cancel a booking (its Slurm reservation is deleted)", request=None, responses=BookingOutputSerializer)
    def post(self, request, booking_id):
        from accounting.services import booking_cancel

        booking = booking_cancel(booking=_booking_for(request, booking_id), actor=request.user, request=request)
        return Response(BookingOutputSerializer(booking).data)


def _booking_decision(request, booking_id, decide) -> Response:
    """An admin's decision on a booking: ``decide`` (booking_approve or booking_reject) with the note."""
    note = validated(BookingDecisionInputSerializer, request)["note"]
    booking = decide(booking=_booking_for(request, booking_id), actor=request.user, note=note, request=request)
    return Response(BookingOutputSerializer(booking).data)


class BookingApproveApi(APIView):
    @extend_schema(summary="Approve a booking (admins)", request=BookingDecisionInputSerializer, responses=BookingOutputSerializer)
    def post(self, request, booking_id):
        from accounting.services import booking_approve

        return _booking_decision(request, booking_id, booking_approve)


class BookingRejectApi(APIView):
    @extend_schema(summary="Reject a booking (admins)", request=BookingDecisionInputSerializer, responses=BookingOutputSerializer)
    def post(self, request, booking_id):
        from accounting.services import booking_reject

        return _booking_decision(request, booking_id, booking_reject)


class BookingAvailabilityApi(APIView):
    """Free bookable GPUs of one cluster over time, per GPU type: a step function [{start, end, free,
    booked}] covering [start, end) (default: the next 7 days). Any signed-in user (no team data)."""

    class BookingAvailabilityQueryInputSerializer(serializers.Serializer):
        cluster = serializers.CharField(required=False, allow_blank=True, default="", max_length=64,
                                        help_text="Cluster name. Empty: the default cluster.")  # fmt: skip
        gpu_type = serializers.CharField(required=False, allow_blank=True, default="")
        start = serializers.DateTimeField(required=False)
        end = serializers.DateTimeField(required=False)

        def validate(self, attrs):
            import datetime as dt

            from django.utils import timezone

            attrs["start"] = attrs.get("start") or timezone.now()
            attrs["end"] = attrs.get("end") or attrs["start"] + dt.timedelta(days=7)
            if attrs["end"] <= attrs["start"]:
                raise serializers.ValidationError({"end": ["The end must be after the start."]})
            if attrs["end"] - attrs["start"] > dt.timedelta(days=92):
                raise serializers.ValidationError({"end": ["At most 92 days at once."]})
            return attrs

    class BookingAvailabilityStepOutputSerializer(serializers.Serializer):
        start = serializers.DateTimeField()
        end = serializers.DateTimeField()
        free = serializers.IntegerField()
        booked = serializers.IntegerField()

    class BookingAvailabilityTypeOutputSerializer(serializers.Serializer):
        gpu_type = serializers.CharField()
        capacity = serializers.IntegerField(help_text="GPUs of the type on available nodes.")
        gpus_per_node = serializers.IntegerField()
        steps = serializers.ListField(child=serializers.DictField())

    class BookingAvailabilityOutputSerializer(serializers.Serializer):
        cluster = serializers.CharField()
        start = serializers.DateTimeField()
        end = serializers.DateTimeField()
        whole_nodes = serializers.BooleanField(help_text="Bookings are whole nodes (multiples of gpus_per_node).")
        results = serializers.ListField(child=serializers.DictField())

    @extend_schema(summary="Bookable GPUs over time", parameters=[BookingAvailabilityQueryInputSerializer],
                   responses=BookingAvailabilityOutputSerializer,
                   description="A window whose end is not after its start, or longer than 92 days, answers 400 naming "
                   "`end`; an unknown cluster, 400 naming `cluster`. Default window: the next 7 days.")  # fmt: skip
    def get(self, request):
        from accounting.selectors import booking_availability
        from accounting.services import bookable_cluster, bookings_whole_nodes

        query = self.BookingAvailabilityQueryInputSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        cluster = bookable_cluster(data["cluster"])
        results = booking_availability(start=data["start"], end=data["end"], gpu_type=data["gpu_type"] or None,
                                       cluster=cluster.name)  # fmt: skip
        step = self.BookingAvailabilityStepOutputSerializer
        payload = {
            "cluster": cluster.name, "start": data["start"], "end": data["end"], "whole_nodes": bookings_whole_nodes(cluster),
            "results": [{**row, "steps": step(row["steps"], many=True).data} for row in results],
        }  # fmt: skip
        return Response(self.BookingAvailabilityOutputSerializer(payload).data)


# ---------------------------------------------------------------- quotas and budgets


class QuotaOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField(source="team.slug")
    gpu_type = serializers.CharField(help_text='"" = any GPU type.')
    period_start = serializers.DateField()
    period_end = serializers.DateField(help_text="Exclusive.")
    period = serializers.CharField(source="period_label")
    gpu_hours = DecimalStringField(max_digits=12)
    max_gpus = serializers.IntegerField(allow_null=True)
    state = serializers.CharField()
    justification = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by.username", default="")
    requested_at = serializers.DateTimeField()
    decided_by = serializers.CharField(source="decided_by.username", default="")
    decided_at = serializers.DateTimeField(allow_null=True)
    decision_comment = serializers.CharField()
    approved_at = serializers.DateTimeField(allow_null=True)
    superseded_by = serializers.IntegerField(source="superseded_by_id", allow_null=True)


def _quota_for(request, quota_id):
    """A quota the user may see, else 404 (whether it exists or not)."""
    from django.http import Http404

    from accounting.selectors import quotas_visible_to

    quota = quotas_visible_to(request.user).filter(pk=quota_id).first()
    if quota is None:
        raise Http404
    return quota


class QuotaCollectionApi(ListAPIView):
    """GET: the quotas you may see (your teams'; admins and finance: all), newest period first,
    paginated; filters ``team`` (slug), ``state``. POST: request a quota for a team (its managers and
    admins): 201 in state ``requested``; 403 for other members; 400 bad input."""

    serializer_class = QuotaOutputSerializer

    class QuotaCreateInputSerializer(serializers.Serializer):
        team = serializers.CharField(help_text="Team slug.")
        gpu_hours = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=0)
        gpu_type = serializers.CharField(required=False, allow_blank=True, default="", help_text='"" = any type.')
        max_gpus = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=QUOTA_MAX_GPUS, default=None)
        period_start = serializers.DateField(required=False, allow_null=True, default=None,
                                             help_text="Default: the 1st of this month.")  # fmt: skip
        period_end = serializers.DateField(required=False, allow_null=True, default=None,
                                           help_text="Exclusive; default: the 1st of the next month.")  # fmt: skip
        justification = serializers.CharField(max_length=5000)

    def get_queryset(self):
        from accounting.selectors import quotas_visible_to

        queryset = quotas_visible_to(self.request.user).order_by("-period_start", "-requested_at", "-pk")
        params = self.request.query_params
        if params.get("team"):
            queryset = queryset.filter(team__slug=params["team"])
        if params.get("state"):
            queryset = queryset.filter(state=params["state"])
        return queryset

    @extend_schema(summary="Quotas you may see", responses=QuotaOutputSerializer(many=True))
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(summary="Request a GPU quota", request=QuotaCreateInputSerializer, responses={201: QuotaOutputSerializer},
                   description="201: in state `requested`. A team that does not exist or that you cannot see, a period "
                   "that does not end after it starts, an unknown GPU type or a blank justification answers 400 naming the "
                   "field; a team you do not manage, 403.")  # fmt: skip
    def post(self, request, *args, **kwargs):
        from accounting.services import quota_request

        data, team = _team_input(request, self.QuotaCreateInputSerializer)
        quota = quota_request(
            team=team, user=request.user, gpu_hours=data["gpu_hours"], gpu_type=data["gpu_type"],
            max_gpus=data["max_gpus"], period_start=data["period_start"], period_end=data["period_end"],
            justification=data["justification"], request=request,
        )  # fmt: skip
        return Response(QuotaOutputSerializer(quota).data, status=201)


class QuotaDecisionInputSerializer(serializers.Serializer):
    comment = StrictCharField(required=False, allow_blank=True, default="", max_length=1000)


class QuotaApproveApi(APIView):
    """Approve a requested quota (admins): it takes effect now, supersedes the approved quota of the
    same team, type and period, and is mirrored to Slurm. 409 when it is not awaiting approval."""

    @extend_schema(summary="Approve a quota (admins)", request=QuotaDecisionInputSerializer, responses=QuotaOutputSerializer)
    def post(self, request, quota_id):
        from accounting.services import quota_approve

        comment = validated(QuotaDecisionInputSerializer, request)["comment"]
        quota = quota_approve(quota=_quota_for(request, quota_id), user=request.user, comment=comment, request=request)
        return Response(QuotaOutputSerializer(quota).data)


class QuotaRejectApi(APIView):
    """Reject a requested quota (admins), with a comment (required)."""

    class QuotaRejectInputSerializer(serializers.Serializer):
        comment = StrictCharField(max_length=1000, help_text="Why (required).")

    @extend_schema(summary="Reject a quota (admins)", request=QuotaRejectInputSerializer, responses=QuotaOutputSerializer)
    def post(self, request, quota_id):
        from accounting.services import quota_reject

        comment = validated(self.QuotaRejectInputSerializer, request)["comment"]
        quota = quota_reject(quota=_quota_for(request, quota_id), user=request.user, comment=comment, request=request)
        return Response(QuotaOutputSerializer(quota).data)


class QuotaWithdrawApi(APIView):
    """Withdraw a quota request awaiting approval (the team's managers, admins): it becomes
    cancelled. 409 when it is not awaiting approval any more."""

    @extend_schema(summary="Withdraw a quota request (managers, admins)", request=None, responses=QuotaOutputSerializer)
    def post(self, request, quota_id):
        from accounting.services import quota_cancel

        quota = quota_cancel(quota=_quota_for(request, quota_id), user=request.user, request=request, withdraw=True)
        return Response(QuotaOutputSerializer(quota).data)


class BudgetRowOutputSerializer(serializers.Serializer):
    quota_id = serializers.IntegerField(source="quota.pk")
    gpu_type = serializers.CharField(help_text='"" = the any-type budget.')
    period = serializers.CharField(source="period_label")
    period_start = serializers.DateField()
    period_end = serializers.DateField(help_text="Exclusive.")
    budget = DecimalStringField(max_digits=14, help_text="GPU-hours granted.")
    used = DecimalStringField(max_digits=14, help_text="Accounted GPU-hours in the period.")
    held = DecimalStringField(max_digits=14, help_text="Estimates of jobs not yet accounted.")
    booked = DecimalStringField(max_digits=14, help_text="Approved bookings in the period.")
    remaining = DecimalStringField(max_digits=14)
    max_gpus = serializers.IntegerField(allow_null=True)
    runs_out_on = serializers.DateField(allow_null=True, help_text="At the period's burn rate so far; null: not in this period.")


class TeamBudgetOutputSerializer(serializers.Serializer):
    team = serializers.CharField()
    period = serializers.CharField(allow_null=True, help_text="Of the any-type budget (else the first row).")
    no_quota_policy = serializers.CharField()
    budget = DecimalStringField(max_digits=14, allow_null=True)
    used = DecimalStringField(max_digits=14, allow_null=True)
    held = DecimalStringField(max_digits=14, allow_null=True)
    booked = DecimalStringField(max_digits=14, allow_null=True)
    remaining = DecimalStringField(max_digits=14, allow_null=True)
    runs_out_on = serializers.DateField(allow_null=True)
    rows = BudgetRowOutputSerializer(many=True)


def team_budget_data(team) -> dict:
    """The budget API's and page's figures: the headline is the any-type row (else the first)."""
    from django.conf import settings

    from accounting.selectors import team_budget

    rows = team_budget(team=team)
    head = next((r for r in rows if not r["gpu_type"]), rows[0] if rows else None)
    return {
        "team": team.slug,
        "period": head["period_label"] if head else None,
        "no_quota_policy": settings.QUOTA_NO_QUOTA_POLICY,
        **{key: (head[key] if head else None) for key in ("budget", "used", "held", "booked", "remaining", "runs_out_on")},
        "rows": rows,
    }


class TeamBudgetApi(APIView):
    """A team's GPU budget in the current period (its members, admins and finance; 404 to others):
    budget, used, held, booked and remaining GPU-hours, per GPU type, and when it runs out."""

    @extend_schema(summary="A team's GPU budget", responses=TeamBudgetOutputSerializer)
    def get(self, request, slug):
        from portal.selectors import teams_visible_to

        team = get_object_or_404(teams_visible_to(request.user), slug=slug)
        return Response(TeamBudgetOutputSerializer(team_budget_data(team)).data)
