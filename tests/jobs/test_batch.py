"""Batch submission (POST /api/v1/jobs/ with an array) and the batched relay (job_relay_batch_run): all or
none with errors by index, one budget check and one relay drain (as one job), idempotent replays; the relay
submits each job exactly once on the real cluster, records a rejection for that job only, adopts
after a crash, in a number of queries that does not grow with the batch."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from accounting.models import BudgetHold, BudgetTotal, Quota
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services import job_relay_batch_run, job_submit_batch
from portal.exceptions import Conflict
from portal.models import AuditEvent
from portal.slurm import get_gateway
from tests.support import job_payload, relay_crashed_after_sbatch, slurm_cancel_tagged, slurm_tag_counts

pytestmark = pytest.mark.django_db


@pytest.fixture
def batch_relays(monkeypatch):
    """Record batched relay enqueues instead of running them."""
    from jobs import tasks

    calls: list[list[str]] = []
    monkeypatch.setattr(tasks.job_relay_batch, "delay", lambda job_ids: calls.append(list(job_ids)))
    return calls


def _client(api_client_for):
    return api_client_for("member")  # alice, member of vision


# ---------------------------------------------------------------- the API


def test_batch_submit_creates_all_jobs_with_one_relay_and_one_audit_event(
    api_client_for, inventory, relays, batch_relays, django_capture_on_commit_callbacks
):
    body = [job_payload(name=f"b-{i}", gpus=1) for i in range(5)]
    with django_capture_on_commit_callbacks(execute=True):
        response = _client(api_client_for).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    rows = response.json()
    assert [r["name"] for r in rows] == [f"b-{i}" for i in range(5)]
    assert {r["state"] for r in rows} == {"ACCEPTED"}
    assert Job.objects.count() == 5 and JobEvent.objects.filter(state=JobState.ACCEPTED).count() == 5
    # one job is a batch of one: a batch enqueues the relay drain, as a single job does (issue 29)
    assert relays["drain"] == [None] and batch_relays == [] and relays["relay"] == []
    audit = AuditEvent.objects.filter(action="job.submit_batch")
    assert audit.count() == 1 and audit.get().data["count"] == 5


def test_batch_validation_errors_are_keyed_by_index_and_nothing_is_stored(api_client_for, inventory, batch_relays):
    client = _client(api_client_for)
    # rules and inventory (the single submit's validation, per job)
    body = [job_payload(name="ok"), job_payload(gpus=99), job_payload(name="ok2"), job_payload(partition="nope", name="a b")]
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert set(errors) == {"1", "3"}
    assert "gpus" in errors["1"] and set(errors["3"]) == {"partition", "name"}
    # the input types (checked first, as for a single submit)
    response = client.post("/api/v1/jobs/", [job_payload(), job_payload(gpus="x")], format="json")
    assert response.status_code == 400 and set(response.json()["errors"]) == {"1"} and "gpus" in response.json()["errors"]["1"]
    assert Job.objects.count() == 0 and batch_relays == []


def test_batch_of_two_teams_or_too_many_or_not_a_list_is_400(api_client_for, inventory, batch_relays):
    client = _client(api_client_for)
    two = client.post("/api/v1/jobs/", [job_payload(), job_payload(team="nlp")], format="json")
    assert two.status_code == 400 and "team" in two.json()["errors"]
    many = client.post("/api/v1/jobs/", [job_payload()] * 101, format="json")
    assert many.status_code == 400 and "jobs" in many.json()["errors"]
    empty = client.post("/api/v1/jobs/", [], format="json")
    assert empty.status_code == 400 and "jobs" in empty.json()["errors"]
    scalar = client.post("/api/v1/jobs/", ["not a job"], format="json")
    assert scalar.status_code == 400 and "non_field_errors" in scalar.json()["errors"]["0"]
    assert Job.objects.count() == 0


def test_batch_idempotent_replay_returns_the_same_jobs_and_another_body_is_409(api_client_for, inventory, relays, batch_relays):
    client = _client(api_client_for)
    body = [job_payload(name=f"i-{i}", gpus=1) for i in range(3)]
    first = client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="batch-key-1")
    again = client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="batch-key-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert [r["id"] for r in again.json()] == [r["id"] for r in first.json()]
    other = client.post("/api/v1/jobs/", body[:2], format="json", HTTP_IDEMPOTENCY_KEY="batch-key-1")
    assert other.status_code == 409
    single = client.post("/api/v1/jobs/", job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="batch-key-1")
    assert single.status_code == 409
    assert Job.objects.count() == 3


def test_batch_budget_is_checked_once_for_the_sum(world, inventory, batch_relays):
    """One placement for the batch: each job gets its hold, every quota is checked for the sum, and a
    batch that does not fit as a whole stores nothing."""
    Quota.objects.filter(team=world.vision).update(gpu_hours=5)
    spec = {"script": "true", "partition": "gpu", "gpu_type": "a100", "gpus": 2, "time_limit_minutes": 30}
    jobs, created = job_submit_batch(user=world.alice, team=world.vision, jobs=[{"name": f"s-{i}", **spec} for i in range(4)])
    assert created and len(jobs) == 4
    assert sorted(BudgetHold.objects.values_list("job_uuid", flat=True)) == sorted(j.pk for j in jobs)
    assert BudgetTotal.objects.get(team=world.vision, gpu_type="").held_gpu_hours == 4  # 4 jobs × 2 GPUs × 0.5 h
    with pytest.raises(Conflict) as exc:
        job_submit_batch(user=world.alice, team=world.vision, jobs=[{"name": f"t-{i}", **spec} for i in range(2)])
    assert "needs 2.0 GPU-h; 1.0 of 5.0 GPU-h left" in exc.value.message
    assert Job.objects.count() == BudgetHold.objects.count() == 4
    assert BudgetTotal.objects.get(team=world.vision, gpu_type="").held_gpu_hours == 4


# ---------------------------------------------------------------- the batched relay


def _accepted(world, n: int, *, script="#!/bin/bash\nsleep 60\n") -> list[Job]:
    jobs, _ = job_submit_batch(
        user=world.alice, team=world.vision,
        jobs=[{"name": f"rb-{i}", "script": script, "partition": "debug", "gpus": 1, "time_limit_minutes": 2} for i in range(n)],
    )  # fmt: skip
    return jobs


def _assert_each_in_slurm_once(jobs) -> None:
    """Slurm holds every one of the jobs, each exactly once (by the tag the relay gives it)."""
    counts = slurm_tag_counts(jobs)
    assert len(counts) == len(jobs) and set(counts.values()) == {1}


@contextmanager
def _relayed(jobs):
    """job_relay_batch_run over the jobs (its result); then every Slurm job with their tags is cancelled
    (a crashed relay's leftover too)."""
    try:
        yield job_relay_batch_run([str(j.pk) for j in jobs])
    finally:
        slurm_cancel_tagged(jobs)


@pytest.mark.slurm
def test_batched_relay_submits_each_job_exactly_once(cluster, batch_relays):
    jobs = _accepted(cluster, 12)
    with _relayed(jobs) as result:
        again = job_relay_batch_run([str(j.pk) for j in jobs])  # a redelivery does nothing
        assert result["submitted"] == 12 and again["claimed"] == 0
        rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
        assert {r.state for r in rows} == {JobState.PENDING} and all(r.slurm_job_id for r in rows)
        assert all(r.relay_token is None and r.relay_attempts == 1 for r in rows)
        _assert_each_in_slurm_once(jobs)
        assert JobEvent.objects.filter(job__in=jobs, state=JobState.PENDING).count() == 12


@pytest.mark.slurm
def test_batched_relay_records_a_rejection_for_that_job_only(cluster, batch_relays):
    jobs = _accepted(cluster, 4)
    bad = jobs[2]
    # Slurm refuses this one (the relay sends the job's stored request)
    request = Job.objects.get(pk=bad.pk).request
    for key in ("command_line", "options"):
        request[key] = [[o, "no-such-partition" if o == "partition" else v] for o, v in request[key]]
    Job.objects.filter(pk=bad.pk).update(partition="no-such-partition", request=request)
    with _relayed(jobs) as result:
        assert (result["submitted"], result["submit_failed"]) == (3, 1)
        bad.refresh_from_db()
        assert bad.state == JobState.SUBMIT_FAILED and bad.slurm_job_id is None
        assert "partition" in bad.state_reason.lower() and bad.last_relay_error
        assert JobEvent.objects.filter(job=bad, state=JobState.SUBMIT_FAILED).count() == 1
        others = Job.objects.filter(pk__in=[j.pk for j in jobs if j.pk != bad.pk])
        assert {o.state for o in others} == {JobState.PENDING}


@pytest.mark.slurm
def test_batched_relay_after_a_crash_following_sbatch_adopts_instead_of_duplicating(cluster, batch_relays):
    jobs = _accepted(cluster, 3)
    crashed = jobs[0]
    first_id = relay_crashed_after_sbatch(crashed)
    with _relayed(jobs) as result:
        assert (result["adopted"], result["submitted"]) == (1, 2)
        crashed.refresh_from_db()
        assert (crashed.slurm_job_id, crashed.state, crashed.relay_attempts) == (first_id, JobState.PENDING, 2)
        _assert_each_in_slurm_once(jobs)


def test_batched_relay_query_count_does_not_grow_with_the_batch(world, inventory, batch_relays, monkeypatch, settings, django_assert_max_num_queries):
    # A fake submit only for this count: the queries are the subject, not Slurm.
    settings.SLURM_SUBMIT_AS_USER = False
    gateway = get_gateway()
    ids = iter(range(900_000, 901_000))
    monkeypatch.setattr(type(gateway), "submit", lambda self, spec: next(ids))
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def batch(n):
        jobs, _ = job_submit_batch(
            user=world.alice, team=world.vision,
            jobs=[{"name": f"q-{i}", "script": "true", "partition": "gpu", "gpus": 1, "time_limit_minutes": 5} for i in range(n)],
        )  # fmt: skip
        return [str(j.pk) for j in jobs]

    small = batch(2)
    with CaptureQueriesContext(connection) as captured:
        assert job_relay_batch_run(small)["submitted"] == 2
    large = batch(20)
    with django_assert_max_num_queries(len(captured.captured_queries)):
        assert job_relay_batch_run(large)["submitted"] == 20
    assert Job.objects.filter(pk__in=large, state=JobState.PENDING).count() == 20


def test_batch_submit_reads_the_inventory_once_per_batch(world, inventory, batch_relays, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def batch(n):
        return [{"name": f"c-{i}", "script": "true", "partition": "gpu", "gpu_type": "a100", "gpus": 1, "time_limit_minutes": 5} for i in range(n)]

    with CaptureQueriesContext(connection) as captured:
        job_submit_batch(user=world.alice, team=world.vision, jobs=batch(2))
    with django_assert_max_num_queries(len(captured.captured_queries)):
        job_submit_batch(user=world.alice, team=world.vision, jobs=batch(20))
    assert Job.objects.count() == 22
