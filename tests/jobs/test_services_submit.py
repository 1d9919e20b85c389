"""job_submit through POST /api/v1/jobs/: every validation failure names its field and stores and
enqueues nothing; idempotent replays; normalisation; estimates."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.db import connection

from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services import job_quote, job_submit
from portal.exceptions import ApplicationError
from tests.support import job_payload

URL = "/api/v1/jobs/"
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"partition": "nope"}, "partition"),
        ({"gpu_type": "v100"}, "gpu_type"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": "many"}, "gpus"),
        ({"gpus": 5}, "gpus"),  # 4 a100 per node
        ({"gpus": 3, "nodes": 2}, "gpus"),  # not divisible
        ({"gpus": 6, "nodes": 3}, "nodes"),  # only 2 a100 nodes
        ({"cpus_per_gpu": 20}, "cpus_per_gpu"),  # 2 × 20 > 32 CPUs
        ({"memory_gb": 1000}, "memory_gb"),
        ({"time_limit_minutes": 4321}, "time_limit_minutes"),  # gpu MaxTime 72 h
        ({"partition": "debug", "time_limit_minutes": 61}, "time_limit_minutes"),
        ({"time_limit_minutes": 0}, "time_limit_minutes"),
        ({"script": ""}, "script"),
        ({"script": "   \n"}, "script"),
        ({"script": "echo a\x00b"}, "script"),
        ({"script": "#!/bin/bash\n" + "x" * (1024 * 1024)}, "script"),
        ({"name": "has space"}, "name"),
        ({"name": "x" * 129}, "name"),
        ({"environment": {"1BAD": "x"}}, "environment"),
        ({"environment": {"OK": "a\x00b"}}, "environment"),
        ({"environment": {f"V{i}": "x" for i in range(65)}}, "environment"),
        ({"workdir": "relative/dir"}, "workdir"),
        ({"workdir": "/tmp/%u"}, "workdir"),
        ({"team": "nlp"}, "team"),  # alice is not in nlp: answered as if it did not exist
        ({"team": "no-such-team"}, "team"),
    ],
)
def test_invalid_submission_is_400_naming_the_field_and_stores_nothing(
    api_client_for, inventory, relays, django_capture_on_commit_callbacks, overrides, field
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api_client_for("member").post(URL, job_payload(**overrides), format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert field in body["errors"], body
    assert body["detail"]
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0
    assert callbacks == [] and relays["drain"] == []


def test_foreign_and_missing_team_get_the_same_answer(api_client_for, inventory, relays):
    foreign = api_client_for("member").post(URL, job_payload(team="nlp"), format="json").json()
    missing = api_client_for("member").post(URL, job_payload(team="zzz"), format="json").json()
    assert foreign == missing == {"detail": "No such team.", "errors": {"team": ["No such team."]}}


def test_empty_inventory_says_it_was_not_read_yet(api_client_for, world, relays):
    response = api_client_for("member").post(URL, job_payload(), format="json")
    assert response.status_code == 400
    assert "inventory has not been read yet" in response.json()["errors"]["partition"][0]


def test_valid_submission_is_stored_accepted_with_an_event_and_relay_enqueued(
    api_client_for, world, inventory, relays, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for("member").post(URL, job_payload(), format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    job = Job.objects.get(pk=data["id"])
    assert (job.state, job.team, job.submitter, job.gpus, job.gpu_type) == (JobState.ACCEPTED, world.vision, world.alice, 2, "a100")
    assert list(job.events.values_list("state", flat=True)) == [JobState.ACCEPTED]
    assert relays["drain"] == [None] and relays["relay"] == []  # the drain relays it (group commit)
    assert data["estimated_gpu_hours"] == "1.00"  # 2 GPUs × 30 min
    assert data["links"] == {
        "self": f"/api/v1/jobs/{job.pk}/",
        "cancel": f"/api/v1/jobs/{job.pk}/cancel/",
        "output": f"/api/v1/jobs/{job.pk}/output/",
    }


def test_a_jobs_links_follow_the_prefix_the_portal_is_mounted_on(api_client_for, world, inventory, relays):
    """The links are reversed once per URL prefix (jobs.apis._job_link_templates), not once for all:
    a portal behind /gpu/ (SCRIPT_NAME) links under /gpu/, and the same process without a prefix not."""
    from django.urls import set_script_prefix

    client = api_client_for("member")
    set_script_prefix("/gpu/")  # what Django's WSGI handler does for SCRIPT_NAME=/gpu (the test client does not)
    try:
        mounted = client.post(URL, job_payload(), format="json").json()
    finally:
        set_script_prefix("/")
    plain = client.post(URL, job_payload(), format="json").json()
    assert mounted["links"]["cancel"] == f"/gpu/api/v1/jobs/{mounted['id']}/cancel/"
    assert plain["links"]["output"] == f"/api/v1/jobs/{plain['id']}/output/"
    assert mounted["id"] != plain["id"]


def test_script_without_shebang_gets_bash_and_defaults_come_from_the_partition(world, inventory, relays, settings):
    settings.JOB_DEFAULT_WORKDIR = "/scratch"
    job, created = job_submit(
        user=world.alice, team=world.vision, name="t", script="echo hi\r\n", partition="debug", gpu_type="",
        gpus=1, nodes=1, cpus_per_gpu=1, memory_gb=None, time_limit_minutes=None,
    )  # fmt: skip
    assert created
    assert job.script == "#!/bin/bash\necho hi\n"
    assert job.time_limit_minutes == 10  # debug DefaultTime
    assert job.workdir == "/scratch"


def test_same_idempotency_key_and_body_returns_the_same_job(api_client_for, inventory, relays, django_capture_on_commit_callbacks):
    client = api_client_for("member")
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(URL, job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
        # same content, other key order: the same request
        second = client.post(URL, dict(reversed(list(job_payload().items()))), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.count() == 1
    assert len(relays["drain"]) == 1


def test_same_idempotency_key_with_another_body_is_409(api_client_for, inventory, relays):
    client = api_client_for("member")
    assert client.post(URL, job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="k-2").status_code == 201
    response = client.post(URL, job_payload(gpus=1), format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert response.status_code == 409
    assert "idempotency_key" in response.json()["errors"]
    assert Job.objects.count() == 1


def test_idempotency_keys_belong_to_their_user(api_client_for, inventory, relays):
    a = api_client_for("member").post(URL, job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="shared")
    b = api_client_for("manager").post(URL, job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="shared")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_submissions_with_one_key_create_exactly_one_job(world, inventory, relays):
    barrier = threading.Barrier(20)

    def submit(_):
        try:
            barrier.wait()
            job, created = job_submit(
                user=world.alice, team=world.vision, name="race", script="true", partition="gpu", gpu_type="a100",
                gpus=1, nodes=1, cpus_per_gpu=1, memory_gb=None, time_limit_minutes=5, idempotency_key="race-key",
            )  # fmt: skip
            return job.pk, created
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(submit, range(20)))
    assert len({pk for pk, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Job.objects.count() == 1
    assert len(relays["drain"]) == 1


def _blind_first_replay_lookup(monkeypatch) -> list:
    """The race the unique constraint on (submitter, key) judges, made certain: job_submit's first
    look-up for the key finds nothing (as when the other request had not committed yet), so its
    INSERT meets the other job's key; the look-up after the IntegrityError is the real one."""
    from jobs.services import submit

    real, calls = submit._idempotent_replay, []

    def first_blind(**kwargs):
        calls.append(kwargs["key"])
        return None if len(calls) == 1 else real(**kwargs)

    monkeypatch.setattr(submit, "_idempotent_replay", first_blind)
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_key_taken_before_the_insert_is_djangos_integrity_error_rolled_back_whole_and_replayed(world, inventory, relays,
                                                                                                 monkeypatch):  # fmt: skip
    """The unique violation of the job's INSERT is Django's IntegrityError, inside the submission's
    own transaction: nothing of the second submission stays (no event, audit row or budget hold),
    the first job comes back (created=False), and the connection serves the next statement."""
    from accounting.models import BudgetHold
    from portal.models import AuditEvent

    spec = dict(user=world.alice, team=world.vision, name="late", script="true", partition="gpu", gpu_type="a100",
                gpus=1, time_limit_minutes=5, idempotency_key="late-key")  # fmt: skip
    first, created = job_submit(**spec)
    assert created
    counts = (Job.objects.count(), JobEvent.objects.count(), AuditEvent.objects.count(), BudgetHold.objects.count())
    calls = _blind_first_replay_lookup(monkeypatch)
    again, created = job_submit(**spec)
    assert (again.pk, created, calls) == (first.pk, False, ["late-key", "late-key"])
    assert (Job.objects.count(), JobEvent.objects.count(), AuditEvent.objects.count(), BudgetHold.objects.count()) == counts


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_a_key_taken_before_the_insert_with_the_first_job_and_serves_the_next_post(
    api_client_for, inventory, relays, monkeypatch
):
    client = api_client_for("member")
    first = client.post(URL, job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="late-api")
    assert first.status_code == 201
    _blind_first_replay_lookup(monkeypatch)
    again = client.post(URL, job_payload(), format="json", HTTP_IDEMPOTENCY_KEY="late-api")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    assert client.post(URL, job_payload(gpus=1), format="json", HTTP_IDEMPOTENCY_KEY="late-api").status_code == 409
    assert client.post(URL, job_payload(), format="json").status_code == 201  # the connection goes on
    assert Job.objects.count() == 2


