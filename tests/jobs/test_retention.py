"""What is kept how long (jobs.services.retention_apply, settings RETENTION_*): a job's detail expires,
what accounting charged never does — an invoice already issued and a closed month's report are the
same after the detail is gone; the idle alerts' sweeper raises what the recorded rows call for and
re-sends lost deliveries; the legacy GPU rows' compaction (manage.py gpu_samples_compact)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal

import pytest
from django.core import mail
from django.core.management import call_command
from django.utils import timezone

from accounting.invoices import invoice
from accounting.models import Rate
from accounting.selectors import cost_report
from accounting.services import usage_records_upsert
from jobs.choices import JobState
from jobs.gpu_report import job_gpu_report
from jobs.gpu_summary import summary_encode
from jobs.models import JobEvent, JobGpuIdleAlert, JobGpuSample, JobGpuSummary, JobGpuUsage, JobLogCopy
from jobs.selectors import job_output
from jobs.services import gpu_idle_alerts_sweep, retention_apply
from jobs.services.gpu_usage import gpu_busy_hand_over
from portal.models import AuditEvent
from portal.services import audit_record
from tests.accounting.helpers import acct, at
from tests.conftest import ROOT
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

JANUARY = dt.date(2026, 1, 1)


def _gpu_rows(job, *, slurm_job_id, start, hours, utils=(90.0, 10.0), final=True):
    rows = [
        JobGpuUsage.objects.create(job=job, slurm_job_id=slurm_job_id, host="a100-01", gpu=str(g), step_seconds=60,
                                   samples=hours * 60, util_sum=u * hours * 60, util_peak=u, first_at=start,
                                   last_at=start + dt.timedelta(hours=hours), final=final)  # fmt: skip
        for g, u in enumerate(utils)
    ]
    return rows


@pytest.fixture
def january(world, settings):
    """A vision job in January 2026 (2 GPUs x 3 h at 8/GPU-h, half busy) with its events, GPU rows and
    summary, an audit row, and its usage charged and handed its busy share."""
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    job = JobFactory(team=world.vision, submitter=world.alice, gpus=2, state=JobState.COMPLETED, slurm_cluster="gpuportal",
                     slurm_job_id=5001, started_at=at(2026, 1, 5, 10), ended_at=at(2026, 1, 5, 13))  # fmt: skip
    usage_records_upsert(records=[acct(job_id=5001, gpus=2, start=at(2026, 1, 5, 10), hours=3, comment=f"gpuportal:{job.pk}")])
    rows = _gpu_rows(job, slurm_job_id=5001, start=at(2026, 1, 5, 10), hours=3)
    JobGpuSummary.objects.create(job=job, ended_at=job.ended_at, data=summary_encode(rows, {}, minimum_width=300))
    gpu_busy_hand_over(job_ids=[job.pk], now=at(2026, 1, 5, 14))
    for state, when in ((JobState.PENDING, at(2026, 1, 5, 9)), (JobState.RUNNING, at(2026, 1, 5, 10)), (JobState.COMPLETED, job.ended_at)):
        JobEvent.objects.create(job=job, state=state, at=when)
    audit_record(actor=world.alice, action="job.submit", target=job, team=world.vision)
    AuditEvent.objects.update(at=at(2026, 1, 5, 9))
    # as the sync keeps a Kubernetes job's pod log before it deletes the Job (jobs.services.output)
    JobLogCopy.objects.create(job=job, ended_at=job.ended_at, saved_at=at(2026, 1, 5, 14), pod="p", data=b"epoch 1\n")
    return job


def test_expiring_every_detail_of_a_job_changes_neither_its_issued_invoice_nor_the_closed_months_report(january, world, settings):
    issued = invoice(team=world.vision, month=JANUARY)
    report = cost_report(start=JANUARY, end=dt.date(2026, 1, 31), group_by="team")
    by_user = cost_report(start=JANUARY, end=dt.date(2026, 1, 31), group_by="user")
    assert issued["busy_gpu_hours"] == Decimal("3.00") and report[0]["cost"] == Decimal("48.00")

    for name in ("RETENTION_GPU_ROWS_DAYS", "RETENTION_GPU_SUMMARY_DAYS", "RETENTION_JOB_EVENTS_DAYS", "RETENTION_AUDIT_DAYS",
                 "RETENTION_JOB_OUTPUT_DAYS"):
        setattr(settings, name, 1)
    gone = retention_apply(now=at(2026, 3, 1, 0))
    assert gone == {"gpu_rows": 2, "gpu_summaries": 1, "log_copies": 1, "job_events": 3, "audit_events": 1}
    assert not JobLogCopy.objects.exists()
    assert not JobGpuUsage.objects.exists() and not JobGpuSummary.objects.exists() and not JobEvent.objects.exists()
    assert not AuditEvent.objects.exists()
    january.refresh_from_db()  # the job itself stays
    assert january.state == JobState.COMPLETED

    assert invoice(team=world.vision, month=JANUARY) == issued
    assert cost_report(start=JANUARY, end=dt.date(2026, 1, 31), group_by="team") == report
    assert cost_report(start=JANUARY, end=dt.date(2026, 1, 31), group_by="user") == by_user
    assert job_gpu_report(january)["gpus"] == []


def test_by_default_only_the_gpu_working_rows_expire_and_only_once_the_summary_is_stored(january, world):
    unsummarised = JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.COMPLETED, slurm_job_id=5002,
                              slurm_cluster="gpuportal", started_at=at(2026, 1, 6, 10), ended_at=at(2026, 1, 6, 11))  # fmt: skip
    _gpu_rows(unsummarised, slurm_job_id=5002, start=at(2026, 1, 6, 10), hours=1, utils=(50.0,))
    assert retention_apply(now=at(2026, 1, 5, 13) + dt.timedelta(days=6)) == {
        "gpu_rows": 0, "gpu_summaries": 0, "log_copies": 0, "job_events": 0, "audit_events": 0}  # fmt: skip
    assert retention_apply(now=at(2026, 1, 5, 13) + dt.timedelta(days=8))["gpu_rows"] == 2  # RETENTION_GPU_ROWS_DAYS = 7
    assert list(JobGpuUsage.objects.values_list("job_id", flat=True)) == [unsummarised.pk]  # its record is not written yet
    # kept for ever by default: the summary, the events, the audit trail
    assert JobGpuSummary.objects.count() == 1 and JobEvent.objects.count() == 3 and AuditEvent.objects.count() == 1
    assert JobLogCopy.objects.count() == 1
    [gpu0, gpu1] = job_gpu_report(january)["gpus"]  # from the record
    assert (gpu0["util_mean"], gpu1["util_mean"]) == (90.0, 10.0)


def test_job_events_expire_in_batches_and_the_next_run_reads_only_jobs_ended_since(january, world, settings, django_assert_max_num_queries):
    settings.RETENTION_JOB_EVENTS_DAYS, settings.RETENTION_BATCH = 30, 100
    later = [
        JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.COMPLETED, ended_at=at(2026, 1, 10, 0))
        for _ in range(150)
    ]  # fmt: skip  (more jobs ending in one second than a batch: the walk goes by end and id)
    JobEvent.objects.bulk_create([JobEvent(job=j, state=JobState.COMPLETED, at=j.ended_at) for j in later])
    assert retention_apply(now=at(2026, 2, 20, 0))["job_events"] == 3 + 150  # two batches of jobs
    assert retention_apply(now=at(2026, 2, 20, 1))["job_events"] == 0
    fresh = JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.COMPLETED, ended_at=at(2026, 1, 25, 0))
    JobEvent.objects.create(job=fresh, state=JobState.COMPLETED, at=fresh.ended_at)
    with django_assert_max_num_queries(12):
        assert retention_apply(now=at(2026, 2, 25, 0))["job_events"] == 1


def test_an_old_jobs_output_is_no_longer_read_after_its_retention(january, settings):
    settings.RETENTION_JOB_OUTPUT_DAYS = 30
    assert "no longer shown here" in job_output(job=january).message


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RETENTION_GPU_SUMMARY_DAYS": "3"}, "RETENTION_GPU_SUMMARY_DAYS is shorter than RETENTION_GPU_ROWS_DAYS"),
        ({"RETENTION_JOB_EVENTS_DAYS": "-1"}, "RETENTION_JOB_EVENTS_DAYS='-1' is invalid"),
    ],
)
def test_bad_retention_settings_stop_start_up(env, message):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RETENTION_")}
    environ |= {"DJANGO_SETTINGS_MODULE": "portal.project.settings"} | env
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], check=False, cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0 and message in result.stderr and "ImproperlyConfigured" in result.stderr


# ---------------------------------------------------------------- the idle alerts' sweeper (issue 32's gap)


def test_the_sweeper_raises_the_alert_the_recorded_rows_call_for_when_the_sync_died_before_checking(
    world, settings, django_capture_on_commit_callbacks
):
    """The sync recorded 40 idle minutes and died before its alert check: the sweeper raises it."""
    settings.GPU_IDLE_ALERT_MINUTES = 30
    world.alice.email = "alice@example.org"
    world.alice.save()
    now = timezone.now()
    job = JobFactory(team=world.vision, submitter=world.alice, gpus=2, state=JobState.RUNNING, slurm_job_id=77,
                     started_at=now - dt.timedelta(minutes=45))  # fmt: skip
    for gpu in ("0", "1"):
        JobGpuUsage.objects.create(job=job, slurm_job_id=77, host="a100-01", gpu=gpu, step_seconds=60, samples=40,
                                   idle_samples=40, first_at=now - dt.timedelta(minutes=40), last_at=now - dt.timedelta(minutes=1),
                                   idle_since=now - dt.timedelta(minutes=41))  # fmt: skip
    # the rows of a job that idled only 20 minutes up to its last sample, whatever the clock says: no alert
    young = JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.RUNNING, slurm_job_id=78)
    JobGpuUsage.objects.create(job=young, slurm_job_id=78, host="a100-01", gpu="2", step_seconds=60, samples=20, idle_samples=20,
                               first_at=now - dt.timedelta(minutes=80), last_at=now - dt.timedelta(minutes=60),
                               idle_since=now - dt.timedelta(minutes=81))  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        assert gpu_idle_alerts_sweep(now=now) == {"raised": 1, "redelivered": 0}
    alert = JobGpuIdleAlert.objects.get()
    assert alert.job_id == job.pk and alert.gpus == 2 and alert.emailed_at is not None
    assert [m.to for m in mail.outbox] == [["alice@example.org"]]
    assert gpu_idle_alerts_sweep(now=now + dt.timedelta(minutes=10)) == {"raised": 0, "redelivered": 0}  # once


def test_the_sweeper_sends_a_delivery_whose_task_was_lost_once(world):
    world.alice.email = "alice@example.org"
    world.alice.save()
    now = timezone.now()
    job = JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.RUNNING, slurm_job_id=79)
    JobGpuIdleAlert.objects.create(job=job, created_at=now - dt.timedelta(minutes=10), idle_since=now - dt.timedelta(minutes=45), gpus=1)
    fresh = JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.RUNNING, slurm_job_id=80)
    JobGpuIdleAlert.objects.create(job=fresh, created_at=now - dt.timedelta(minutes=1), idle_since=now - dt.timedelta(minutes=31), gpus=1)
    assert gpu_idle_alerts_sweep(now=now) == {"raised": 0, "redelivered": 1}  # the fresh one's task may still run
    assert JobGpuIdleAlert.objects.get(job=job).emailed_at is not None and len(mail.outbox) == 1
    assert gpu_idle_alerts_sweep(now=now) == {"raised": 0, "redelivered": 0}


def test_the_beat_schedule_runs_the_sweeper_and_retention():
    from portal.project.celery import _beat_schedule

    schedule = _beat_schedule()
    assert schedule["gpu-idle-alert-sweep"]["task"] == "jobs.tasks.gpu_idle_alerts_sweep_task"
    assert schedule["retention"]["task"] == "jobs.tasks.retention_task"


# ---------------------------------------------------------------- the legacy rows' compaction


def test_the_compaction_turns_legacy_samples_into_summaries_and_deletes_them_in_batches(world, settings):
    settings.TIME_ZONE = "UTC"
    start = at(2026, 1, 5, 10)
    ended = JobFactory(team=world.vision, submitter=world.alice, gpus=2, state=JobState.COMPLETED, slurm_job_id=5101,
                       started_at=start, ended_at=start + dt.timedelta(hours=2))  # fmt: skip
    running = JobFactory(team=world.vision, submitter=world.alice, gpus=1, state=JobState.RUNNING, slurm_job_id=5102, started_at=start)
    rows = _gpu_rows(ended, slurm_job_id=5101, start=start, hours=2)
    [live] = _gpu_rows(running, slurm_job_id=5102, start=start, hours=2, utils=(50.0,), final=False)
    samples = [JobGpuSample(usage=row, at=start + dt.timedelta(minutes=m), util=u, mem_mib=1000.0)
               for row, u in ((rows[0], 90.0), (rows[1], 10.0), (live, 50.0)) for m in range(1, 121)]  # fmt: skip
    JobGpuSample.objects.bulk_create(samples)
    before = job_gpu_report(ended, chart=False)["gpus"]

    call_command("gpu_samples_compact", "--rows", "100")
    assert not JobGpuSample.objects.exists()
    assert list(JobGpuSummary.objects.values_list("job_id", flat=True)) == [ended.pk]  # the running job's comes at its end
    report = job_gpu_report(ended)
    assert [g["util_mean"] for g in report["gpus"]] == [g["util_mean"] for g in before] == [90.0, 10.0]
    chart = report["chart"]
    assert chart["bucket_seconds"] == 300 and {v for v in chart["series"][0]["util"] if v is not None} == {90.0}
    call_command("gpu_samples_compact")  # again: nothing to do
    assert JobGpuSummary.objects.count() == 1


def test_expiring_a_jobs_detail_leaves_a_rolled_up_months_invoice_and_report_as_they_were(january, world, settings):
    """The same with January closed and rolled up (accounting.services.usage_rollup): the invoice
    and the report read the month's totals, which no retention touches."""
    from accounting.selectors.usage_totals import month_rolled
    from accounting.services import usage_rollup

    assert usage_rollup(now=at(2026, 3, 1, 0)) == [JANUARY]
    assert month_rolled(JANUARY)
    issued = invoice(team=world.vision, month=JANUARY)
    report = cost_report(start=JANUARY, end=dt.date(2026, 1, 31), group_by="user")
    assert issued["busy_gpu_hours"] == Decimal("3.00") and report[0]["cost"] == Decimal("48.00")
    for name in ("RETENTION_GPU_ROWS_DAYS", "RETENTION_GPU_SUMMARY_DAYS", "RETENTION_JOB_EVENTS_DAYS", "RETENTION_AUDIT_DAYS"):
        setattr(settings, name, 1)
    assert retention_apply(now=at(2026, 3, 1, 0))["job_events"] == 3
    assert month_rolled(JANUARY)  # nothing re-opened the month
    assert invoice(team=world.vision, month=JANUARY) == issued
    assert cost_report(start=JANUARY, end=dt.date(2026, 1, 31), group_by="user") == report
