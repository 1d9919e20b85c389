"""Pages of the jobs app: submission form (live estimate), job list (live states), job detail
(history, output tail, cancel) and job templates.

Every page reads through ``jobs.selectors`` (one visibility rule, shared with the API) and writes
through ``jobs.services``; an htmx request (``HX-Request``) gets the partial from
``templates/partials/``, a plain request the whole page, so everything works without JavaScript."""

from __future__ import annotations

import uuid

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from jobs.choices import LIVE_STATES, JobState, OutputStream, TemplateScope
from jobs.filters import JobFilter
from jobs.forms import JobForm, QuoteForm, TemplateSaveForm, format_minutes, initial_from_spec
from jobs.gpu_report import job_gpu_report
from jobs.models import Job, JobGpuIdleAlert
from jobs.paging import CURSOR_PARAM, job_list_page, page_query
from jobs.selectors import first_array_index, job_output, job_templates_visible_to, jobs_visible_to, jobs_with_usage
from jobs.services import job_cancel, job_quote, job_submit, job_template_create, job_template_delete
from jobs.arrays import array_task_table
from jobs.job_fields import SCRIPT_FIELDS, TEMPLATE_FIELDS, given_or_empty
from jobs.script_fields import fields_from_script, uploaded_script_text
from jobs.spec import ParsedScript, directives_table, parse_script
from portal.exceptions import ApplicationError, form_add_application_error
from portal.fields import whole_number
from portal.roles import is_admin
from portal.selectors import cluster_summary, several_clusters, teams_visible_to

JOBS_PER_PAGE = 25
LIST_POLL_SECONDS = 5
DETAIL_POLL_SECONDS = 3
OUTPUT_TAIL_BYTES = 32 * 1024
MAX_LIVE_IDS = 100  # one poll of the list asks for at most this many rows


def _visible_job(request, job_id) -> Job:
    """The job if the user may see it; 404 otherwise (no hint that it exists)."""
    return get_object_or_404(jobs_visible_to(request.user), pk=job_id)


# ---------------------------------------------------------------- list


@login_required
@require_GET
def job_list(request):
    """The user's teams' jobs, filtered (team, state, since — the API's FilterSet) and paginated by
    keyset (newer / older links: a deep page costs what the first does). A constant number of queries
    whatever the page holds; a page link that is not valid shows the first page."""
    visible = jobs_visible_to(request.user).defer("script", "environment")
    filterset = JobFilter(request.GET, queryset=visible, request=request)
    jobs = filterset.qs if filterset.is_valid() else visible
    ordering = request.GET.get("ordering") if filterset.is_valid() else None
    try:
        page = job_list_page(jobs, ordering=ordering, cursor=request.GET.get(CURSOR_PARAM), size=JOBS_PER_PAGE)
    except ApplicationError:
        page = job_list_page(jobs, ordering=ordering, cursor=None, size=JOBS_PER_PAGE)
    context = {
        "filterset": filterset,
        "filter_errors": filterset.errors if not filterset.is_valid() else None,
        "jobs": jobs_with_usage(page.rows),
        "newer_query": page_query(request.GET, page.previous_cursor) if page.previous_cursor else None,
        "older_query": page_query(request.GET, page.next_cursor) if page.next_cursor else None,
        "live_ids": [str(job.pk) for job in page.rows if job.state in LIVE_STATES][:MAX_LIVE_IDS],
        "teams": teams_visible_to(request.user).order_by("name"),
        "states": JobState.choices,
        "selected_states": request.GET.getlist("state"),
        "poll_seconds": LIST_POLL_SECONDS,
        "filtered": any(request.GET.get(k) for k in ("team", "state", "since", "mine")),
        "several_clusters": several_clusters(),
    }
    template = "partials/job_table.html" if request.htmx else "jobs/job_list.html"
    return render(request, template, context)


@login_required
@require_GET
def job_live_states(request):
    """The list's poller: fresh state badges (out-of-band swaps) for the live rows it names, one
    query; it renders itself again with the ids still live, and without a trigger once none are."""
    ids = []
    for value in request.GET.get("ids", "").split(",")[:MAX_LIVE_IDS]:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue
    jobs = list(jobs_visible_to(request.user).filter(pk__in=ids).select_related(None).only("id", "state", "state_reason", "expected_start_at", "queue_position")) if ids else []
    live_ids = [str(job.pk) for job in jobs if job.state in LIVE_STATES]
    return render(
        request,
        "partials/job_live_states.html",
        {"jobs": jobs, "live_ids": live_ids, "poll_seconds": LIST_POLL_SECONDS},
    )