def test_quote_uses_the_rate_and_the_dearest_type_when_any_will_do(world, inventory):
    from accounting.models import Rate

    day = dt.date(2020, 1, 1)
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), currency="CNY", effective_from=day)
    Rate.objects.create(gpu_type="h100", price_per_gpu_hour=Decimal("25"), currency="CNY", effective_from=day)
    typed = job_quote(partition="gpu", gpu_type="a100", gpus=2, time_limit_minutes=90)
    assert (typed.gpu_hours, typed.cost, typed.currency, typed.gpu_type_assumed) == (Decimal("3.00"), Decimal("30.00"), "CNY", False)
    anytype = job_quote(partition="gpu", gpu_type="", gpus=2, time_limit_minutes=90)
    assert (anytype.gpu_type, anytype.cost, anytype.gpu_type_assumed) == ("h100", Decimal("75.00"), True)
    assert "most expensive" in anytype.note


def test_quote_without_rate_has_no_cost(world, inventory):
    quote = job_quote(partition="gpu", gpu_type="a100", gpus=4, time_limit_minutes=60)
    assert quote.gpu_hours == Decimal("4.00") and quote.cost is None


def test_quote_validates_like_submit(world, inventory):
    with pytest.raises(ApplicationError) as exc:
        job_quote(partition="gpu", gpu_type="a100", gpus=9, time_limit_minutes=60)
    assert "gpus" in exc.value.errors


