"""The teams' idle-GPU policy without a cluster (issue 40 item 3): who sets it and within which bounds,
off by default, the warning then the cancel decided from the GPU rows (the sync's folding of points,
with the team's threshold), the exemption, a new idle run re-arming the warning, the reason handed to
Slurm's AdminComment by the cancel relay (the fake gateway), the GPU-seconds saved and where they show.
The same against the real cluster and the emulated GPUs: tests/jobs/test_idle_policy_slurm.py."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from accounting.models import IdleCancelSaving, Rate
from accounting.reports import report_page_data
from jobs.choices import JobState
from jobs.models import Job, JobEvent, JobGpuIdleAlert, JobGpuUsage
from jobs.services import gpu_idle_alerts_check, gpu_usage_record, job_cancel_relay_run
from jobs.services.cancel import IDLE_CANCEL_REASON
from portal import prometheus
from portal.idle_policy import IdlePolicy
from portal.models import AuditEvent, TeamIdlePolicy
from tests.factories import JobFactory
from tests.fakes import FakeGateway

pytestmark = pytest.mark.django_db

STEP = 60


@pytest.fixture(autouse=True)
def bounds(settings):
    settings.GPU_IDLE_THRESHOLD_PERCENT = 5.0
    settings.GPU_IDLE_ALERT_MINUTES = 30
    settings.GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT = 10.0
    settings.GPU_IDLE_POLICY_MIN_WARN_MINUTES = 15.0
    settings.GPU_IDLE_POLICY_MIN_CANCEL_MINUTES = 10.0
    settings.GPU_IDLE_POLICY_MAX_MINUTES = 600.0


def _policy(team, *, threshold="10", warn="15", cancel="10", enabled=True) -> TeamIdlePolicy:
    return TeamIdlePolicy.objects.create(team=team, enabled=enabled, threshold_percent=Decimal(threshold),
                                         warn_minutes=Decimal(warn), cancel_minutes=Decimal(cancel))  # fmt: skip


def _running(world, *, slurm_job_id: int, started: dt.datetime, gpus=2, **kwargs) -> Job:
    return JobFactory(team=world.vision, submitter=world.alice, gpus=gpus, state=JobState.RUNNING, slurm_cluster="gpuportal",
                      slurm_job_id=slurm_job_id, started_at=started, time_limit_minutes=120, **kwargs)  # fmt: skip


def _feed(job, utils: list[float], *, start: dt.datetime, gpus=("0", "1")) -> None:
    """The sync's folding of ``utils`` (one point a minute from ``start``) for each GPU of ``job``."""
    points = [(start + dt.timedelta(seconds=STEP * i), u, None) for i, u in enumerate(utils)]
    gpu_usage_record([prometheus.GpuSeries(cluster="gpuportal", job=str(job.slurm_job_id), host="a100-01", gpu=g, model="",
                                           points=points) for g in gpus], step=STEP)  # fmt: skip


# ---------------------------------------------------------------- who sets it, within which bounds


@pytest.mark.parametrize("role, status", [("manager", 200), ("admin", 200), ("member", 403), ("finance", 403),
                                          ("outsider", 404), ("anonymous", 401)])  # fmt: skip
def test_only_the_teams_managers_and_admins_set_the_policy(world, api_client_for, role, status):
    body = {"enabled": True, "threshold_percent": "8", "warn_minutes": "20", "cancel_minutes": "30"}
    response = api_client_for(role).put("/api/v1/teams/vision/idle-policy/", body, format="json")
    assert response.status_code == status, response.content
    stored = TeamIdlePolicy.objects.filter(team=world.vision).first()
    if status == 200:
        assert (stored.enabled, stored.threshold_percent, stored.warn_minutes, stored.cancel_minutes) == (
            True, Decimal(8), Decimal(20), Decimal(30))  # fmt: skip
        assert response.json()["effective"] == {"threshold_percent": 8.0, "warn_minutes": 20.0, "cancel_minutes": 30.0}
        assert AuditEvent.objects.filter(action="team.idle_policy_set", target_id=str(world.vision.pk)).count() == 1
    else:
        assert stored is None


def test_the_policy_is_off_by_default_and_every_member_reads_it_with_the_bounds(world, api_client_for):
    body = api_client_for("member").get("/api/v1/teams/vision/idle-policy/").json()
    assert body["enabled"] is False and body["updated_at"] is None
    assert body["bounds"] == {"max_threshold_percent": "10.00", "min_warn_minutes": "15.00", "min_cancel_minutes": "10.00",
                              "max_minutes": "600.00"}  # fmt: skip
    # the values a manager starts from: the site's alert within the bounds (30 min, 5 %), the shortest cancel
    assert (body["threshold_percent"], body["warn_minutes"], body["cancel_minutes"]) == ("5.00", "30.00", "10.00")


