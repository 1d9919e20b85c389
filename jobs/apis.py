"""Job API under /api/v1/: submit, list, detail, cancel, output, quote, templates.

Views parse input with nested serializers, call a service or selector and shape the answer; the
rules live in jobs/services/ and jobs/selectors.py. Errors always answer
``{"detail": ..., "errors": {...}}`` (portal.exceptions.api_exception_handler). A job or template
the user cannot see answers 404, as if it did not exist."""

from __future__ import annotations

import functools
from typing import Any

from django.db.models import prefetch_related_objects
from django.http import Http404
from django.urls import get_script_prefix, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.arrays import array_task_counts
from jobs.choices import JobState, OutputStream, TemplateScope
from jobs.filters import JobFilter
from jobs.gpu_report import job_gpu_report
from jobs.job_fields import FIELDS, SHAPE_FIELD_NAMES, SPEC_FIELD_NAMES, TEMPLATE_FIELDS, JobField
from jobs.models import Job, JobGpuIdleAlert, JobTemplate
from jobs.paging import JobCursorPagination
from jobs.selectors import (
    OUTPUT_DEFAULT_LENGTH,
    OUTPUT_MAX_LENGTH,
    job_detail,
    job_output,
    job_templates_visible_to,
    jobs_visible_to,
    jobs_with_usage,
)
from jobs.services import (
    IDEMPOTENCY_KEY_RE,
    MAX_BATCH_JOBS,
    job_array_task_cancel,
    job_cancel,
    job_quote,
    job_submit,
    job_submit_batch,
    job_template_create,
    job_template_delete,
    request_fingerprint,
    template_defaults,
)
from portal.exceptions import ApplicationError
from portal.fields import DecimalStringField, whole_number
from portal.models import Team
from portal.roles import team_with_role
from portal.slurm.parsing import exit_signal_text
from portal.throttles import SubmitRateThrottle


def _visible_job(request, job_id) -> Job:
    try:
        return jobs_visible_to(request.user).get(pk=job_id)
    except Job.DoesNotExist:
        raise Http404 from None


def _team_by_slug(request, slug: str | None) -> Team | None:
    """The team named by slug, or None, with the user's role in it (one query: portal.roles.team_with_role);
    the service answers "No such team." for both a missing team and one the user cannot see."""
    return team_with_role(request.user, slug)


# ---------------------------------------------------------------- input serializers (derived)


def _input_field(field: JobField, *, script_required: bool, empty: Any) -> serializers.Field:
    """The API input field of a job field (jobs.job_fields): optional, ``empty`` its default."""
    common = {"help_text": field.api_help or None}
    if field.kind == "script":
        return serializers.CharField(allow_blank=True, trim_whitespace=False, **common,
                                     **({} if script_required else {"required": False, "default": ""}))  # fmt: skip
    common |= {"required": False}
    if field.kind in ("int", "time"):
        return serializers.IntegerField(allow_null=empty is None, default=empty, **common)
    if field.kind == "bool":
        return serializers.BooleanField(allow_null=empty is None, default=empty, **common)
    if field.kind == "dict":
        return serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False), default=dict, **common)
    if field.kind == "ids":
        return serializers.ListField(child=serializers.UUIDField(), default=list, max_length=field.max_length, **common)
    if field.max_length:
        common["max_length"] = field.max_length
    return serializers.CharField(allow_blank=True, allow_null=empty is None, default=empty, **common)


def job_input_serializer(class_name: str, names: tuple[str, ...], *, before: dict | None = None, after: dict | None = None,
                         empties: dict | None = None, script_required: bool = True) -> type[serializers.Serializer]:  # fmt: skip
    """A serializer class of the job fields ``names`` in their declared order, between the fields
    ``before`` and ``after`` make (``{name: factory}``: DRF orders fields as they are created).
    ``empties``: a field's default other than its declared empty value (a template's model defaults)."""
    empties = empties or {}
    attrs = {name: make() for name, make in (before or {}).items()}
    attrs |= {name: _input_field(FIELDS[name], script_required=script_required, empty=empties.get(name, FIELDS[name].empty))
              for name in names}  # fmt: skip
    attrs |= {name: make() for name, make in (after or {}).items()}
    return type(class_name, (serializers.Serializer,), attrs)