def test_submission_stores_the_cost_estimate(api_client_for, inventory, relays):
    from accounting.models import Rate

    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("12.5"), currency="CNY", effective_from=dt.date(2020, 1, 1))
    data = api_client_for("member").post(URL, job_payload(gpus=4, time_limit_minutes=120), format="json").json()
    assert (data["estimated_gpu_hours"], data["estimated_cost"], data["currency"]) == ("8.00", "100.00", "CNY")


def test_the_default_fingerprint_is_every_field_as_given(world, inventory, relays):
    """job_submit's fingerprint without one given is the hash of every spec field as given (None:
    the script decides), the team, the booking and idle_exempt: the same request replays, another
    value of any field is a 409. No field is left out when empty (the shim that kept fingerprints of
    keys stored before cluster, submit_dir and depends_on existed is gone, issue 38)."""
    from jobs.job_fields import given_fields
    from jobs.services import SPEC_FIELD_NAMES, request_fingerprint
    from portal.exceptions import Conflict

    given = {"name": "fp", "script": "true", "partition": "gpu", "gpu_type": "a100", "gpus": 1, "time_limit_minutes": 5}
    job, created = job_submit(user=world.alice, team=world.vision, idempotency_key="fp-key", **given)
    assert created
    every = given_fields(SPEC_FIELD_NAMES, given, what="test")  # the rest at their empty value
    hashed = {"team": world.vision.pk, **every, "booking": "", "idle_exempt": False}
    assert {"cluster", "submit_dir", "depends_on"} <= set(hashed)
    assert job.request_fingerprint == request_fingerprint(hashed)
    again, created = job_submit(user=world.alice, team=world.vision, idempotency_key="fp-key", **given)
    assert (again.pk, created) == (job.pk, False)
    for changed in ({"memory_gb": 4}, {"submit_dir": "/tmp"}, {"idle_exempt": True}):
        with pytest.raises(Conflict):
            job_submit(user=world.alice, team=world.vision, idempotency_key="fp-key", **{**given, **changed})
    assert Job.objects.count() == 1


def test_an_unknown_spec_field_is_a_type_error_as_an_unknown_keyword_was(world, inventory, relays):
    with pytest.raises(TypeError, match="gpu_count"):
        job_submit(user=world.alice, team=world.vision, script="true", partition="gpu", gpu_count=1)
    with pytest.raises(TypeError, match="qos"):
        job_quote(partition="gpu", gpus=1, qos="high")  # the quote takes the shape only
    assert Job.objects.count() == 0