# ---------------------------------------------------------------- detail, cancel, output


def _detail_context(request, job: Job) -> dict:
    jobs_with_usage([job])  # what it really cost, beside the estimate (per task for arrays)
    array_rows, task_counts = array_task_table(job, usage=job.usage) if job.array else ([], {})
    return {
        "job": job,
        "events": list(job.events.order_by("at", "pk")),
        "is_live": job.state in LIVE_STATES,
        "poll_seconds": DETAIL_POLL_SECONDS,
        "task_counts": task_counts,
        "array_rows": array_rows,
        "streams": OutputStream.choices,
        "several_clusters": several_clusters(),
        # a warning of the team's idle-GPU policy with its deadline (while it runs: one query)
        "idle_warning": JobGpuIdleAlert.objects.filter(job=job, cancel_at__isnull=False).first() if job.state == JobState.RUNNING else None,
    }


def _output_context(job: Job, stream: str, task: int | None = None) -> dict:
    """The last OUTPUT_TAIL_BYTES of a stream (of array task ``task``; None: the first task)."""
    probe = job_output(job=job, stream=stream, offset=0, length=1, task=task)
    start = max(probe.size - OUTPUT_TAIL_BYTES, 0)
    chunk = job_output(job=job, stream=stream, offset=start, length=OUTPUT_TAIL_BYTES, task=task) if probe.size else probe
    return {
        "job": job,
        "stream": stream,
        "task": task,
        "task_query": f"&task={task}" if task is not None else "",
        "task_shown": (task if task is not None else first_array_index(job.array)) if job.array else None,
        "chunk": chunk,
        "truncated": start > 0,
        "is_live": job.state in LIVE_STATES,
        "poll_seconds": DETAIL_POLL_SECONDS,
        "streams": OutputStream.choices,
    }


def _stream(request) -> str:
    stream = request.GET.get("stream", OutputStream.STDOUT)
    return stream if stream in OutputStream.values else OutputStream.STDOUT


def _task(request, job: Job) -> int | None:
    """``?task=N``: an array task whose output to show (None: not an array, not given, or not a task of it)."""
    value = request.GET.get("task", "")
    if not job.array or not value.isdigit():
        return None
    from jobs.arrays import array_has_task

    return int(value) if array_has_task(job, int(value)) else None


@login_required
@require_GET
def job_detail(request, job_id):
    job = _visible_job(request, job_id)
    if request.htmx:
        return render(request, "partials/job_status_poll.html", _detail_context(request, job))
    context = _detail_context(request, job) | _output_context(job, _stream(request), _task(request, job))
    context["template_form"] = TemplateSaveForm(user=request.user, initial={"template_name": job.name})
    context |= _gpu_context(job)
    return render(request, "jobs/job_detail.html", context)


def _gpu_context(job: Job) -> dict:
    """The GPU section (partials/job_gpu_usage.html) and how often it re-reads itself: while the job
    runs, every GPU_USAGE_SYNC_SECONDS (the sync's cycle: nothing new can appear sooner); 0: no poll."""
    live = job.state in LIVE_STATES and job.started_at is not None
    return {"job": job, "gpu": job_gpu_report(job), "gpu_poll_seconds": max(settings.GPU_USAGE_SYNC_SECONDS, DETAIL_POLL_SECONDS) if live else 0}


@login_required
@require_GET
def job_gpu_usage_partial(request, job_id):
    """The job page's GPU section with its chart data, for all of the job's GPUs in one answer (the
    page's poll while the job runs: the chart moves without a reload)."""
    job = _visible_job(request, job_id)
    if not request.htmx:
        return redirect(reverse("jobs:detail", args=[job.pk]) + "#gpu-usage")
    return render(request, "partials/job_gpu_usage.html", _gpu_context(job))


@login_required
@require_GET
def job_output_partial(request, job_id):
    job = _visible_job(request, job_id)
    context = _output_context(job, _stream(request), _task(request, job))
    if request.htmx:
        return render(request, "partials/job_output.html", context)
    return redirect(reverse("jobs:detail", args=[job.pk]) + f"?stream={context['stream']}{context['task_query']}#output")


