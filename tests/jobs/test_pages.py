"""The job pages: permission matrix, the submission form (errors beside fields, input kept, relay
enqueued), live estimate, list filters and query counts, htmx partials, cancel, templates."""

from __future__ import annotations

import os

import pytest
from django.urls import reverse

from jobs.choices import JobState, TemplateScope
from jobs.models import Job, JobEvent, JobTemplate
from jobs.services import job_template_create
from tests.support import output_patterns

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def _job(world, *, team=None, user=None, state=JobState.ACCEPTED, name="train", **extra) -> Job:
    """A job row as the services would leave it (no Slurm involved)."""
    team = team or world.vision
    user = user or world.alice
    job = Job.objects.create(
        team=team, submitter=user, name=name, script="#!/bin/bash\necho hi\n", partition="gpu", gpu_type="a100",
        gpus=1, time_limit_minutes=30, workdir="/tmp", state=state, estimated_gpu_hours="0.50",
        estimated_cost="5.00", currency="CNY", **output_patterns("/tmp", extra.get("array", "")), **extra,
    )  # fmt: skip
    JobEvent.objects.create(job=job, state=JobState.ACCEPTED, reason="Accepted by the portal", at=job.created_at)
    return job


def form_data(**overrides) -> dict:
    data = {
        "team": "vision", "name": "train-resnet", "partition": "gpu", "gpu_type": "a100", "gpus": "2",
        "nodes": "1", "cpus_per_gpu": "2", "memory_gb": "16", "time_limit_minutes": "30",
        "script": "#!/bin/bash\necho hello\n", "workdir": "", "environment": "EPOCHS=3", "idempotency_key": "k-1",
    }  # fmt: skip
    data.update(overrides)
    return data


# ---------------------------------------------------------------- permission matrix


PAGE_EXPECTATIONS = {
    # role: status of the vision job's detail page
    "anonymous": 302,
    "outsider": 404,
    "member": 200,
    "manager": 200,
    "admin": 200,
    "finance": 404,  # jobs_visible_to: finance reads costs through accounting, not jobs
}


@pytest.mark.parametrize("role", PAGE_EXPECTATIONS)
def test_job_detail_permission_matrix(world, client_for, role):
    job = _job(world)
    response = client_for(role).get(reverse("jobs:detail", args=[job.pk]))
    assert response.status_code == PAGE_EXPECTATIONS[role]
    if role == "anonymous":
        assert response.url.startswith(reverse("login"))
    if response.status_code == 200:
        assert job.name in response.content.decode()


@pytest.mark.parametrize("role", PAGE_EXPECTATIONS)
@pytest.mark.parametrize("page", ["jobs:output", "jobs:cancel", "jobs:save-template"])
def test_job_subpages_permission_matrix(world, client_for, role, page, relays):
    job = _job(world)
    client = client_for(role)
    url = reverse(page, args=[job.pk])
    response = client.get(url, **HTMX) if page == "jobs:output" else client.post(url, {"template_name": "t", "template_scope": "personal"})
    expected = PAGE_EXPECTATIONS[role]
    if expected == 200:
        expected = {"jobs:output": 200, "jobs:cancel": 302, "jobs:save-template": 302}[page]
    assert response.status_code == expected


@pytest.mark.parametrize(
    ("role", "sees_job"),
    [("anonymous", None), ("outsider", False), ("member", True), ("manager", True), ("admin", True), ("finance", False)],
)
def test_job_list_shows_only_visible_jobs(world, client_for, role, sees_job):
    job = _job(world, name="vision-job")
    _job(world, team=world.nlp, user=world.carol, name="nlp-job")
    response = client_for(role).get(reverse("jobs:list"))
    if sees_job is None:
        assert response.status_code == 302 and response.url.startswith(reverse("login"))
        return
    assert response.status_code == 200
    body = response.content.decode()
    assert ("vision-job" in body) is sees_job
    assert ("nlp-job" in body) is (role == "admin")
    if not sees_job:
        assert str(job.pk) not in body