@pytest.mark.parametrize("field, value, words", [
    ("threshold_percent", "50", "Between 0 and 10 %"), ("threshold_percent", "0", "Between 0 and 10 %"),
    ("warn_minutes", "5", "At least 15"), ("cancel_minutes", "2", "At least 10"), ("cancel_minutes", "601", "at most 600"),
])  # fmt: skip
def test_values_outside_the_admins_bounds_answer_400_naming_the_field(world, api_client_for, field, value, words):
    body = {"enabled": True, "threshold_percent": "8", "warn_minutes": "20", "cancel_minutes": "30", field: value}
    response = api_client_for("manager").put("/api/v1/teams/vision/idle-policy/", body, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == [field] and words in errors[field][0]
    assert not TeamIdlePolicy.objects.exists()


def test_the_team_page_form_sets_it_for_managers_and_refuses_members(world, client_for):
    form = {"enabled": "on", "threshold_percent": "9", "warn_minutes": "16", "cancel_minutes": "12"}
    assert client_for("member").post("/teams/vision/", form).status_code == 403
    assert not TeamIdlePolicy.objects.exists()
    refused = client_for("manager").post("/teams/vision/", dict(form, warn_minutes="3"))
    assert refused.status_code == 400 and "At least 15" in refused.content.decode()
    assert client_for("manager").post("/teams/vision/", form).status_code == 302
    assert TeamIdlePolicy.objects.get(team=world.vision).warn_minutes == Decimal(16)
    member_page = client_for("member").get("/teams/vision/").content.decode()
    assert "idle for" not in member_page and "16 min warns its submitter" in member_page and "Save policy" not in member_page


def test_a_policy_set_before_the_bounds_were_raised_applies_clamped_into_them(world, settings):
    _policy(world.vision, threshold="10", warn="15", cancel="10")
    settings.GPU_IDLE_POLICY_MIN_WARN_MINUTES = 45.0
    settings.GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT = 3.0
    row = TeamIdlePolicy.objects.get(team=world.vision)
    effective = IdlePolicy.effective(threshold_percent=row.threshold_percent, warn_minutes=row.warn_minutes,
                                     cancel_minutes=row.cancel_minutes)  # fmt: skip
    assert (effective.threshold_percent, effective.warn, effective.cancel) == (3.0, dt.timedelta(minutes=45), dt.timedelta(minutes=10))


# ---------------------------------------------------------------- warn, then cancel


def test_off_by_default_an_idle_job_gets_the_sites_alert_and_is_never_cancelled(world, relays):
    now = timezone.now()
    job = _running(world, slurm_job_id=21, started=now - dt.timedelta(minutes=60))
    _feed(job, [0.0] * 60, start=now - dt.timedelta(minutes=60))
    gpu_idle_alerts_check(now=now)
    assert JobGpuIdleAlert.objects.get(job=job).cancel_at is None
    gpu_idle_alerts_check(now=now + dt.timedelta(hours=5))
    job.refresh_from_db()
    assert job.cancel_requested_at is None and relays["cancel"] == [] and not IdleCancelSaving.objects.exists()


def test_an_idle_job_is_warned_then_cancelled_with_the_reason_in_its_history_and_in_slurm(
    world, relays, use_gateway, django_capture_on_commit_callbacks
):
    _policy(world.vision, threshold="10", warn="15", cancel="10")
    world.alice.email = "alice@example.org"
    world.alice.save()
    t0 = timezone.now().replace(microsecond=0) - dt.timedelta(minutes=30)
    job = _running(world, slurm_job_id=22, started=t0)
    busy = _running(world, slurm_job_id=23, started=t0)
    # 7 %: idle under the team's 10 %, busy under the site's 5 % (the fold uses the team's threshold)
    _feed(job, [7.0] * 16, start=t0)
    _feed(busy, [7.0] * 15 + [60.0], start=t0, gpus=("0",))
    warn_at = t0 + dt.timedelta(minutes=16)
    with django_capture_on_commit_callbacks(execute=True):
        [warning] = gpu_idle_alerts_check(now=warn_at)
    assert warning.job_id == job.pk and warning.cancel_at == warn_at + dt.timedelta(minutes=10) and warning.threshold_percent == 10.0
    [message] = mail.outbox
    assert "cancelled at" in message.subject and "idle-GPU policy cancels the job" in message.body
    assert JobEvent.objects.filter(job=job, reason__startswith="Warned: all 2 GPUs under 10 %").count() == 1

    _feed(job, [7.0] * 9, start=t0 + dt.timedelta(minutes=16))
    assert gpu_idle_alerts_check(now=warn_at + dt.timedelta(minutes=9)) == []  # not yet: still warned
    assert Job.objects.get(pk=job.pk).cancel_requested_at is None
    _feed(job, [7.0] * 2, start=t0 + dt.timedelta(minutes=25))
    cancel_at = warn_at + dt.timedelta(minutes=10)
    with django_capture_on_commit_callbacks(execute=True):
        gpu_idle_alerts_check(now=cancel_at)
        gpu_idle_alerts_check(now=cancel_at + dt.timedelta(minutes=1))  # decided once

    job.refresh_from_db()
    assert job.cancel_requested_at == cancel_at and job.cancel_reason.startswith(IDLE_CANCEL_REASON)
    assert relays["cancel"] == [str(job.pk)] and Job.objects.get(pk=busy.pk).cancel_requested_at is None
    assert JobEvent.objects.filter(job=job, reason__startswith="Cancel requested: idle GPUs").count() == 1
    saving = IdleCancelSaving.objects.get(portal_job_uuid=job.pk)
    # 2 GPUs × (start + 120 min − the cancel's moment)
    assert saving.gpu_seconds == 2 * int((t0 + dt.timedelta(minutes=120) - cancel_at).total_seconds()) and saving.team == world.vision
    assert AuditEvent.objects.get(action="job.idle_cancel").data["saved_gpu_seconds"] == saving.gpu_seconds

    gateway = use_gateway(FakeGateway())
    assert job_cancel_relay_run(str(job.pk)) == "sent"
    assert gateway.admin_comments == {22: job.cancel_reason} and gateway.cancelled == [22]


def test_an_exempt_job_is_never_cancelled_and_its_managers_see_the_exemption(world, relays, client_for):
    _policy(world.vision)
    t0 = timezone.now() - dt.timedelta(minutes=60)
    job = _running(world, slurm_job_id=24, started=t0, idle_exempt=True, name="debugger")
    _feed(job, [0.0] * 60, start=t0)
    gpu_idle_alerts_check(now=t0 + dt.timedelta(minutes=60))
    gpu_idle_alerts_check(now=t0 + dt.timedelta(minutes=200))
    job.refresh_from_db()
    assert job.cancel_requested_at is None and JobGpuIdleAlert.objects.get(job=job).cancel_at is None  # the site's alert only
    manager_page = client_for("manager").get("/teams/vision/").content.decode()
    exempt_part = manager_page.split('id="idle-exempt"')[1]
    assert "debugger" in exempt_part
    assert 'id="idle-exempt"' not in client_for("member").get("/teams/vision/").content.decode()
    assert "idle-exempt" in client_for("manager").get("/jobs/").content.decode()


def test_gpus_busy_again_after_the_warning_call_the_cancel_off_and_a_new_idle_run_warns_again(world, relays):
    _policy(world.vision, warn="15", cancel="10")
    t0 = timezone.now().replace(microsecond=0) - dt.timedelta(minutes=90)
    job = _running(world, slurm_job_id=25, started=t0)
    _feed(job, [0.0] * 16, start=t0)
    [first] = gpu_idle_alerts_check(now=t0 + dt.timedelta(minutes=16))
    _feed(job, [80.0] * 5 + [0.0] * 5, start=t0 + dt.timedelta(minutes=16))  # busy, then idle for 5 min
    assert gpu_idle_alerts_check(now=t0 + dt.timedelta(minutes=27)) == []  # the deadline passed: no cancel
    assert Job.objects.get(pk=job.pk).cancel_requested_at is None
    _feed(job, [0.0] * 12, start=t0 + dt.timedelta(minutes=26))  # idle for 17 min now
    [again] = gpu_idle_alerts_check(now=t0 + dt.timedelta(minutes=38))
    assert again.created_at > first.created_at and again.idle_since == t0 + dt.timedelta(minutes=20) and again.emailed_at is None
    assert JobEvent.objects.filter(job=job, reason__startswith="Warned").count() == 2


# ---------------------------------------------------------------- the GPU-hours saved, where they show


def test_the_gpu_hours_saved_show_in_the_report_and_on_the_dashboard(world, relays, client_for):
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal(8), effective_from=timezone.localdate() - dt.timedelta(days=1))
    _policy(world.vision, warn="15", cancel="10")
    now = timezone.now().replace(microsecond=0)
    t0 = now - dt.timedelta(minutes=26)
    job = _running(world, slurm_job_id=26, started=t0)
    _feed(job, [0.0] * 16, start=t0)
    gpu_idle_alerts_check(now=t0 + dt.timedelta(minutes=16))
    _feed(job, [0.0] * 10, start=t0 + dt.timedelta(minutes=16))
    gpu_idle_alerts_check(now=now)
    saving = IdleCancelSaving.objects.get(portal_job_uuid=job.pk)
    assert saving.gpu_seconds == 2 * (120 - 26) * 60
    data = report_page_data(start_at=now - dt.timedelta(days=1), end_at=now + dt.timedelta(days=1))
    [row] = data["idle_savings"]
    hours = Decimal(saving.gpu_seconds) / 3600
    assert (row["team_slug"], row["jobs"], row["gpu_hours"]) == ("vision", 1, hours.quantize(Decimal("0.01")))
    assert row["value"] == (hours * 8).quantize(Decimal("0.01"))
    dashboard = client_for("member").get("/").content.decode()
    assert f"idle-GPU policy saved {row['gpu_hours']} GPU-hours this month" in dashboard
    assert f"{row['gpu_hours']} GPU-hours" in client_for("manager").get("/teams/vision/").content.decode()
    assert "idle-GPU policy saved" not in client_for("outsider").get("/").content.decode()
    usage_page = client_for("member").get("/accounting/usage/?team=vision").content.decode()
    assert f"<strong>{row['gpu_hours']} GPU-hours</strong> (1 idle job cancelled" in usage_page