@functools.cache
def shared(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    """One instance of ``serializer_class`` for the process, its fields built once, for the hot path's
    ``run_validation(data)`` and ``to_representation(obj)`` (documented, and stateless: no context,
    nothing kept on the instance). A new instance deep-copies its class's declared fields: ~340
    deep copies for one job POST's input and output, 8 % of its time (bench/bench_post_profile.py)."""
    return serializer_class()


# ---------------------------------------------------------------- output serializers (shared)

EXIT_SIGNAL_HELP = ("The signal that ended it, as sacct's ExitCode gives it after the colon (\"0:9\": 9, SIGKILL); "
                    "0: none; null: not known (yet, or not from this scheduler).")
EXIT_SIGNAL_TEXT_HELP = ("exit_signal in words: \"signal 9 (SIGKILL)\"; for 53, Slurm could not open the job's output "
                         "or error file; empty when there is no signal.")


@extend_schema_field(OpenApiTypes.STR)
class ExitSignalText(serializers.Field):
    """exit_signal in words (portal.slurm.parsing.exit_signal_text): "" without one. The whole object is
    its source: DRF answers null for a field whose own value is None without asking the field."""

    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, help_text=EXIT_SIGNAL_TEXT_HELP, **kwargs)

    def to_representation(self, value) -> str:
        return exit_signal_text(value.exit_signal)


class JobShapeOutputFields(serializers.Serializer):
    """The job-shape fields a job and a job template both show (the one declaration of them)."""

    partition = serializers.CharField()
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField()
    nodes = serializers.IntegerField()
    cpus_per_gpu = serializers.IntegerField(allow_null=True)
    memory_gb = serializers.IntegerField(allow_null=True)