@pytest.mark.parametrize("url_name", ["jobs:new", "jobs:templates", "jobs:list"])
def test_pages_require_login(client_for, url_name):
    response = client_for("anonymous").get(reverse(url_name))
    assert response.status_code == 302 and response.url.startswith(reverse("login"))


def test_job_list_empty_state_says_what_to_do(client_for):
    body = client_for("member").get(reverse("jobs:list")).content.decode()
    assert "No jobs yet" in body and reverse("jobs:new") in body


# ---------------------------------------------------------------- submission form


def test_form_offers_my_teams_and_the_inventorys_partitions(world, client_for, inventory):
    response = client_for("member").get(reverse("jobs:new"))
    assert response.status_code == 200
    form = response.context["form"]
    assert [t.slug for t in form.fields["team"].queryset] == ["vision"]
    assert [c[0] for c in form.fields["partition"].choices] == ["", "gpu", "debug"]  # "": the script decides
    assert [c[0] for c in form.fields["gpu_type"].choices] == ["", "a100", "h100"]
    body = response.content.decode()
    assert 'hx-post="/jobs/new/quote/"' in body and "keyup delay:300ms" in body
    assert "Max time: 4320 min" in body  # the default partition's limits


def test_form_for_someone_without_team_says_what_to_do(client_for, inventory):
    body = client_for("outsider").get(reverse("jobs:new")).content.decode()
    assert "not a member of an active team" in body


def test_form_post_creates_an_accepted_job_and_enqueues_the_relay(world, client_for, inventory, django_capture_on_commit_callbacks, relays):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client_for("member").post(reverse("jobs:new"), form_data())
    job = Job.objects.get()
    assert response.status_code == 302 and response.url == reverse("jobs:detail", args=[job.pk])
    assert job.state == JobState.ACCEPTED
    assert (job.team, job.submitter, job.gpus, job.time_limit_minutes) == (world.vision, world.alice, 2, 30)
    assert job.environment == {"EPOCHS": "3"}
    assert len(callbacks) == 1 and relays["drain"] == [None]


def test_form_accepts_slurm_time_formats(world, client_for, inventory, relays):
    client_for("member").post(reverse("jobs:new"), form_data(time_limit_minutes="1:30:00"))
    assert Job.objects.get().time_limit_minutes == 90


def test_form_post_twice_with_the_same_key_creates_one_job(client_for, inventory, relays):
    client = client_for("member")
    first = client.post(reverse("jobs:new"), form_data())
    second = client.post(reverse("jobs:new"), form_data())
    assert Job.objects.count() == 1
    assert first.url == second.url


def test_form_errors_from_the_service_show_beside_fields_and_keep_input(client_for, inventory, relays):
    response = client_for("member").post(
        reverse("jobs:new"), form_data(gpus="9", partition="debug", time_limit_minutes="2h", name="my-run")
    )
    assert response.status_code == 400
    form = response.context["form"]
    assert "gpus" in form.errors and "time_limit_minutes" in form.errors
    assert "At most 60 minutes" in form.errors["time_limit_minutes"][0]
    body = response.content.decode()
    # the message sits in the field's group, right after its label
    gpus_group = body[body.index('for="id_gpus"'): body.index('for="id_nodes"')]
    assert "errorlist" in gpus_group and "per node" in gpus_group
    assert 'value="my-run"' in body and 'value="2h"' in body and "echo hello" in body
    assert Job.objects.count() == 0


def test_form_field_errors_for_bad_shapes(client_for, inventory, relays):
    response = client_for("member").post(reverse("jobs:new"), form_data(time_limit_minutes="soon", gpus="0", team="nlp"))
    assert response.status_code == 400
    assert set(response.context["form"].errors) >= {"time_limit_minutes", "gpus", "team"}
    assert Job.objects.count() == 0