# ---------------------------------------------------------------- the exemption at submission


def test_a_job_submitted_exempt_through_the_api_is_stored_exempt_and_says_so(world, inventory_small, relays, api_client_for):
    from tests.support import job_payload

    client = api_client_for("member")
    response = client.post("/api/v1/jobs/", job_payload(idle_exempt=True), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["idle_exempt"] is True and Job.objects.get(pk=response.json()["id"]).idle_exempt
    plain = client.post("/api/v1/jobs/", job_payload(name="plain"), format="json").json()
    assert plain["idle_exempt"] is False


def test_the_cli_sends_the_exemption_only_when_asked():
    from gpuportal_cli.main import build_parser
    from gpuportal_cli.submit import build_submission

    parser = build_parser()
    asked = parser.parse_args(["submit", "--team", "vision", "--idle-exempt", "job.sh"])
    body, _ = build_submission(asked, "#!/bin/bash\nsleep 1\n", "job.sh")
    assert body["idle_exempt"] is True
    body, _ = build_submission(parser.parse_args(["submit", "--team", "vision", "job.sh"]), "#!/bin/bash\n", "job.sh")
    assert "idle_exempt" not in body


def test_the_sync_folds_a_policy_jobs_points_with_its_teams_threshold(world):
    _policy(world.vision, threshold="10")
    t0 = timezone.now() - dt.timedelta(minutes=5)
    job = _running(world, slurm_job_id=27, started=t0)
    other = JobFactory(team=world.nlp, submitter=world.carol, gpus=1, state=JobState.RUNNING, slurm_cluster="gpuportal",
                       slurm_job_id=28, started_at=t0)  # fmt: skip
    _feed(job, [7.0] * 3, start=t0, gpus=("0",))
    _feed(other, [7.0] * 3, start=t0, gpus=("0",))
    assert JobGpuUsage.objects.get(job=job).idle_samples == 3  # under vision's 10 %
    assert JobGpuUsage.objects.get(job=other).idle_samples == 0  # not under the site's 5 %




def test_slurm_refusing_the_admin_comment_does_not_keep_the_job_from_being_cancelled(world, use_gateway):
    from portal.slurm import SlurmRejected

    class Refusing(FakeGateway):
        def admin_comment_set(self, job_id, text):
            raise SlurmRejected("Access/permission denied", command="scontrol")

    job = _running(world, slurm_job_id=29, started=timezone.now() - dt.timedelta(minutes=5))
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now(), cancel_reason=f"{IDLE_CANCEL_REASON} (test)")
    gateway = use_gateway(Refusing())
    assert job_cancel_relay_run(str(job.pk)) == "sent"
    assert gateway.cancelled == [29] and Job.objects.get(pk=job.pk).cancel_sent_at is not None