class JobSummaryOutputSerializer(JobShapeOutputFields):
    """A job as lists, submit and cancel show it (no script: lists stay small)."""

    id = serializers.UUIDField()
    team = serializers.CharField(source="team.slug")
    submitter = serializers.CharField(source="submitter.username")
    name = serializers.CharField()
    cluster = serializers.CharField(source="cluster.name", help_text="The cluster it runs on.")
    time_limit_minutes = serializers.IntegerField()
    workdir = serializers.CharField(help_text="The directory the job runs in (--chdir).")
    submit_dir = serializers.CharField(help_text="Where it was submitted from (SLURM_SUBMIT_DIR).")
    ntasks = serializers.IntegerField()
    cpus_per_task = serializers.IntegerField(allow_null=True)
    exclusive = serializers.BooleanField()
    array = serializers.CharField(help_text="sbatch --array as given; empty: not an array job.")
    array_tasks = serializers.IntegerField(help_text="Tasks of the array (1: not an array); the estimate covers all.")
    qos = serializers.CharField()
    constraint = serializers.CharField()
    booking = serializers.UUIDField(source="booking_id", allow_null=True)
    depends_on = serializers.ListField(child=serializers.UUIDField(), source="depends_on_ids",
                                       help_text="The portal jobs it waits for (sent to Slurm as --dependency=afterok).")  # fmt: skip
    idle_exempt = serializers.BooleanField(help_text="Exempt from the team's idle-GPU policy (chosen at submission).")
    state = serializers.ChoiceField(choices=JobState.choices)
    state_reason = serializers.CharField(help_text="Slurm's reason code (and details) as it gives them.")
    state_reason_text = serializers.SerializerMethodField(help_text="The reason in words; empty when the portal does "
                                                          "not know the code (state_reason then says it).")  # fmt: skip
    state_reason_advice = serializers.SerializerMethodField(help_text="What the submitter can change about the reason; "
                                                            "empty: nothing but waiting.")  # fmt: skip
    expected_start_at = serializers.DateTimeField(allow_null=True, help_text="While pending: when Slurm's scheduler "
                                                  "expects it to start (squeue --start); null: no estimate yet.")  # fmt: skip
    queue_position = serializers.IntegerField(allow_null=True, help_text="While pending: its place (1 = next) among the "
                                              "pending jobs of its partition wanting the same GPU type, in Slurm's "
                                              "priority order; null: not pending.")  # fmt: skip
    expected_start_moved_from = serializers.DateTimeField(allow_null=True, help_text="The estimate before it last moved "
                                                          "by more than the portal's threshold; null: it has not.")  # fmt: skip
    cancel_requested = serializers.BooleanField()
    cancel_reason = serializers.CharField(help_text="Why the portal itself cancelled it (idle GPUs under its team's policy, or a job it waits for that did not succeed); "
                                          "empty: cancelled by a person, or not cancelled.")  # fmt: skip
    slurm_job_id = serializers.IntegerField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)
    exit_signal = serializers.IntegerField(allow_null=True, help_text=EXIT_SIGNAL_HELP)
    exit_signal_text = ExitSignalText()
    created_at = serializers.DateTimeField()
    submitted_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    estimated_gpu_seconds = serializers.IntegerField(help_text="The most Slurm can charge: GPUs × (time limit + the "
                                                     "cluster's overrun past it) × array tasks; held from the budget.")  # fmt: skip
    estimated_gpu_hours = DecimalStringField(max_digits=16)
    estimated_cost = DecimalStringField(allow_null=True)
    gpu_seconds = serializers.SerializerMethodField(help_text="Used so far, from accounting (null: none recorded yet).")
    # job.usage: jobs.selectors.jobs_with_usage's figures, None before any usage is recorded (then null)
    gpu_hours = DecimalStringField(source="usage.gpu_hours", allow_null=True,
                                   help_text="gpu_seconds in GPU-hours, two places (null: none recorded yet).")  # fmt: skip
    cost = DecimalStringField(source="usage.cost", allow_null=True,
                              help_text="What it cost so far at the rates in force (null: none recorded yet).")  # fmt: skip
    usage_final = serializers.SerializerMethodField(help_text="True once every record of it is final (the job ended and "
                                                    "Slurm has charged it); null: none recorded yet.")  # fmt: skip
    currency = serializers.CharField()
    links = serializers.SerializerMethodField()

    def get_state_reason_text(self, job) -> str:
        explained = job.reason_explained
        return explained.text if explained else ""

    def get_state_reason_advice(self, job) -> str:
        explained = job.reason_explained
        return explained.advice if explained else ""

    def get_gpu_seconds(self, job) -> int | None:
        usage = getattr(job, "usage", None)
        return usage.gpu_seconds if usage is not None else None

    def get_usage_final(self, job) -> bool | None:
        usage = getattr(job, "usage", None)
        return usage.final if usage is not None else None

    def get_links(self, job) -> dict[str, str]:
        pk = str(job.pk)
        return {name: url.replace(_ANY_JOB, pk) for name, url in _job_link_templates(get_script_prefix()).items()}


# A job's links are reversed once (per URL prefix) for a stand-in id, then filled in: three
# reverse() calls were 0.5 ms of a single-job POST, and of every job of a list page.
_ANY_JOB = "00000000-0000-4000-8000-00000000000a"


@functools.cache
def _job_link_templates(prefix: str) -> dict[str, str]:
    urls = {"self": "api-job-detail", "cancel": "api-job-cancel", "output": "api-job-output"}
    return {name: reverse(view, args=[_ANY_JOB]) for name, view in urls.items()}


class JobEventOutputSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=JobState.choices)
    reason = serializers.CharField()
    at = serializers.DateTimeField()


class JobDirectiveOutputSerializer(serializers.Serializer):
    option = serializers.CharField()
    value = serializers.CharField(allow_null=True)
    line = serializers.IntegerField(help_text="The script's line; 0: set by a field (overrides the script).")


class JobArrayTaskOutputSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    state = serializers.ChoiceField(choices=JobState.choices)
    exit_code = serializers.IntegerField(allow_null=True)
    exit_signal = serializers.IntegerField(allow_null=True, help_text=EXIT_SIGNAL_HELP)
    exit_signal_text = ExitSignalText()
    slurm_job_id = serializers.IntegerField(allow_null=True, help_text="The task's own Slurm id.")
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    # task.usage: jobs.selectors.jobs_with_usage's figures of the task, None before any (then null)
    gpu_seconds = serializers.IntegerField(source="usage.gpu_seconds", allow_null=True,
                                           help_text="This task's usage so far (null: none recorded yet).")  # fmt: skip
    gpu_hours = DecimalStringField(source="usage.gpu_hours", allow_null=True)
    cost = DecimalStringField(source="usage.cost", allow_null=True)


class JobGpuOutputSerializer(serializers.Serializer):
    task_index = serializers.IntegerField(allow_null=True, help_text="The array task; null: not an array job.")
    host = serializers.CharField()
    gpu = serializers.CharField(help_text="The GPU's index on its host.")
    model = serializers.CharField()
    util_mean = serializers.FloatField(help_text="Mean utilisation, %.")
    util_peak = serializers.FloatField(help_text="Peak utilisation, %.")
    mem_mean_mib = serializers.IntegerField()
    mem_peak_mib = serializers.IntegerField()
    idle_percent = serializers.IntegerField(help_text="Share of its samples under the idle threshold, %.")
    samples = serializers.IntegerField()
    busy_gpu_hours = DecimalStringField(help_text="Utilisation-weighted GPU-hours: a GPU at 50 % for two hours is one.")
    first_at = serializers.DateTimeField()
    last_at = serializers.DateTimeField()
    final = serializers.BooleanField(help_text="The job has ended and its last samples are in.")


class JobGpuChartSeriesOutputSerializer(serializers.Serializer):
    label = serializers.CharField()
    util = serializers.ListField(child=serializers.FloatField(allow_null=True), help_text="Per bucket, %; null: no sample.")
    mem_mib = serializers.ListField(child=serializers.IntegerField(allow_null=True))


class JobGpuChartOutputSerializer(serializers.Serializer):
    labels = serializers.ListField(child=serializers.CharField(), help_text="Each bucket's end (ISO 8601).")
    bucket_seconds = serializers.IntegerField()
    series = JobGpuChartSeriesOutputSerializer(many=True, help_text="One per GPU.")


class JobGpuStatusOutputSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="GPU monitoring is configured (PROMETHEUS_URL).")
    as_of = serializers.DateTimeField(allow_null=True, help_text="The figures are up to then.")
    failing_since = serializers.DateTimeField(allow_null=True, help_text="Prometheus has not answered since then.")
    error = serializers.CharField()


class JobGpuUsageOutputSerializer(serializers.Serializer):
    """A job's GPU report (jobs.gpu_report.job_gpu_report, the job page's too), read from the job."""

    gpus = JobGpuOutputSerializer(many=True)
    verdict = serializers.CharField()
    chart = JobGpuChartOutputSerializer(allow_null=True, help_text="At most 240 points per GPU; null: no samples.")
    status = JobGpuStatusOutputSerializer()

    def to_representation(self, job):
        return super().to_representation(job_gpu_report(job))


class JobIdleWarningOutputSerializer(serializers.Serializer):
    at = serializers.DateTimeField(source="created_at")
    idle_since = serializers.DateTimeField()
    gpus = serializers.IntegerField()
    threshold_percent = serializers.FloatField(allow_null=True, help_text="The team policy's (null: the site's).")
    cancel_at = serializers.DateTimeField(allow_null=True, help_text="Under the team's policy: when it is cancelled if its "
                                          "GPUs stay idle; null: an alert only.")  # fmt: skip