def test_quote_partial_estimates_as_the_user_types(client_for, inventory):
    client = client_for("member")
    response = client.post(reverse("jobs:quote"), {"partition": "gpu", "gpu_type": "a100", "gpus": "2", "time_limit_minutes": "90m"}, **HTMX)
    assert response.status_code == 200
    assert [t.name for t in response.templates] == ["partials/job_quote.html"]
    body = response.content.decode()
    assert "3.00 GPU-hours" in body and 'id="job-quote"' in body
    assert "Max time: 4320 min" in body

    response = client.post(reverse("jobs:quote"), {"partition": "debug", "gpus": "2", "time_limit_minutes": "3h"}, **HTMX)
    assert response.status_code == 200 and "At most 60 minutes" in response.content.decode()

    response = client.post(reverse("jobs:quote"), {"partition": "gpu", "gpus": "", "time_limit_minutes": "1"}, **HTMX)
    assert "Give the number of GPUs" in response.content.decode()


# ---------------------------------------------------------------- list: filters, pagination, queries, htmx


def test_job_list_filters_by_team_and_state(world, client_for):
    world.alice.memberships.create(team=world.nlp, role="member")
    _job(world, name="vision-running", state=JobState.RUNNING)
    _job(world, team=world.nlp, name="nlp-done", state=JobState.COMPLETED)
    client = client_for("member")
    body = client.get(reverse("jobs:list"), {"team": "nlp"}).content.decode()
    assert "nlp-done" in body and "vision-running" not in body
    body = client.get(reverse("jobs:list"), {"state": "live"}).content.decode()
    assert "vision-running" in body and "nlp-done" not in body
    body = client.get(reverse("jobs:list"), {"state": "RUNNING", "team": "nlp"}).content.decode()
    assert "No job matches these filters" in body


def test_job_list_paginates(world, client_for):
    for i in range(30):
        _job(world, name=f"job-{i:02d}")
    client = client_for("member")
    first = client.get(reverse("jobs:list"))
    assert len(first.context["jobs"]) == 25 and 'rel="next"' in first.content.decode()
    assert first.context["newer_query"] is None
    second = client.get(reverse("jobs:list") + first.context["older_query"])
    assert len(second.context["jobs"]) == 5 and second.context["older_query"] is None


def _count_list_queries(client) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("jobs:list")).status_code == 200
    return len(ctx.captured_queries)


def test_job_list_query_count_does_not_grow_with_jobs(world, client_for, django_assert_num_queries):
    client = client_for("member")
    for i in range(3):
        _job(world, name=f"a-{i}", state=JobState.RUNNING)
    few = _count_list_queries(client)
    assert few <= 8  # session, user, teams for the filter, the page (keyset: no count), the jobs' usage (+ savepoints)
    for i in range(27):
        _job(world, name=f"b-{i}", user=world.bob)
    with django_assert_num_queries(few):
        response = client.get(reverse("jobs:list"))
    assert len(response.context["jobs"]) == 25


def test_job_list_htmx_request_gets_the_table_partial(world, client_for):
    _job(world, state=JobState.RUNNING)
    response = client_for("member").get(reverse("jobs:list"), {"state": "live"}, **HTMX)
    assert response.status_code == 200
    assert response.templates[0].name == "partials/job_table.html"
    assert "<html" not in response.content.decode()


def test_job_list_polls_only_live_rows_and_stops_when_none(world, client_for):
    live = _job(world, name="live", state=JobState.RUNNING)
    done = _job(world, name="done", state=JobState.COMPLETED)
    client = client_for("member")
    body = client.get(reverse("jobs:list")).content.decode()
    assert f"ids={live.pk}" in body and str(done.pk) not in body.split('id="job-live-poller"')[1].split(">")[0]

    response = client.get(reverse("jobs:live-states"), {"ids": f"{live.pk},{done.pk}"}, **HTMX)
    body = response.content.decode()
    assert f'id="state-{live.pk}"' in body and 'hx-swap-oob="true"' in body and "every 5s" in body

    Job.objects.filter(pk=live.pk).update(state=JobState.COMPLETED)
    body = client.get(reverse("jobs:live-states"), {"ids": str(live.pk)}, **HTMX).content.decode()
    assert "Completed" in body and "hx-trigger" not in body  # polling stops


def test_live_states_never_reveal_invisible_jobs(world, client_for):
    job = _job(world, team=world.nlp, user=world.carol, state=JobState.RUNNING)
    body = client_for("member").get(reverse("jobs:live-states"), {"ids": str(job.pk)}, **HTMX).content.decode()
    assert str(job.pk) not in body