@login_required
@require_POST
def job_cancel_view(request, job_id):
    job = _visible_job(request, job_id)
    try:
        job = job_cancel(user=request.user, job=job, request=request)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        if job.state == JobState.CANCELLED:
            messages.success(request, "Job cancelled.")
        else:
            messages.success(request, "Cancellation requested; Slurm will stop the job shortly.")
    return redirect("jobs:detail", job_id=job.pk)


# ---------------------------------------------------------------- submission form and live estimate


def _limits_for(summary: dict, partition: str, cluster: str = "") -> dict | None:
    """The summary's row of the partition the job will go to: the one the inventory picks for the
    partition name and the form's cluster (jobs.inventory: the same choice as submission), so the
    panel never shows a same-named partition of another cluster; none when it cannot say."""
    from jobs.inventory import ClusterChoiceError, partition_capacity

    try:
        capacity = partition_capacity(partition or "", cluster or "")
    except ClusterChoiceError:
        return None
    if capacity is None:
        return None
    return next(
        (p for p in summary["partitions"] if p["name"] == capacity.name and p["cluster"] in ("", capacity.cluster)), None
    )


def _initial_for(request) -> tuple[dict, str]:
    """Initial form values from ?template=<id> or ?from=<job id> (resubmit), and a note saying so."""
    template_id = request.GET.get("template")
    job_ref = request.GET.get("from")
    if template_id:
        if whole_number(template_id) is None:
            raise ApplicationError("Invalid template.", errors={"template": ["A template id (a whole number)."]})
        template = get_object_or_404(job_templates_visible_to(request.user), pk=whole_number(template_id))
        slug = template.team.slug if template.team_id else None
        return initial_from_spec(template, team_slug=slug), f"Pre-filled from template “{template.name}”."
    if job_ref:
        try:
            job = _visible_job(request, uuid.UUID(job_ref))
        except ValueError:
            raise Http404 from None
        return initial_from_spec(job, team_slug=job.team.slug), f"Pre-filled from job {job.name}."
    return {}, ""


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request):
    summary = cluster_summary()
    note = ""
    read = request.method == "POST" and "read_script" in request.POST
    if read:
        form, note = _form_read_from_script(request, summary)
    elif request.method == "POST":
        form = JobForm(request.POST, request.FILES, user=request.user, summary=summary)
        if form.is_valid():
            try:
                job, created = job_submit(
                    user=request.user,
                    team=form.cleaned_data["team"],
                    idempotency_key=form.cleaned_data["idempotency_key"],
                    request=request,
                    booking=form.cleaned_data.get("booking") or None,
                    idle_exempt=bool(form.cleaned_data.get("idle_exempt")),
                    **form.job_kwargs(),
                )
            except ApplicationError as exc:
                if "idempotency_key" in exc.errors:
                    # the form was submitted before (back button) and then changed: a new key makes it a new job
                    data = request.POST.copy()
                    data["idempotency_key"] = uuid.uuid4().hex
                    form = JobForm(data, user=request.user, summary=summary)
                    form.is_valid()
                    form.add_error(None, "This form was already used to submit a job. Submit again to create another one.")
                else:
                    form_add_application_error(form, exc)
            else:
                if created:
                    messages.success(request, f"Job {job.name} accepted; it is on its way to Slurm.")
                else:
                    messages.info(request, f"This form was already submitted: here is job {job.name}.")
                return redirect("jobs:detail", job_id=job.pk)
    else:
        try:
            initial, note = _initial_for(request)
        except ApplicationError as exc:  # ?template=² : a 400 naming the parameter
            return HttpResponseBadRequest(f"{exc.message} template: {' '.join(exc.errors['template'])}", content_type="text/plain")
        form = JobForm(initial=initial, user=request.user, summary=summary)
    partition = form["partition"].value() or form.fields["partition"].initial
    context = {
        "form": form,
        "summary": summary,
        "note": note,
        "limits": _limits_for(summary, partition, form["cluster"].value() or ""),
        "template_form": TemplateSaveForm(user=request.user),
        "has_teams": form.fields["team"].queryset.exists(),
        # unbound: the values the form shows, field defaults included (GPUs 1), as htmx would post them
        "quote": _quote_from(form.data if form.is_bound else {name: form[name].value() for name in QuoteForm.base_fields},
                             parsed=_form_parse(form)),
    }
    status = 400 if request.method == "POST" and not (read and (request.htmx or not form.errors)) else 200
    # (htmx swaps no 4xx answer: a file it could not read is said beside the file field, with a 200)
    return render(request, "jobs/job_form.html", context, status=status)