class JobDetailOutputSerializer(JobSummaryOutputSerializer):
    script = serializers.CharField()
    directives = JobDirectiveOutputSerializer(many=True, help_text="The options Slurm gets, as the portal read them.")
    task_counts = serializers.SerializerMethodField(help_text="Array jobs: tasks per state (not seen yet: PENDING).")
    tasks = JobArrayTaskOutputSerializer(source="array_task_rows.all", many=True, help_text="Array jobs: each task seen so far.")

    gpu_usage = JobGpuUsageOutputSerializer(
        source="*",
        help_text="What the job's GPUs did (from Prometheus, stored by the portal): per GPU (array: per task) mean and "
        "peak utilisation (%) and memory (MiB), idle share, busy GPU-hours; the verdict; the chart (at most 240 points "
        "per GPU); status.as_of: figures up to then, status.failing_since: Prometheus not answering."
    )

    idle_warning = serializers.SerializerMethodField(help_text="The idle-GPU alert of the job (null: none): since when "
                                                     "its GPUs idled, and under its team's policy when it is cancelled "
                                                     "(cancel_at) unless a GPU gets busy.")  # fmt: skip

    def get_task_counts(self, job) -> dict[str, int]:
        return array_task_counts(job) if job.array else {}

    @extend_schema_field(JobIdleWarningOutputSerializer(allow_null=True))
    def get_idle_warning(self, job) -> dict | None:
        alert = JobGpuIdleAlert.objects.filter(job=job).first()
        return JobIdleWarningOutputSerializer(alert).data if alert is not None else None
    environment = serializers.DictField(child=serializers.CharField())
    relay_attempts = serializers.IntegerField()
    last_relay_error = serializers.CharField()
    events = JobEventOutputSerializer(many=True)


# ---------------------------------------------------------------- jobs

# What POST /api/v1/jobs/ answers: the job, or the array of jobs when the body was an array
_JOB_OR_BATCH = PolymorphicProxySerializer(
    component_name="JobSubmittedOneOrBatch",
    serializers=[JobSummaryOutputSerializer, JobSummaryOutputSerializer(many=True)],
    resource_type_field_name=None,
    many=False,
)