# ---------------------------------------------------------------- detail, output, cancel


def test_job_detail_shows_spec_history_and_polls_while_live(world, client_for):
    job = _job(world, state=JobState.RUNNING, slurm_job_id=4242)
    client = client_for("member")
    body = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "4242" in body and "Accepted by the portal" in body and "echo hi" in body
    assert 'hx-trigger="every 3s"' in body
    assert reverse("jobs:cancel", args=[job.pk]) in body and "csrfmiddlewaretoken" in body

    partial = client.get(reverse("jobs:detail", args=[job.pk]), **HTMX)
    assert partial.templates[0].name == "partials/job_status_poll.html"  # the status card (+ an array's tasks)
    assert "partials/job_status.html" in {t.name for t in partial.templates}

    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED, exit_code=0)
    partial = client.get(reverse("jobs:detail", args=[job.pk]), **HTMX).content.decode()
    assert "hx-trigger" not in partial and "exit code" in partial


def test_output_partial_tails_the_file_and_stops_when_terminal(world, client_for, tmp_path, settings):
    settings.JOB_OUTPUT_PATTERN = str(tmp_path) + "/{slurm_job_id}.{stream}"
    job = _job(world, state=JobState.RUNNING, slurm_job_id=77, unix_uid=os.getuid())  # the files' owner
    (tmp_path / "77.out").write_text("epoch 1\nepoch 2\n")
    (tmp_path / "77.err").write_text("warning!\n")
    client = client_for("member")

    response = client.get(reverse("jobs:output", args=[job.pk]), **HTMX)
    body = response.content.decode()
    assert response.templates[0].name == "partials/job_output.html"
    assert "epoch 2" in body and "every 3s" in body

    body = client.get(reverse("jobs:output", args=[job.pk]), {"stream": "stderr"}, **HTMX).content.decode()
    assert "warning!" in body and "epoch" not in body

    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED)
    body = client.get(reverse("jobs:output", args=[job.pk]), **HTMX).content.decode()
    assert "epoch 2" in body and "hx-trigger" not in body

    # without htmx: the page itself, at the output
    plain = client.get(reverse("jobs:output", args=[job.pk]))
    assert plain.status_code == 302 and plain.url.endswith("?stream=stdout#output")


def test_output_before_slurm_says_why_there_is_none(world, client_for):
    job = _job(world)
    body = client_for("member").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "has not reached Slurm yet" in body


def test_cancel_before_slurm_cancels_at_once(world, client_for, relays):
    job = _job(world)
    response = client_for("member").post(reverse("jobs:cancel", args=[job.pk]), follow=True)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert "Job cancelled." in response.content.decode()


def test_cancel_of_an_ended_job_shows_the_conflict(world, client_for, relays):
    job = _job(world, state=JobState.COMPLETED)
    response = client_for("manager").post(reverse("jobs:cancel", args=[job.pk]), follow=True)
    assert "Job already ended (COMPLETED)." in response.content.decode()


def test_cancel_by_a_plain_member_of_someone_elses_job_is_refused(world, client_for, relays):
    job = _job(world, user=world.bob, state=JobState.RUNNING, slurm_job_id=5)
    response = client_for("member").post(reverse("jobs:cancel", args=[job.pk]), follow=True)
    job.refresh_from_db()
    assert job.cancel_requested_at is None
    assert "Only the submitter" in response.content.decode()


def test_cancel_needs_post_and_csrf(world, client_for):
    from django.test import Client

    job = _job(world)
    assert client_for("member").get(reverse("jobs:cancel", args=[job.pk])).status_code == 405
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(world.alice)
    assert csrf_client.post(reverse("jobs:cancel", args=[job.pk])).status_code == 403


# ---------------------------------------------------------------- templates


