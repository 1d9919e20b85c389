"""Quotas: request / approve / reject / supersede with audit, the budget check at submission (API and
form, 409 with the numbers), held / used / booked figures, the no-quota policy, alerts (email once
per threshold, webhook), the budget API and pages, the permission matrix, Slurm limit drift (fake
gateway) and period roll-over."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import uuid
from decimal import Decimal

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from accounting import selectors, services
from accounting.models import BudgetAlert, BudgetHold, Quota, QuotaState, UsageRecord
from accounting.services import usage_records_upsert
from jobs.choices import JobState
from jobs.models import Job
from portal.exceptions import ApplicationError, Conflict
from portal.models import AuditEvent, NodeInfo, PartitionInfo, Role, SyncStatus
from portal.slurm import AssociationLimits
from tests.accounting.helpers import acct
from tests.factories import MembershipFactory, QuotaFactory, TeamFactory, UserFactory
from tests.fakes import FakeGateway
from tests.support import job_payload

pytestmark = pytest.mark.django_db


@pytest.fixture
def inventory(db):
    """The local cluster's shape (as tests/jobs/conftest.py): gpu and debug on 2×4 a100 + 1×4 h100."""
    now = timezone.now()
    names = ["a100-01", "a100-02", "h100-01"]
    PartitionInfo.objects.create(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320, node_names=names, seen_at=now)
    PartitionInfo.objects.create(name="debug", is_default=False, state="UP", default_time_minutes=10, max_time_minutes=60, node_names=names, seen_at=now)
    for name in names:
        NodeInfo.objects.create(name=name, state="IDLE", partitions=["gpu", "debug"], gpu_type=name.split("-")[0],
                                gpus_total=4, cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip


@pytest.fixture
def relays(monkeypatch):
    from jobs import tasks

    calls = []
    monkeypatch.setattr(tasks.job_relay_drain, "delay", lambda: calls.append(None))
    return calls


def around_today(days: int = 10) -> tuple[dt.date, dt.date]:
    today = selectors.billing_date(timezone.now())
    return today - dt.timedelta(days=days), today + dt.timedelta(days=days)


def quota(team, gpu_hours, *, gpu_type="", max_gpus=None, period=None):
    start, end = period or around_today()
    return QuotaFactory(team=team, gpu_hours=gpu_hours, gpu_type=gpu_type, max_gpus=max_gpus, period_start=start, period_end=end)


def used(account="vision", *, hours=1.0, gpus=2, gpu_type="a100", comment=""):
    """Ingest a finished job of ``gpus`` × ``hours`` that ended a minute ago."""
    start = timezone.now() - dt.timedelta(hours=hours, minutes=1)
    usage_records_upsert(records=[acct(account=account, start=start, hours=hours, gpus=gpus, gpu_type=gpu_type, comment=comment)])


def submit(client, **overrides):
    return client.post("/api/v1/jobs/", job_payload(**overrides), format="json")


# ---------------------------------------------------------------- request, approve, reject, supersede


def test_manager_requests_admin_approves_and_a_newer_approval_supersedes(world):
    start, end = dt.date(2030, 1, 1), dt.date(2030, 2, 1)
    first = services.quota_request(team=world.vision, user=world.bob, gpu_hours=100, period_start=start,
                                   justification="ICCV deadline")  # fmt: skip
    assert (first.state, first.period_end, first.period_label) == (QuotaState.REQUESTED, end, "2030-01")
    services.quota_approve(quota=first, user=world.admin, comment="ok")
    second = services.quota_request(team=world.vision, user=world.bob, gpu_hours=150, period_start=start,
                                    max_gpus=4, justification="more")  # fmt: skip
    services.quota_approve(quota=second, user=world.admin)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == QuotaState.SUPERSEDED and first.superseded_by_id == second.pk
    assert second.state == QuotaState.APPROVED and second.decided_by == world.admin and second.approved_at
    actions = list(AuditEvent.objects.filter(target_type="accounting.quota").order_by("pk").values_list("action", "actor_name"))
    assert actions == [("quota.request", "bob"), ("quota.approve", "admin"), ("quota.request", "bob"),
                       ("quota.supersede", "admin"), ("quota.approve", "admin")]  # fmt: skip
    in_force = selectors.quotas_effective(team=world.vision, at=dt.datetime(2030, 1, 15, tzinfo=dt.UTC))
    assert in_force[(world.vision.pk, "")].pk == second.pk


def test_only_managers_request_only_admins_decide_and_rejection_needs_a_reason(world):
    with pytest.raises(ApplicationError) as exc:
        services.quota_request(team=world.vision, user=world.alice, gpu_hours=10, justification="x")
    assert exc.value.status_code == 403
    q = services.quota_request(team=world.vision, user=world.bob, gpu_hours=10, justification="x")
    with pytest.raises(ApplicationError) as exc:
        services.quota_approve(quota=q, user=world.bob)
    assert exc.value.status_code == 403
    with pytest.raises(ApplicationError) as exc:
        services.quota_reject(quota=q, user=world.admin, comment=" ")
    assert "comment" in exc.value.errors
    services.quota_reject(quota=q, user=world.admin, comment="too much")
    q.refresh_from_db()
    assert (q.state, q.decision_comment) == (QuotaState.REJECTED, "too much")
    with pytest.raises(Conflict):
        services.quota_approve(quota=q, user=world.admin)


def test_request_validates_fields(world, inventory):
    with pytest.raises(ApplicationError) as exc:
        services.quota_request(team=world.vision, user=world.bob, gpu_hours=-1, gpu_type="v100", max_gpus=-2,
                               period_start=dt.date(2030, 2, 1), period_end=dt.date(2030, 1, 1), justification="")  # fmt: skip
    assert set(exc.value.errors) == {"gpu_hours", "gpu_type", "max_gpus", "period_end", "justification"}


# ---------------------------------------------------------------- enforcement at submission


def test_over_budget_submission_is_409_with_the_numbers_beside_the_fields(world, inventory, relays, api_client_for):
    quota(world.vision, 10)
    used(hours=1.0, gpus=2)  # 2 GPU-h used
    client = api_client_for("member")
    assert submit(client, gpus=2, time_limit_minutes=120).status_code == 201  # holds 4 GPU-h: 4 left
    response = submit(client, gpus=4, time_limit_minutes=120)  # needs 8
    assert response.status_code == 409
    body = response.json()
    assert "needs 8.0 GPU-h; 4.0 of 10.0 GPU-h left for vision" in body["detail"]
    assert "used 2.0, held by unfinished jobs 4.0, booked 0.0" in body["detail"]
    assert set(body["errors"]) == {"gpus", "time_limit_minutes"}
    assert Job.objects.count() == 1
    assert submit(client, gpus=2, time_limit_minutes=120).status_code == 201  # exactly 4: fits


def test_calendar_month_quota_names_the_month(world, inventory, relays, api_client_for):
    start, end = selectors.current_month()
    quota(world.vision, 1, period=(start, end))
    response = submit(api_client_for("member"), gpus=2, time_limit_minutes=60)
    assert response.status_code == 409
    assert f"left for vision in {start:%Y-%m}" in response.json()["detail"]


def test_type_budget_applies_to_jobs_of_that_type_and_the_any_type_budget_to_all(world, inventory, relays, api_client_for):
    quota(world.vision, 1000)
    quota(world.vision, 2, gpu_type="a100")
    client = api_client_for("member")
    refused = submit(client, gpu_type="a100", gpus=4, time_limit_minutes=60)
    assert refused.status_code == 409 and "of 2.0 a100 GPU-h left" in refused.json()["detail"]
    assert submit(client, gpu_type="h100", gpus=4, time_limit_minutes=60).status_code == 201
    # no type: it could land on a100, so the a100 budget must have room for it too (issue 33)
    untyped = submit(client, gpu_type="", gpus=4, time_limit_minutes=60)
    assert untyped.status_code == 409 and "of 2.0 a100 GPU-h left" in untyped.json()["detail"]
    assert submit(client, gpu_type="", gpus=1, time_limit_minutes=60).status_code == 201  # fits both


def test_without_quota_blocked_policy_tells_the_manager_to_request_one(world, inventory, relays, api_client_for, settings):
    Quota.objects.filter(team=world.vision).update(state=QuotaState.CANCELLED)
    response = submit(api_client_for("member"))
    assert response.status_code == 409
    month = selectors.current_month()[0]
    assert response.json()["detail"] == (
        f"vision has no approved GPU quota for {month:%Y-%m}: a team manager can request one at /accounting/quotas/"
    )
    settings.QUOTA_NO_QUOTA_POLICY = "unlimited"
    assert submit(api_client_for("member")).status_code == 201


def test_ended_job_holds_until_its_usage_is_ingested_then_real_usage_counts(world, inventory, relays, api_client_for):
    quota(world.vision, 10)
    client = api_client_for("member")
    job_id = submit(client, gpus=4, time_limit_minutes=120).json()["id"]  # holds 8
    row = selectors.team_budget(team=world.vision)[0]
    assert (row["held"], row["used"], row["remaining"]) == (Decimal("8.00"), Decimal("0.00"), Decimal("2.00"))
    now = timezone.now()
    Job.objects.filter(pk=job_id).update(state=JobState.COMPLETED, started_at=now - dt.timedelta(minutes=30), ended_at=now)
    row = selectors.team_budget(team=world.vision)[0]
    assert row["held"] == Decimal("8.00")  # ended, not ingested yet: still held
    used(hours=0.5, gpus=4, comment=f"gpuportal:{job_id}")  # its real usage: 2 GPU-h
    assert UsageRecord.objects.get().portal_job_uuid == uuid.UUID(job_id)
    row = selectors.team_budget(team=world.vision)[0]
    assert (row["held"], row["used"], row["remaining"]) == (Decimal("0.00"), Decimal("2.00"), Decimal("8.00"))


def test_running_job_holds_its_estimate_minus_what_was_ingested_so_far(world, inventory, relays, api_client_for):
    quota(world.vision, 100)
    job_id = submit(api_client_for("member"), gpus=2, time_limit_minutes=240).json()["id"]  # 8
    Job.objects.filter(pk=job_id).update(state=JobState.RUNNING, started_at=timezone.now() - dt.timedelta(hours=1))
    usage_records_upsert(records=[acct(account="vision", start=timezone.now() - dt.timedelta(hours=1), hours=None, gpus=2,
                                       comment=f"gpuportal:{job_id}")])  # fmt: skip
    row = selectors.team_budget(team=world.vision)[0]
    assert row["used"] + row["held"] == Decimal("8.00")
    assert row["used"] > Decimal("1.9")


def test_only_a_final_usage_record_releases_the_jobs_budget_hold(world, inventory, relays, api_client_for):
    """The job's BudgetHold (accounting's row): lowered by a running job's provisional record, released
    by the final one — written by the ingestion, nothing written to the job."""
    quota(world.vision, 100)
    job_id = submit(api_client_for("member"), gpus=2, time_limit_minutes=240).json()["id"]
    start = timezone.now() - dt.timedelta(hours=1)
    Job.objects.filter(pk=job_id).update(state=JobState.RUNNING, started_at=start)
    usage_records_upsert(records=[acct(account="vision", start=start, hours=None, gpus=2, job_id=4242, comment=f"gpuportal:{job_id}")])
    hold = BudgetHold.objects.get(pk=job_id)
    assert hold.released_at is None and hold.held_gpu_hours == Decimal("6")  # 8 estimated − 2 so far
    Job.objects.filter(pk=job_id).update(state=JobState.COMPLETED, ended_at=timezone.now())
    usage_records_upsert(records=[acct(account="vision", start=start, hours=1, gpus=2, job_id=4242, comment=f"gpuportal:{job_id}")])
    hold.refresh_from_db()
    assert UsageRecord.objects.count() == 1 and hold.released_at is not None and hold.held_gpu_hours == 0
    assert selectors.team_budget(team=world.vision)[0]["held"] == Decimal("0.00")


def test_submission_form_shows_the_budget_error_beside_the_fields_and_keeps_input(world, inventory, relays, client_for):
    quota(world.vision, 1)
    data = {"team": "vision", "name": "big-run", "partition": "gpu", "gpu_type": "a100", "gpus": "4", "nodes": "1",
            "cpus_per_gpu": "1", "memory_gb": "", "time_limit_minutes": "120", "script": "#!/bin/bash\necho hi\n",
            "workdir": "", "environment": "", "idempotency_key": "k-budget"}  # fmt: skip
    response = client_for("member").post(reverse("jobs:new"), data)
    assert response.status_code == 400  # the form page answers 400 with the errors beside the fields
    form = response.context["form"]
    assert "needs 8.0 GPU-h" in form.errors["gpus"][0]
    assert "time_limit_minutes" in form.errors
    body = response.content.decode()
    assert 'value="big-run"' in body and "Over budget" in body
    assert not Job.objects.exists()


# ---------------------------------------------------------------- alerts


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list = []  # noqa: RUF012 (the handler's class is its only state)

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        _Hook.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    _Hook.received = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Hook.received
    server.shutdown()
    server.server_close()


def test_alerts_fire_once_per_threshold_by_email_and_webhook(world, settings, django_capture_on_commit_callbacks, webhook):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    url, received = webhook
    world.vision.alert_webhook_url = url
    world.vision.save()
    q = quota(world.vision, 10)
    used(hours=1, gpus=4)  # 4 of 10: nothing
    with django_capture_on_commit_callbacks(execute=True):
        assert services.budget_alerts_check() == []
    used(hours=1, gpus=4)  # 8 of 10: 80 %
    with django_capture_on_commit_callbacks(execute=True):
        assert [a.threshold for a in services.budget_alerts_check()] == [80]
    with django_capture_on_commit_callbacks(execute=True):
        assert services.budget_alerts_check() == []  # once
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["bob@example.org"]
    assert "vision reached 80%" in mail.outbox[0].subject
    assert received == [dict(received[0], team="vision", threshold_percent=80, budget_gpu_hours="10.00",
                             consumed_gpu_hours="8.00", quota_id=q.pk)]  # fmt: skip
    used(hours=1, gpus=3)  # 11 of 10
    with django_capture_on_commit_callbacks(execute=True):
        assert [a.threshold for a in services.budget_alerts_check()] == [100]
    assert len(mail.outbox) == 2 and len(received) == 2
    alerts = BudgetAlert.objects.filter(quota=q)
    assert alerts.count() == 2 and all(a.emailed_at and a.webhook_delivered_at for a in alerts)


def test_alert_check_runs_after_each_usage_ingest(world, settings, monkeypatch, django_capture_on_commit_callbacks):
    from accounting import tasks

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    quota(world.nlp, 1)
    records = [acct(account="nlp", start=timezone.now() - dt.timedelta(hours=1, minutes=2), hours=1, gpus=1)]
    monkeypatch.setattr(services, "usage_ingest", lambda cluster=None: usage_records_upsert(records=records, cluster=cluster))
    with django_capture_on_commit_callbacks(execute=True):
        tasks.usage_ingest_task()
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [80, 100]
    assert {m.to[0] for m in mail.outbox} == {"dave@example.org"}


def test_team_budget_ratios_for_metrics(world):
    quota(world.vision, 10)
    quota(world.vision, 4, gpu_type="a100")
    used(hours=1, gpus=2, gpu_type="a100")
    ratios = selectors.team_budget_ratios()
    assert ("vision", "", 0.2) in ratios and ("vision", "a100", 0.5) in ratios
    assert ("nlp", "", 0.0) in ratios


def test_team_budget_ratios_query_count_does_not_grow_with_teams(world, django_assert_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    quota(TeamFactory(slug="extra0"), 10)
    selectors.team_budget_ratios()  # this process's copies (portal.snapshots) read, as in a running portal
    with CaptureQueriesContext(connection) as few:
        assert len(selectors.team_budget_ratios()) == 3
    for n in range(1, 6):
        quota(TeamFactory(slug=f"extra{n}"), 10)
    with django_assert_num_queries(len(few)):  # 1 + 2 per distinct period (here: the world's and ours)
        assert len(selectors.team_budget_ratios()) == 8


# ---------------------------------------------------------------- API


def test_a_cap_beyond_any_cluster_is_a_400_naming_max_gpus_not_a_500(world, api_client_for):
    from accounting.models import QUOTA_MAX_GPUS, Quota

    body = {"team": "vision", "gpu_hours": "120", "gpu_type": "", "justification": "x", "max_gpus": 406488109244790464}
    before = Quota.objects.count()
    response = api_client_for("manager").post("/api/v1/quotas/", body, format="json")  # found by schemathesis: 500
    assert response.status_code == 400 and "max_gpus" in response.json()["errors"], response.json()
    assert Quota.objects.count() == before
    body["max_gpus"] = QUOTA_MAX_GPUS
    assert api_client_for("manager").post("/api/v1/quotas/", body, format="json").status_code == 201


def test_quota_api_create_list_approve_reject(world, api_client_for):
    body = {"team": "vision", "gpu_hours": "120", "gpu_type": "", "justification": "deadline", "max_gpus": 8}
    assert api_client_for("member").post("/api/v1/quotas/", body, format="json").status_code == 403
    assert api_client_for("outsider").post("/api/v1/quotas/", body, format="json").status_code == 400
    created = api_client_for("manager").post("/api/v1/quotas/", body, format="json")
    assert created.status_code == 201, created.json()
    qid = created.json()["id"]
    assert created.json()["state"] == "requested" and created.json()["max_gpus"] == 8
    listing = api_client_for("member").get("/api/v1/quotas/").json()
    assert {r["team"] for r in listing["results"]} == {"vision"} and "count" in listing
    assert {r["team"] for r in api_client_for("finance").get("/api/v1/quotas/").json()["results"]} == {"vision", "nlp"}
    assert api_client_for("outsider").get("/api/v1/quotas/").json()["results"] == []
    assert api_client_for("manager").post(f"/api/v1/quotas/{qid}/approve/", {}, format="json").status_code == 403
    assert api_client_for("outsider").post(f"/api/v1/quotas/{qid}/approve/", {}, format="json").status_code == 404
    reject = api_client_for("admin").post(f"/api/v1/quotas/{qid}/reject/", {}, format="json")
    assert reject.status_code == 400 and "comment" in reject.json()["errors"]
    approved = api_client_for("admin").post(f"/api/v1/quotas/{qid}/approve/", {"comment": "fine"}, format="json")
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    again = api_client_for("admin").post(f"/api/v1/quotas/{qid}/reject/", {"comment": "no"}, format="json")
    assert again.status_code == 409 and set(again.json()) == {"detail", "errors"}


def test_budget_api_figures(world, inventory, relays, api_client_for):
    quota(world.vision, 100, max_gpus=8)
    quota(world.vision, 20, gpu_type="a100")
    used(hours=2, gpus=2)
    submit(api_client_for("member"), gpus=1, time_limit_minutes=60)
    data = api_client_for("member").get("/api/v1/teams/vision/budget/").json()
    assert (data["budget"], data["used"], data["held"], data["booked"], data["remaining"]) == (
        "100.00", "4.00", "1.00", "0.00", "95.00")
    assert [r["gpu_type"] for r in data["rows"]] == ["", "a100"]
    assert data["rows"][1]["remaining"] == "15.00" and data["rows"][0]["max_gpus"] == 8
    assert data["runs_out_on"] is None or dt.date.fromisoformat(data["runs_out_on"])
    assert api_client_for("outsider").get("/api/v1/teams/vision/budget/").status_code == 404


def test_budget_runs_out_date_follows_the_burn_rate(world):
    start = selectors.billing_date(timezone.now()) - dt.timedelta(days=4)
    quota(world.vision, 100, period=(start, start + dt.timedelta(days=30)))
    used(hours=10, gpus=4)  # 40 GPU-h in the 4 days and some hours since the period began
    now = timezone.now()
    row = selectors.team_budget(team=world.vision)[0]
    # the burn rate so far (40 GPU-h over the time since the period's first midnight) spends the
    # 60 GPU-h left in 1.5 × that time: 6 days from now at midnight, 7.5 days at the end of the day
    from accounting.calendar import billing_midnight

    elapsed = now - billing_midnight(start)
    expected = selectors.billing_date(now + elapsed * 1.5)
    assert abs((row["runs_out_on"] - expected).days) <= 1
    assert row["runs_out_on"] > selectors.billing_date(now) + dt.timedelta(days=5)


def test_a_huge_budget_at_a_slow_burn_has_no_run_out_date_and_still_takes_jobs(world, inventory, relays, api_client_for):
    """The run-out date would lie centuries ahead (past what datetime holds): none, and no error."""
    today = selectors.billing_date(timezone.now())
    quota(world.vision, 10**7, period=(today - dt.timedelta(days=366), today + dt.timedelta(days=3650)))
    used(hours=0.01, gpus=1)
    row = selectors.team_budget(team=world.vision)[0]
    assert row["runs_out_on"] is None and row["remaining"] > 10**6
    assert submit(api_client_for("member"), gpus=1, time_limit_minutes=5).status_code == 201


# ---------------------------------------------------------------- pages


def test_budget_page_shows_numbers_and_the_burndown(world, client_for):
    q = quota(world.vision, 50)
    used(hours=1, gpus=4)
    response = client_for("member").get("/accounting/budget/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "chart-burndown" in body and "budget-chart-data" in body and "chart-4.6.1.umd.min.js" in body
    chart = response.context["chart"]
    days = (q.period_end - q.period_start).days
    assert len(chart["labels"]) == days and chart["ideal"][0] == pytest.approx(50 * (days - 1) / days, abs=0.01)
    today_index = (selectors.billing_date(timezone.now()) - q.period_start).days
    assert chart["remaining"][today_index] == 46.0 and chart["remaining"][today_index + 1] is None


def test_quota_pages_request_and_decide(world, client_for):
    assert client_for("member").get("/accounting/quotas/").context["form"] is None
    page = client_for("manager").get("/accounting/quotas/")
    assert page.context["form"] is not None
    bad = client_for("manager").post("/accounting/quotas/", {"team": "vision", "gpu_hours": "10", "justification": ""})
    assert bad.status_code == 400 and "justification" in bad.context["form"].errors
    ok = client_for("manager").post("/accounting/quotas/", {"team": "vision", "gpu_hours": "10", "justification": "paper"})
    assert ok.status_code == 302
    q = Quota.objects.get(state=QuotaState.REQUESTED)
    assert client_for("manager").post(f"/accounting/quotas/{q.pk}/approve/").status_code == 403
    assert client_for("admin").post(f"/accounting/quotas/{q.pk}/approve/", {"comment": "ok"}).status_code == 302
    q.refresh_from_db()
    assert q.state == QuotaState.APPROVED
    assert "Approve</button>" not in client_for("admin").get("/accounting/quotas/?state=approved").content.decode()


ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")
MATRIX = {
    ("GET", "/accounting/quotas/"): (302, 200, 200, 200, 200, 200),
    ("GET", "/accounting/budget/?team=vision"): (302, 404, 200, 200, 200, 200),
    ("POST", "/accounting/quotas/{id}/approve/"): (302, 404, 403, 403, 302, 403),
    ("POST", "/accounting/quotas/{id}/reject/"): (302, 404, 403, 403, 302, 403),
    ("GET", "/api/v1/quotas/"): (401, 200, 200, 200, 200, 200),
    ("POST", "/api/v1/quotas/"): (401, 400, 403, 201, 201, 403),  # finance sees the team, manages none
    ("POST", "/api/v1/quotas/{id}/approve/"): (401, 404, 403, 403, 200, 403),
    ("POST", "/api/v1/quotas/{id}/reject/"): (401, 404, 403, 403, 200, 403),
    ("GET", "/api/v1/teams/vision/budget/"): (401, 404, 200, 200, 200, 200),
}


@pytest.mark.parametrize("method,url", list(MATRIX))
@pytest.mark.parametrize("role", ROLES)
def test_permission_matrix(world, client_for, api_client_for, method, url, role):
    q = services.quota_request(team=world.vision, user=world.bob, gpu_hours=10, justification="x")
    path = url.format(id=q.pk)
    client = api_client_for(role) if path.startswith("/api/") else client_for(role)
    body = {"team": "vision", "gpu_hours": "5", "justification": "j", "comment": "c"}
    response = client.get(path) if method == "GET" else (
        client.post(path, body, format="json") if path.startswith("/api/") else client.post(path, body)
    )
    assert response.status_code == MATRIX[(method, url)][ROLES.index(role)]


# ---------------------------------------------------------------- Slurm limits (fake gateway)


@pytest.fixture
def fake_gateway(use_gateway):
    gateway = use_gateway(FakeGateway())
    for account in ("vision", "nlp"):
        gateway.account_add(account)
    return gateway


def test_drift_lists_differences_and_apply_sets_the_expected_limits(world, fake_gateway):
    quota(world.nlp, 100, max_gpus=4)
    quota(world.nlp, 30, gpu_type="h100")
    fake_gateway.limits["nlp"] = AssociationLimits(account="nlp", grp_tres_mins={"gres/gpu": 1, "cpu": 5})
    lines = services.quota_limit_drift()
    assert "quota limits of account nlp: GrpTRESMins gres/gpu is 1 in Slurm, the portal expects 6000" in lines
    assert "quota limits of account nlp: GrpTRES gres/gpu is unset in Slurm, the portal expects 4" in lines
    assert any("gres/gpu:h100" in line and "1800" in line for line in lines)
    assert any("account vision" in line for line in lines)  # the world's quota is not mirrored either
    services.quota_limits_apply()
    assert fake_gateway.limits["nlp"].grp_tres_mins == {"gres/gpu": 6000, "gres/gpu:h100": 1800}
    assert fake_gateway.limits["nlp"].grp_tres == {"gres/gpu": 4}
    assert services.quota_limit_drift() == []


def test_approval_mirrors_the_limits_after_commit(world, fake_gateway, django_capture_on_commit_callbacks):
    q = services.quota_request(team=world.nlp, user=world.dave, gpu_hours=12.5, max_gpus=2, justification="x")
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_approve(quota=q, user=world.admin)
    assert fake_gateway.limits["nlp"].grp_tres_mins == {"gres/gpu": 750}
    assert fake_gateway.limits["nlp"].grp_tres == {"gres/gpu": 2}


def test_rollover_resets_usage_at_a_new_period_only(world, fake_gateway):
    now = timezone.now()
    services.quota_period_rollover(at=now)  # first sight: recorded, no reset
    assert fake_gateway.resets == []
    services.quota_period_rollover(at=now)
    assert fake_gateway.resets == []
    start, end = selectors.current_month()
    QuotaFactory(team=world.vision, gpu_hours=5, period_start=start, period_end=end)  # a new period for vision
    done = services.quota_period_rollover(at=now)
    assert fake_gateway.resets == ["vision"] and any("reset usage of account vision" in line for line in done)
    assert fake_gateway.limits["vision"].grp_tres_mins == {"gres/gpu": 300}
    assert SyncStatus.objects.get(kind="quota-rollover").data["accounts"]["vision"] == start.isoformat()


def test_slurm_reconcile_prints_drift_and_apply_fixes_it(world, fake_gateway, monkeypatch):
    import io

    from django.core.management import call_command

    from portal.project.management.commands import slurm_reconcile

    monkeypatch.setattr(slurm_reconcile, "association_plan", lambda **kw: [])
    out = io.StringIO()
    call_command("slurm_reconcile", stdout=out)
    assert "quota limits of account vision" in out.getvalue()
    call_command("slurm_reconcile", "--apply", stdout=io.StringIO())
    out = io.StringIO()
    call_command("slurm_reconcile", stdout=out)
    assert "In sync" in out.getvalue()


def test_manager_role_helpers_unchanged(world):
    # the fixture world keeps its shape: a quota per team, approved, mirrored nowhere
    assert Quota.objects.filter(state=QuotaState.APPROVED).count() == 2
    assert MembershipFactory._meta.model.objects.filter(role=Role.MANAGER).count() == 2
    assert UserFactory(username="zed").email == "zed@example.org"
