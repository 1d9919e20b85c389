"""The job API: permission matrix for every endpoint, constant query counts, error shape."""

from __future__ import annotations

import os

import pytest

from jobs.choices import JobState, TemplateScope
from jobs.models import Job, JobTemplate
from tests.support import job_payload, output_patterns

pytestmark = pytest.mark.django_db
ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")


def make_job(world, *, submitter=None, team=None, state=JobState.PENDING, slurm_job_id=1, workdir="/tmp") -> Job:
    return Job.objects.create(
        team=team or world.vision, submitter=submitter or world.alice, name="j", script="#!/bin/bash\ntrue\n",
        partition="gpu", gpus=1, time_limit_minutes=5, workdir=workdir, state=state, slurm_job_id=slurm_job_id,
        estimated_gpu_hours=1, unix_uid=os.getuid(), **output_patterns(workdir),
    )  # fmt: skip


def expect(status_by_role: dict, role: str, response):
    assert response.status_code == status_by_role[role], (role, response.status_code, response.content[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"detail", "errors"}


@pytest.mark.parametrize("role", ROLES)
def test_job_list_matrix(api_client_for, world, role):
    job = make_job(world)
    response = api_client_for(role).get("/api/v1/jobs/")
    expect({"anonymous": 401, **{r: 200 for r in ROLES[1:]}}, role, response)
    if response.status_code == 200:
        ids = [row["id"] for row in response.json()["results"]]
        assert ids == ([str(job.pk)] if role in ("member", "manager", "admin") else [])


@pytest.mark.parametrize("role", ROLES)
def test_job_submit_matrix(api_client_for, inventory, relays, role):
    response = api_client_for(role).post("/api/v1/jobs/", job_payload(), format="json")
    # admins and finance are not members of vision: jobs run as a member of the team's account
    expect({"anonymous": 401, "outsider": 400, "member": 201, "manager": 201, "admin": 400, "finance": 400}, role, response)
    assert Job.objects.count() == (1 if response.status_code == 201 else 0)


@pytest.mark.parametrize("role", ROLES)
def test_job_detail_matrix(api_client_for, world, role):
    job = make_job(world)
    response = api_client_for(role).get(f"/api/v1/jobs/{job.pk}/")
    expect({"anonymous": 401, "outsider": 404, "member": 200, "manager": 200, "admin": 200, "finance": 404}, role, response)
    if response.status_code == 200:
        assert response.json()["script"] == "#!/bin/bash\ntrue\n" and "events" in response.json()


@pytest.mark.parametrize("role", ROLES)
def test_job_cancel_matrix(api_client_for, world, relays, role):
    job = make_job(world)  # submitted by alice (member)
    response = api_client_for(role).post(f"/api/v1/jobs/{job.pk}/cancel/")
    expect({"anonymous": 401, "outsider": 404, "member": 202, "manager": 202, "admin": 202, "finance": 404}, role, response)
    job.refresh_from_db()
    assert job.cancel_requested == (response.status_code == 202)


def test_cancel_by_a_member_who_did_not_submit_is_403(api_client_for, world):
    job = make_job(world, submitter=world.bob)
    response = api_client_for("member").post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 403
    job.refresh_from_db()
    assert not job.cancel_requested


def test_cancel_of_a_finished_job_is_409_with_the_state(api_client_for, world):
    job = make_job(world, state=JobState.COMPLETED)
    response = api_client_for("member").post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 409
    assert response.json()["detail"] == "Job already ended (COMPLETED)."


def test_cancel_of_an_accepted_job_is_immediate(api_client_for, world, relays):
    job = make_job(world, state=JobState.ACCEPTED, slurm_job_id=None)
    response = api_client_for("member").post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    assert relays["cancel"] == []


@pytest.mark.parametrize("role", ROLES)
def test_job_output_matrix(api_client_for, world, tmp_path, role):
    job = make_job(world, workdir=str(tmp_path), slurm_job_id=77)
    (tmp_path / "slurm-77.out").write_text("CUDA_VISIBLE_DEVICES=0\n")
    response = api_client_for(role).get(f"/api/v1/jobs/{job.pk}/output/?stream=stdout&offset=0&length=100")
    expect({"anonymous": 401, "outsider": 404, "member": 200, "manager": 200, "admin": 200, "finance": 404}, role, response)
    if response.status_code == 200:
        assert response.json()["data"] == "CUDA_VISIBLE_DEVICES=0\n"


def test_output_with_a_bad_stream_is_400_naming_it(api_client_for, world):
    job = make_job(world)
    response = api_client_for("member").get(f"/api/v1/jobs/{job.pk}/output/?stream=stdin")
    assert response.status_code == 400 and "stream" in response.json()["errors"]


@pytest.mark.parametrize("role", ROLES)
def test_job_quote_matrix(api_client_for, inventory, role):
    response = api_client_for(role).post("/api/v1/jobs/quote/", {"partition": "gpu", "gpu_type": "a100", "gpus": 2, "time_limit_minutes": 60}, format="json")
    expect({"anonymous": 401, **{r: 200 for r in ROLES[1:]}}, role, response)
    if response.status_code == 200:
        assert response.json()["gpu_hours"] == "2.00"


@pytest.fixture
def templates(world):
    mk = dict(script="#!/bin/bash\ntrue\n", gpus=1)
    return {
        "team": JobTemplate.objects.create(scope=TemplateScope.TEAM, team=world.vision, created_by=world.alice, name="vision-t", **mk),
        "personal": JobTemplate.objects.create(scope=TemplateScope.PERSONAL, owner=world.alice, created_by=world.alice, name="mine", **mk),
        "site": JobTemplate.objects.create(scope=TemplateScope.SITE, name="site-t", **mk),
        "nlp": JobTemplate.objects.create(scope=TemplateScope.TEAM, team=world.nlp, created_by=world.carol, name="nlp-t", **mk),
    }


@pytest.mark.parametrize("role", ROLES)
def test_template_list_matrix(api_client_for, templates, role):
    response = api_client_for(role).get("/api/v1/job-templates/")
    expect({"anonymous": 401, **{r: 200 for r in ROLES[1:]}}, role, response)
    if response.status_code == 200:
        names = {row["name"] for row in response.json()["results"]}
        wanted = {
            "outsider": {"site-t"}, "member": {"site-t", "vision-t", "mine"}, "manager": {"site-t", "vision-t"},
            "admin": {"site-t", "vision-t", "mine", "nlp-t"}, "finance": {"site-t"},
        }[role]  # fmt: skip
        assert names == wanted


@pytest.mark.parametrize("role", ROLES)
def test_template_create_matrix(api_client_for, world, role):
    body = {"scope": "team", "team": "vision", "name": "new", "script": "#!/bin/bash\necho\n", "gpus": 2}
    response = api_client_for(role).post("/api/v1/job-templates/", body, format="json")
    expect({"anonymous": 401, "outsider": 400, "member": 201, "manager": 201, "admin": 400, "finance": 400}, role, response)
    assert JobTemplate.objects.filter(name="new").exists() == (response.status_code == 201)


@pytest.mark.parametrize(("role", "status"), [("member", 403), ("admin", 201)])
def test_only_admins_create_site_templates(api_client_for, world, role, status):
    body = {"scope": "site", "name": "everyone", "script": "#!/bin/bash\necho\n"}
    assert api_client_for(role).post("/api/v1/job-templates/", body, format="json").status_code == status


@pytest.mark.parametrize("role", ROLES)
def test_template_detail_matrix(api_client_for, templates, role):
    response = api_client_for(role).get(f"/api/v1/job-templates/{templates['team'].pk}/")
    expect({"anonymous": 401, "outsider": 404, "member": 200, "manager": 200, "admin": 200, "finance": 404}, role, response)


@pytest.mark.parametrize("role", ROLES)
def test_template_delete_matrix(api_client_for, templates, role):
    response = api_client_for(role).delete(f"/api/v1/job-templates/{templates['team'].pk}/")
    expect({"anonymous": 401, "outsider": 404, "member": 204, "manager": 204, "admin": 204, "finance": 404}, role, response)
    assert JobTemplate.objects.filter(pk=templates["team"].pk).exists() == (response.status_code != 204)


def test_template_of_another_member_cannot_be_deleted_by_a_member(api_client_for, world, templates):
    template = JobTemplate.objects.create(scope=TemplateScope.TEAM, team=world.vision, created_by=world.bob, name="bobs", script="x")
    assert api_client_for("member").delete(f"/api/v1/job-templates/{template.pk}/").status_code == 403


def test_job_list_query_count_does_not_grow_with_jobs(api_client_for, world, django_assert_num_queries):
    client = api_client_for("member")
    for _ in range(3):
        make_job(world, slurm_job_id=None, state=JobState.ACCEPTED)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as small:
        assert len(client.get("/api/v1/jobs/").json()["results"]) == 3
    for _ in range(27):
        make_job(world, slurm_job_id=None, state=JobState.ACCEPTED)
    with django_assert_num_queries(len(small)):
        assert len(client.get("/api/v1/jobs/").json()["results"]) == 30


def test_job_list_filters_and_whitelisted_ordering(api_client_for, world):
    make_job(world, state=JobState.COMPLETED, slurm_job_id=1)
    running = make_job(world, state=JobState.RUNNING, slurm_job_id=2)
    make_job(world, team=world.nlp, submitter=world.carol, slurm_job_id=3)
    client = api_client_for("admin")
    assert [r["id"] for r in client.get("/api/v1/jobs/?state=live&team=vision").json()["results"]] == [str(running.pk)]
    assert client.get("/api/v1/jobs/?ordering=script").status_code == 400
    assert client.get("/api/v1/jobs/?ordering=-gpus").status_code == 200


def test_schema_has_the_job_endpoints_without_warnings_or_dangling_references(tmp_path):
    import json
    import re
    import subprocess
    import sys

    path = tmp_path / "schema.json"
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--format", "openapi-json", "--file", str(path)],
        capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = path.read_text()
    schema = json.loads(text)
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', text))
    assert refs and refs <= set(schema["components"]["schemas"]), refs - set(schema["components"]["schemas"])
    # POST /api/v1/jobs/ takes one job or an array of them
    body = schema["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    one_of = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]["oneOf"]
    assert {item.get("type", "object") for item in one_of} == {"object", "array"}