def test_save_job_as_personal_template_and_submit_from_it(world, client_for, inventory):
    job = _job(world)
    client = client_for("member")
    response = client.post(reverse("jobs:save-template", args=[job.pk]), {"template_name": "my train", "template_scope": "personal"})
    assert response.status_code == 302
    template = JobTemplate.objects.get()
    assert (template.scope, template.owner, template.script) == (TemplateScope.PERSONAL, world.alice, job.script)

    listing = client.get(reverse("jobs:templates")).content.decode()
    assert "my train" in listing and f"?template={template.pk}" in listing

    form = client.get(reverse("jobs:new"), {"template": template.pk}).context["form"]
    assert form.initial["script"] == job.script and form.initial["name"] == "my-train"
    assert form.initial["time_limit_minutes"] == "0:30:00"

    # others do not see a personal template
    assert client_for("manager").get(reverse("jobs:new"), {"template": template.pk}).status_code == 404


def test_save_template_from_the_form_keeps_input_on_error(world, client_for, inventory):
    client = client_for("member")
    ok = client.post(reverse("jobs:template-create"), form_data(template_name="team-run", template_scope="team"))
    assert ok.status_code == 302
    template = JobTemplate.objects.get()
    assert (template.scope, template.team) == (TemplateScope.TEAM, world.vision)
    assert Job.objects.count() == 0

    again = client.post(reverse("jobs:template-create"), form_data(template_name="team-run", template_scope="team"))
    assert again.status_code == 400
    assert "Already used in this scope." in again.context["template_form"].errors["template_name"][0]
    assert "echo hello" in again.content.decode()


def test_only_admins_may_publish_site_templates(world, client_for, inventory):
    job = _job(world)
    refused = client_for("member").post(reverse("jobs:save-template", args=[job.pk]), {"template_name": "site", "template_scope": "site"})
    assert refused.status_code == 400 and not JobTemplate.objects.exists()
    job_admin = _job(world, user=world.admin)
    ok = client_for("admin").post(reverse("jobs:save-template", args=[job_admin.pk]), {"template_name": "site", "template_scope": "site"})
    assert ok.status_code == 302
    assert JobTemplate.objects.get().scope == TemplateScope.SITE
    assert "site" in client_for("outsider").get(reverse("jobs:templates")).content.decode()


def test_template_list_empty_state(client_for):
    body = client_for("member").get(reverse("jobs:templates")).content.decode()
    assert "No templates yet" in body


def test_template_delete_by_owner_only(world, client_for):
    template = job_template_create(user=world.alice, scope=TemplateScope.PERSONAL, name="mine", script="echo\n")
    assert client_for("manager").post(reverse("jobs:template-delete", args=[template.pk])).status_code == 404
    assert client_for("member").post(reverse("jobs:template-delete", args=[template.pk])).status_code == 302
    assert not JobTemplate.objects.exists()


def test_resubmit_prefills_from_a_job(world, client_for, inventory):
    job = _job(world, name="first-run")
    form = client_for("member").get(reverse("jobs:new"), {"from": str(job.pk)}).context["form"]
    assert form.initial["name"] == "first-run" and form.initial["team"] == "vision"
    assert client_for("outsider").get(reverse("jobs:new"), {"from": str(job.pk)}).status_code == 404


def test_the_form_takes_the_jobs_to_wait_for_and_the_page_shows_them(world, inventory, relays, client_for):
    from jobs.services import job_submit

    parent, _ = job_submit(user=world.alice, team=world.vision, name="first-step", script="#!/bin/bash\ntrue\n",
                           partition="gpu", gpus=1, time_limit_minutes=5)  # fmt: skip
    client = client_for("member")
    response = client.post(reverse("jobs:new"), form_data(depends_on=f"{parent.pk}", idempotency_key="k-dep"))
    assert response.status_code == 302, response.content.decode()[:2000]
    child = Job.objects.exclude(pk=parent.pk).get()
    assert list(child.depends_on.all()) == [parent]
    page = client.get(reverse("jobs:detail", args=[child.pk])).content.decode()
    assert "Waits for" in page and "first-step" in page
    response = client.post(reverse("jobs:new"), form_data(depends_on="nonsense", idempotency_key="k-dep2"))
    assert response.status_code == 400 and "is not a job id" in response.content.decode()