class JobCollectionApi(ListAPIView):
    """GET: the jobs you may see (filters team, state, since, mine, ordering; paginated).
    POST: submit a job, or an array of up to MAX_BATCH_JOBS jobs of one team (all or none; relayed
    to Slurm together). An ``Idempotency-Key`` header makes a retry safe."""

    serializer_class = JobSummaryOutputSerializer
    filterset_class = JobFilter
    pagination_class = JobCursorPagination  # keyset pages: a deep page costs what the first does

    JobSubmitInputSerializer = job_input_serializer(
        "JobSubmitInputSerializer", SPEC_FIELD_NAMES, before={"team": lambda: serializers.CharField(help_text="Team slug.")},
        after={"booking": lambda: serializers.UUIDField(required=False, allow_null=True, default=None),
               "idle_exempt": lambda: serializers.BooleanField(required=False, default=False, help_text=(
                   "Exempt from the team's idle-GPU policy (a debugger session): never warned for it nor cancelled; "
                   "the team's managers see it."))},  # fmt: skip
    )

    def get_queryset(self):
        return jobs_visible_to(self.request.user).order_by("-created_at")

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return jobs_with_usage(page) if page is not None else None  # each job's cost so far: one query a page

    def get_throttles(self):
        return [SubmitRateThrottle()] if self.request.method == "POST" else []

    @extend_schema(summary="Jobs you may see", responses=JobSummaryOutputSerializer(many=True))
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Submit a job, or a batch of jobs",
        description=(
            "The body is one job, or a JSON array of 1–%d jobs for the same team (a batch: all or none, relayed to "
            "Slurm together; the answer is the array of jobs). A 400 for a batch names the failing jobs by index "
            '(`errors: {"3": {"gpus": [...]}}`); the budget is checked for the sum. `Idempotency-Key` covers the '
            "whole request: the same key and body again answer 200 with the same job(s); another body, 409. A body the "
            "schema allows but a rule refuses answers 400 naming the field: a team that does not exist or that you may "
            "not submit to, an unknown partition or GPU type, more GPUs, nodes or time than the partition allows; a job "
            "that does not fit the team's budget, 409." % MAX_BATCH_JOBS
        ),
        request=PolymorphicProxySerializer(
            component_name="JobSubmitOneOrBatch",
            serializers=[JobSubmitInputSerializer, JobSubmitInputSerializer(many=True)],
            resource_type_field_name=None,
            many=False,
        ),
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                                     pattern=IDEMPOTENCY_KEY_RE.pattern)],  # fmt: skip
        responses={201: _JOB_OR_BATCH, 200: _JOB_OR_BATCH},
    )
    def post(self, request, *args, **kwargs):
        if isinstance(request.data, list):
            return self._post_batch(request)
        data = dict(shared(self.JobSubmitInputSerializer).run_validation(request.data))  # a 400 naming the fields
        if not data.get("cluster"):
            data.pop("cluster", None)  # not given: the fingerprint of a one-cluster body stays what it was
        if not data.get("idle_exempt"):
            data.pop("idle_exempt", None)  # likewise: bodies without it keep their fingerprint
        fingerprint = request_fingerprint(data)  # the body as understood, key order irrelevant
        job, created = job_submit(
            user=request.user,
            team=_team_by_slug(request, data.pop("team")),
            idempotency_key=request.headers.get("Idempotency-Key"),
            fingerprint=fingerprint,
            request=request,
            **data,
        )
        return Response(
            shared(JobSummaryOutputSerializer).to_representation(job),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    def _post_batch(self, request):
        body = request.data
        if not body:
            raise ApplicationError("Give a non-empty JSON array of jobs.", errors={"jobs": ["Give a non-empty JSON array of jobs."]})
        if len(body) > MAX_BATCH_JOBS:
            raise ApplicationError(
                f"At most {MAX_BATCH_JOBS} jobs per batch.", errors={"jobs": [f"At most {MAX_BATCH_JOBS} jobs per batch."]}
            )
        # One serializer for every item (as a ListSerializer's child): a new one per item deep-copies
        # its fields each time, 0.8 ms per job.
        item_serializer = shared(self.JobSubmitInputSerializer)
        items, errors = [], {}
        for index, item in enumerate(body):
            try:
                items.append({k: v for k, v in item_serializer.run_validation(item).items() if k not in ("cluster", "idle_exempt") or v})
            except serializers.ValidationError as exc:
                detail = serializers.as_serializer_error(exc)
                errors[str(index)] = {k: [str(m) for m in v] if isinstance(v, list) else [str(v)] for k, v in detail.items()}
        if errors:
            first_index = next(iter(errors))
            first = next(iter(errors[first_index].values()))[0]
            exc = ApplicationError(f"Job {first_index} of the batch cannot be submitted: {first}")
            exc.errors = errors
            raise exc
        teams = {item.pop("team") for item in items}
        if len(teams) != 1:
            raise ApplicationError(
                "All jobs of a batch must be for the same team.", errors={"team": ["All jobs of a batch must be for the same team."]}
            )
        slug = teams.pop()
        fingerprint = request_fingerprint({"team": slug, "batch": items})  # the body as understood
        jobs, created = job_submit_batch(
            user=request.user,
            team=_team_by_slug(request, slug),
            jobs=items,
            idempotency_key=request.headers.get("Idempotency-Key"),
            fingerprint=fingerprint,
            request=request,
        )
        return Response(
            [shared(JobSummaryOutputSerializer).to_representation(job) for job in jobs],
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class JobDetailApi(APIView):
    @extend_schema(summary="One job with its state history", responses=JobDetailOutputSerializer)
    def get(self, request, job_id):
        try:
            job = job_detail(user=request.user, job_id=job_id)
        except Job.DoesNotExist:
            raise Http404 from None
        prefetch_related_objects([job], "array_task_rows")  # the rows the answer shows, given their usage
        jobs_with_usage([job], tasks=job.array_task_rows.all())
        return Response(JobDetailOutputSerializer(job).data)


class JobCancelApi(APIView):
    @extend_schema(
        summary="Cancel a job",
        request=None,
        responses={200: JobSummaryOutputSerializer, 202: JobSummaryOutputSerializer},
        description="200: cancelled at once (it had not reached Slurm). 202: cancel passed on to Slurm; "
        "the state becomes CANCELLED at the next sync. 409: the job already ended. `?task=N`: only task N of an "
        "array job (202: its cancel passed on to the scheduler by a worker; the other tasks go on; 409: the task already ended).",
        parameters=[OpenApiParameter("task", OpenApiTypes.INT, OpenApiParameter.QUERY, required=False)],
    )
    def post(self, request, job_id):
        job = _visible_job(request, job_id)
        task = request.query_params.get("task")
        if task is not None:  # one task of an array job
            index = whole_number(task)
            if index is None:
                raise ApplicationError("Invalid task.", errors={"task": ["An array index (a whole number)."]})
            job = job_array_task_cancel(user=request.user, job=job, index=index, request=request)
            return Response(JobSummaryOutputSerializer(job).data, status=status.HTTP_202_ACCEPTED)
        job = job_cancel(user=request.user, job=job, request=request)
        code = status.HTTP_200_OK if job.state == JobState.CANCELLED else status.HTTP_202_ACCEPTED
        return Response(JobSummaryOutputSerializer(job).data, status=code)


class JobOutputApi(APIView):
    class JobOutputQueryInputSerializer(serializers.Serializer):
        stream = serializers.ChoiceField(choices=OutputStream.choices, default=OutputStream.STDOUT)
        offset = serializers.IntegerField(min_value=0, default=0)
        length = serializers.IntegerField(min_value=1, default=OUTPUT_DEFAULT_LENGTH, help_text=f"Capped at {OUTPUT_MAX_LENGTH}.")
        task = serializers.IntegerField(min_value=0, required=False, allow_null=True, default=None, help_text="Array jobs: the task's index.")

    class JobOutputChunkOutputSerializer(serializers.Serializer):
        data = serializers.CharField()
        offset = serializers.IntegerField()
        next_offset = serializers.IntegerField()
        size = serializers.IntegerField()
        eof = serializers.BooleanField(help_text="Read up to the current end of the file.")
        final = serializers.BooleanField(help_text="The job ended: the file will not grow.")
        message = serializers.CharField(help_text="Why there is no data; with data, a note on it (a Kubernetes job's log kept cut short).")

    @extend_schema(
        summary="A chunk of the job's stdout or stderr",
        parameters=[JobOutputQueryInputSerializer],
        responses=JobOutputChunkOutputSerializer,
        description="A missing file or a job not yet in Slurm answers 200 with empty data and a message.",
    )
    def get(self, request, job_id):
        query = self.JobOutputQueryInputSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        chunk = job_output(job=_visible_job(request, job_id), **query.validated_data)
        return Response(self.JobOutputChunkOutputSerializer(chunk.as_dict()).data)


class JobQuoteApi(APIView):
    JobQuoteInputSerializer = job_input_serializer("JobQuoteInputSerializer", SHAPE_FIELD_NAMES, script_required=False)

    class JobQuoteOutputSerializer(serializers.Serializer):
        gpu_seconds = serializers.IntegerField(help_text="Exact: GPUs × (time limit + overrun) × array tasks.")
        overrun_seconds = serializers.IntegerField(help_text="Per task: how far past its time limit Slurm may run and charge it.")
        gpu_hours = DecimalStringField(max_digits=16)
        gpu_type = serializers.CharField()
        gpu_type_assumed = serializers.BooleanField()
        gpu_types = serializers.ListField(child=serializers.CharField(), help_text="The types it can land on (all held).")
        price_per_gpu_hour = DecimalStringField(max_digits=12, decimal_places=4, allow_null=True)
        cost = DecimalStringField(allow_null=True)
        currency = serializers.CharField()
        note = serializers.CharField()

    @extend_schema(summary="GPU-hours and cost estimate of a job shape", request=JobQuoteInputSerializer, responses=JobQuoteOutputSerializer,
                   description="An unknown partition or GPU type, or a shape the partition does not allow, answers 400 "
                   "naming the field.")  # fmt: skip
    def post(self, request):
        serializer = self.JobQuoteInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        quote = job_quote(**serializer.validated_data)
        return Response(self.JobQuoteOutputSerializer(quote).data)


# ---------------------------------------------------------------- templates


class JobTemplateOutputSerializer(JobShapeOutputFields):
    id = serializers.IntegerField()
    scope = serializers.ChoiceField(choices=TemplateScope.choices)
    team = serializers.CharField(source="team.slug", allow_null=True, default=None)
    owner = serializers.CharField(source="owner.username", allow_null=True, default=None)
    name = serializers.CharField()
    description = serializers.CharField()
    script = serializers.CharField()
    time_limit_minutes = serializers.IntegerField(allow_null=True)
    workdir = serializers.CharField()
    environment = serializers.DictField(child=serializers.CharField())
    created_at = serializers.DateTimeField()


class JobTemplateCollectionApi(ListAPIView):
    """GET: templates you may use (personal, your teams', site). POST: save a template."""

    serializer_class = JobTemplateOutputSerializer

    JobTemplateInputSerializer = job_input_serializer(
        "JobTemplateInputSerializer", TEMPLATE_FIELDS, empties=template_defaults(),
        before={
            "scope": lambda: serializers.ChoiceField(choices=TemplateScope.choices, default=TemplateScope.PERSONAL),
            "team": lambda: serializers.CharField(required=False, allow_null=True, allow_blank=True, default=None,
                                                  help_text="Team slug (scope team)."),
            "name": lambda: serializers.CharField(allow_blank=True),
            "description": lambda: serializers.CharField(required=False, allow_blank=True, default=""),
        },
    )  # fmt: skip

    def get_queryset(self):
        return job_templates_visible_to(self.request.user).order_by("scope", "name", "pk")

    @extend_schema(summary="Job templates you may use", responses=JobTemplateOutputSerializer(many=True))
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(summary="Save a job template", request=JobTemplateInputSerializer, responses={201: JobTemplateOutputSerializer},
                   description="A team that does not exist or that you cannot see (scope team), or a blank name, answers "
                   "400 naming the field; a site template by a non-admin, 403; a name already used in the scope, 409.")  # fmt: skip
    def post(self, request, *args, **kwargs):
        serializer = self.JobTemplateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        template = job_template_create(user=request.user, team=_team_by_slug(request, data.pop("team")), **data)
        return Response(JobTemplateOutputSerializer(template).data, status=status.HTTP_201_CREATED)


class JobTemplateDetailApi(APIView):
    def _template(self, request, template_id) -> JobTemplate:
        try:
            return job_templates_visible_to(request.user).get(pk=template_id)
        except JobTemplate.DoesNotExist:
            raise Http404 from None

    @extend_schema(summary="One job template", responses=JobTemplateOutputSerializer)
    def get(self, request, template_id: int):
        return Response(JobTemplateOutputSerializer(self._template(request, template_id)).data)

    @extend_schema(summary="Delete a job template", responses={204: None})
    def delete(self, request, template_id: int):
        job_template_delete(user=request.user, template=self._template(request, template_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


__all__ = [
    "JobCancelApi",
    "JobCollectionApi",
    "JobDetailApi",
    "JobOutputApi",
    "JobQuoteApi",
    "JobTemplateCollectionApi",
    "JobTemplateDetailApi",
]