def _form_read_from_script(request, summary) -> tuple[JobForm, str]:
    """"Read script" (a button without JavaScript; htmx on paste and on choosing a file): the form
    again, its script the uploaded file's text (else the textarea's), its script fields what the
    script's directives say (empty where the script is silent), the other fields as posted."""
    upload = request.FILES.get("script_file")
    script, problem = request.POST.get("script", ""), ""
    if upload:
        try:
            script = uploaded_script_text(upload)
        except forms.ValidationError as exc:
            problem = exc.messages[0]
    initial = {name: request.POST.get(name, "") for name in JobForm.base_fields if name != "script_file"}
    form = JobForm(initial=initial, user=request.user, summary=summary)
    form.parsed = parse_script(script)  # read once: the fields here, the estimate beside the form
    filled = fields_from_script(form.parsed)
    for name in ("partition", "gpu_type"):  # one the inventory does not offer stays for the script to decide
        if filled.get(name) not in {value for value, _ in form.fields[name].choices}:
            filled.pop(name, None)
    form.initial.update({name: filled.get(name, "") for name in SCRIPT_FIELDS})
    form.initial.update(time_limit_minutes=format_minutes(filled.get("time_limit_minutes")), script=script)
    if problem:
        form.cleaned_data = {}
        form.add_error("script_file", problem)
        return form, ""
    given = ", ".join(form.fields[name].label or name.replace("_", " ").capitalize() for name in SCRIPT_FIELDS if name in filled)
    return form, (f"Read from the script: {given}. " if given else "The script sets none of the fields. ") + (
        "Fields left as the script says are not overrides; change one to override the script."
    )


def _form_parse(form: JobForm) -> ParsedScript | None:
    """The script's parse the form made (JobForm.parsed; "Read script" sets it), if it could make
    one (an unbound form without it, or one whose data has no cleaned script: None)."""
    return getattr(form, "parsed", None)


def _quote_from(data, *, parsed: ParsedScript | None = None) -> dict:
    """The estimate for (possibly half-filled) form data: {"quote": JobQuote} or {"error": str}.
    ``parsed``: the request's parse of a script (used when it is the script of ``data``)."""
    form = QuoteForm(data)
    if not form.is_valid():
        field, errors = next(iter(form.errors.items()))
        label = {"time_limit_minutes": "time limit", "gpus": "GPUs", "memory_gb": "memory"}.get(field, field.replace("_", " "))
        return {"error": f"Check the {label}: {errors[0]}"}
    values = form.cleaned_data
    script = values.get("script") or ""
    parsed = parse_script(script, parsed)
    directives, problem = directives_table(parsed)
    shown = {"directives": directives, "directives_error": problem}
    if not values.get("gpus") and not script.strip():
        return {"error": "Give the number of GPUs (or a script asking for GPUs) to see an estimate."} | shown
    try:
        quote = job_quote(**given_or_empty(QuoteForm.base_fields, values), parsed=parsed)
    except ApplicationError as exc:
        messages_ = sum(exc.errors.values(), []) or [exc.message]
        return {"error": " ".join(messages_)} | shown
    return {"quote": quote} | shown


@login_required
@require_http_methods(["GET", "POST"])
def job_quote_partial(request):
    """The live estimate and the chosen partition's limits (htmx on the form's change/keyup)."""
    summary = cluster_summary()
    data = request.POST if request.method == "POST" else request.GET
    context = {"quote": _quote_from(data), "limits": _limits_for(summary, data.get("partition", ""), data.get("cluster", "")), "summary": summary}
    return render(request, "partials/job_quote.html", context)


# ---------------------------------------------------------------- templates


