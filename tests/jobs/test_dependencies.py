"""Job dependencies (issue 38, jobs.dependencies): ``depends_on`` on the API, the form and the CLI;
who may be named; the script's own ``--dependency``; the relay's claim waits for the parents' Slurm
ids and sends afterok on them. The same against the real clusters: test_dependencies_slurm.py."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.dependencies import dependency_option, parents_of
from jobs.models import Job, JobDependency
from jobs.services import job_submit
from jobs.services.relay import _claim_waiting, _submission_for
from portal.slurm import JobRequest, SlurmRejected
from tests.support import job_payload

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def _job(world, name="parent", *, user=None, team=None, **fields) -> Job:
    job, _ = job_submit(user=user or world.alice, team=team or world.vision, name=name, script="#!/bin/bash\ntrue\n",
                        partition="gpu", gpus=1, time_limit_minutes=5, **fields)  # fmt: skip
    return job


def _in_slurm(job: Job, slurm_job_id: int, state=JobState.PENDING) -> None:
    """What the relay records when Slurm took the job."""
    Job.objects.filter(pk=job.pk).update(state=state, slurm_job_id=slurm_job_id, slurm_cluster=job.cluster.name)


def test_the_api_takes_depends_on_stores_it_and_replaces_the_scripts_dependency(world, inventory, relays):
    parent = _job(world)
    script = "#!/bin/bash\n#SBATCH --dependency=singleton\n#SBATCH --signal=USR1@60\npython train.py\n"
    response = _client(world.alice).post("/api/v1/jobs/", job_payload(script=script, depends_on=[str(parent.pk)]), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["depends_on"] == [str(parent.pk)]
    child = Job.objects.get(pk=response.json()["id"])
    assert list(JobDependency.objects.filter(job=child).values_list("parent_id", flat=True)) == [parent.pk]
    request = JobRequest.from_json(child.request)
    assert request.depends_on == (str(parent.pk),)
    # the field overrides the script's --dependency as sbatch's command line would: the line is a
    # comment in what Slurm gets, and no dependency is among the options until the relay adds it
    assert "dependency" not in dict(request.options)
    assert "#SBATCH --dependency=singleton" not in request.script.splitlines()
    assert "#SBATCH --signal=USR1@60" in request.script.splitlines()


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        (["not-a-job"], "valid UUID"),
        ("abc", "Expected a list"),
        ([str(uuid.uuid4())], "that you may see"),
    ],
)
def test_a_bad_depends_on_is_a_400_naming_the_field(world, inventory, relays, depends_on, message):
    response = _client(world.alice).post("/api/v1/jobs/", job_payload(depends_on=depends_on), format="json")
    assert response.status_code == 400, response.json()
    assert "depends_on" in response.json()["errors"]
    assert message in str(response.json()["errors"]["depends_on"])
    assert Job.objects.count() == 0


def test_another_teams_job_cannot_be_named_and_is_answered_as_missing(world, inventory, relays):
    theirs = _job(world, user=world.carol, team=world.nlp)
    response = _client(world.alice).post("/api/v1/jobs/", job_payload(depends_on=[str(theirs.pk)]), format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["depends_on"] == [f"No job {theirs.pk} that you may see."]
    assert not JobDependency.objects.exists()


def test_a_parent_that_already_failed_is_refused_and_one_that_completed_is_fine(world, inventory, relays):
    failed, completed = _job(world, "failed"), _job(world, "completed")
    Job.objects.filter(pk=failed.pk).update(state=JobState.FAILED, ended_at=timezone.now())
    Job.objects.filter(pk=completed.pk).update(state=JobState.COMPLETED, ended_at=timezone.now())
    client = _client(world.alice)
    response = client.post("/api/v1/jobs/", job_payload(depends_on=[str(failed.pk)]), format="json")
    assert response.status_code == 400
    assert "ended FAILED" in response.json()["errors"]["depends_on"][0]
    response = client.post("/api/v1/jobs/", job_payload(depends_on=[str(completed.pk)]), format="json")
    assert response.status_code == 201, response.json()


def test_the_scripts_own_dependency_must_name_a_slurm_job_the_submitter_may_see(world, inventory, relays):
    mine, theirs = _job(world, "mine"), _job(world, "theirs", user=world.carol, team=world.nlp)
    _in_slurm(mine, 4101)
    _in_slurm(theirs, 4102)
    client = _client(world.alice)
    script = "#!/bin/bash\n#SBATCH --dependency=afterok:{}\ntrue\n"
    response = client.post("/api/v1/jobs/", job_payload(script=script.format(4102)), format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["script"] == [
        "line 2: #SBATCH --dependency: no job 4102 of yours on this cluster (name jobs of the portal you may see)."
    ]
    response = client.post("/api/v1/jobs/", job_payload(script=script.format("4101?afterany:4102")), format="json")
    assert response.status_code == 400 and "4102" in response.json()["errors"]["script"][0]
    response = client.post("/api/v1/jobs/", job_payload(script="#!/bin/bash\n#SBATCH --dependency=afterwards:1\ntrue\n"), format="json")
    assert response.status_code == 400 and "not a dependency sbatch knows" in response.json()["errors"]["script"][0]
    response = client.post("/api/v1/jobs/", job_payload(script=script.format(4101)), format="json")
    assert response.status_code == 201, response.json()
    child = Job.objects.get(pk=response.json()["id"])
    assert ("dependency", "afterok:4101") in JobRequest.from_json(child.request).options  # unchanged, as sbatch gets it


def test_the_relay_claims_a_child_only_once_its_parents_have_slurm_ids(world, inventory, relays):
    parent = _job(world)
    child = _job(world, "child", depends_on=[parent.pk])
    _job(world, "other")
    token, claimed = _claim_waiting(10)
    assert {job.name for job in claimed} == {"parent", "other"}  # read back by the claim's own statement
    assert set(Job.objects.filter(relay_token=token).values_list("name", flat=True)) == {"parent", "other"}
    Job.objects.filter(relay_token=token).update(relay_token=None, relay_started_at=None)
    _in_slurm(parent, 5001)
    token, claimed = _claim_waiting(10)
    assert set(Job.objects.filter(relay_token=token).values_list("name", flat=True)) == {"child", "other"}
    submission = _submission_for(Job.objects.get(pk=child.pk), ensure_dirs=False, parents=parents_of([child.pk])[child.pk])
    assert submission.dependency == "afterok:5001"
    assert submission.options[-len(submission.relay_options):][0] == ("dependency", "afterok:5001")


def test_the_dependency_leaves_out_completed_parents_and_refuses_a_failed_one():
    a, b = uuid.uuid4(), uuid.uuid4()
    assert dependency_option([(a, JobState.RUNNING, 7), (b, JobState.PENDING, 3)]) == "afterok:3:7"
    assert dependency_option([(a, JobState.COMPLETED, 7), (b, JobState.PENDING, 3)]) == "afterok:3"
    assert dependency_option([(a, JobState.COMPLETED, 7)]) == ""
    with pytest.raises(SlurmRejected, match=f"Job {b}, which this job waits for, ended TIMEOUT"):
        dependency_option([(a, JobState.RUNNING, 7), (b, JobState.TIMEOUT, 3)])


def test_the_form_takes_job_ids_separated_by_commas_or_spaces():
    from jobs.forms import JobIdsField

    a, b = uuid.uuid4(), uuid.uuid4()
    assert JobIdsField(required=False).clean(f"{a}, {b}\n{a}") == [a, b]
    assert JobIdsField(required=False).clean("") == []
    with pytest.raises(Exception, match="is not a job id"):
        JobIdsField(required=False).clean("12")


def test_a_parent_cancelled_before_slurm_fails_its_waiting_child_with_the_reason(world, inventory, relays):
    from jobs.services import job_cancel, job_relay_drain_run

    parent = _job(world)
    child = _job(world, "child", depends_on=[parent.pk])
    job_cancel(user=world.alice, job=parent)
    result = job_relay_drain_run(limit=10)  # the child is claimed now (its parent waits no more) and refused
    child.refresh_from_db()
    assert result["submit_failed"] == 1 and result["submitted"] == 0
    assert (child.state, child.slurm_job_id) == (JobState.SUBMIT_FAILED, None)
    assert child.state_reason == f"Job {parent.pk}, which this job waits for, ended CANCELLED: it can never start."