@login_required
@require_GET
def template_list(request):
    templates = list(job_templates_visible_to(request.user).order_by("scope", "name"))
    groups = [
        (label, [t for t in templates if t.scope == scope]) for scope, label in (
            (TemplateScope.PERSONAL, "Your templates"), (TemplateScope.TEAM, "Team templates"), (TemplateScope.SITE, "Site templates"),
        )
    ]  # fmt: skip
    return render(request, "jobs/template_list.html", {"groups": groups, "any": bool(templates), "is_admin": is_admin(request.user)})


def _save_template(request, *, spec: dict, team, form: TemplateSaveForm):
    return job_template_create(
        user=request.user,
        scope=form.cleaned_data["template_scope"],
        name=form.cleaned_data["template_name"],
        description=form.cleaned_data.get("template_description", ""),
        team=team,
        **spec,
    )


# the fields a script fills that a template keeps in its script only (the name: the template has its own)
UNTEMPLATED_FIELDS = tuple(name for name in SCRIPT_FIELDS if name not in TEMPLATE_FIELDS and name != "name")


def _has_untemplated_overrides(form: JobForm) -> bool:
    """An override a template cannot keep is an error beside its field (not silently dropped)."""
    kwargs = form.job_kwargs()
    for name in UNTEMPLATED_FIELDS:
        if kwargs.get(name) not in (None, ""):
            form.add_error(name, "A template keeps this in its script only: put the #SBATCH line in the script, or leave the field as the script says.")
    return bool(form.errors)


def _template_spec(values: dict) -> dict:
    """A submission's fields as a template's spec (jobs.job_fields.TEMPLATE_FIELDS)."""
    spec = {name: values[name] for name in TEMPLATE_FIELDS}
    spec["workdir"] = spec.get("workdir") or ""
    return spec


@login_required
@require_POST
def template_create_from_form(request):
    """"Save as template" on the submission form: the form's spec under a template name and scope."""
    summary = cluster_summary()
    form = JobForm(request.POST, request.FILES, user=request.user, summary=summary)
    template_form = TemplateSaveForm(request.POST, user=request.user)
    if form.is_valid() and template_form.is_valid() and not _has_untemplated_overrides(form):
        try:
            template = _save_template(
                request, spec=_template_spec(form.job_kwargs(as_filled=True)), team=form.cleaned_data["team"], form=template_form
            )
        except ApplicationError as exc:
            form_add_application_error(template_form, _template_error(exc))
        else:
            messages.success(request, f"Template “{template.name}” saved.")
            return redirect("jobs:templates")
    partition = form["partition"].value() or form.fields["partition"].initial
    context = {
        "form": form,
        "summary": summary,
        "limits": _limits_for(summary, partition, form["cluster"].value() or ""),
        "template_form": template_form,
        "template_open": True,
        "has_teams": form.fields["team"].queryset.exists(),
        "quote": _quote_from(request.POST, parsed=_form_parse(form)),
    }
    return render(request, "jobs/job_form.html", context, status=400)


def _template_error(exc: ApplicationError) -> ApplicationError:
    """A template error's fields renamed to the template form's (name → template_name, …)."""
    rename = {"name": "template_name", "scope": "template_scope", "team": "template_scope"}
    errors = {rename.get(k, k): v for k, v in exc.errors.items()}
    return ApplicationError(exc.message, errors=errors, status_code=exc.status_code)


@login_required
@require_POST
def template_create_from_job(request, job_id):
    """"Save as template" on a job's page."""
    job = _visible_job(request, job_id)
    form = TemplateSaveForm(request.POST, user=request.user)
    if form.is_valid():
        spec = {name: getattr(job, name) for name in TEMPLATE_FIELDS}
        try:
            template = _save_template(request, spec=spec, team=job.team, form=form)
        except ApplicationError as exc:
            form_add_application_error(form, _template_error(exc))
        else:
            messages.success(request, f"Template “{template.name}” saved.")
            return redirect("jobs:templates")
    context = _detail_context(request, job) | _output_context(job, OutputStream.STDOUT)
    context["template_form"] = form
    context["template_open"] = True
    context |= _gpu_context(job)
    return render(request, "jobs/job_detail.html", context, status=400)


@login_required
@require_POST
def template_delete(request, pk: int):
    template = get_object_or_404(job_templates_visible_to(request.user), pk=pk)
    try:
        job_template_delete(user=request.user, template=template)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Template “{template.name}” deleted.")
    return redirect("jobs:templates")
