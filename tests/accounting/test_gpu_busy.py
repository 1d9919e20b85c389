"""GPU-hours busy beside GPU-hours paid: the GPU monitoring's rows (jobs.models.JobGpuUsage) handed to
accounting as each job's busy share (UsageRecord.gpu_busy_fraction), then the cost report, its CSV,
the invoice and the budget page show busy GPU-hours, GPU efficiency and the cost of idle GPU-hours."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest

from accounting.invoices import invoice
from accounting.models import Rate, UsageRecord
from accounting.reports import rows_to_csv
from accounting.selectors import cost_report
from accounting.services import usage_busy_record, usage_records_upsert
from jobs.choices import JobState
from jobs.models import JobGpuUsage
from jobs.services.gpu_usage import gpu_busy_hand_over
from tests.accounting.helpers import acct, at
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def monitored(world, settings):
    """Two vision jobs in January 2026 at 8/GPU-h: a monitored one (2 GPUs x 3 h, GPU 0 at 90 %, GPU 1
    at 10 %: half busy) and an unmonitored one (1 GPU x 1 h)."""
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    job = JobFactory(team=world.vision, submitter=world.alice, gpus=2, state=JobState.COMPLETED, slurm_cluster="gpuportal",
                     slurm_job_id=5001, started_at=at(2026, 1, 5, 10), ended_at=at(2026, 1, 5, 13))  # fmt: skip
    usage_records_upsert(records=[
        acct(job_id=5001, gpus=2, start=at(2026, 1, 5, 10), hours=3, comment=f"gpuportal:{job.pk}"),
        acct(job_id=5002, gpus=1, start=at(2026, 1, 6, 10), hours=1),
    ])  # fmt: skip
    for gpu, util in (("0", 90.0), ("1", 10.0)):
        JobGpuUsage.objects.create(job=job, slurm_job_id=5001, host="a100-01", gpu=gpu, step_seconds=60, samples=180,
                                   util_sum=util * 180, util_peak=util, first_at=at(2026, 1, 5, 10), last_at=at(2026, 1, 5, 13),
                                   final=True)  # fmt: skip
    return job


def test_the_busy_share_is_handed_to_the_jobs_usage_record(monitored):
    assert gpu_busy_hand_over(job_ids=[monitored.pk], now=at(2026, 1, 5, 14)) == 1
    record = UsageRecord.objects.get(job_id=5001)
    assert record.gpu_busy_fraction == Decimal("0.5")
    assert UsageRecord.objects.get(job_id=5002).gpu_busy_fraction is None
    assert usage_busy_record(fractions={(monitored.pk, 5001): Decimal("0.5")}) == 0  # unchanged: no write
    assert usage_busy_record(fractions={(monitored.pk, 5001): Decimal("1.7")}) == 1  # clamped
    assert UsageRecord.objects.get(job_id=5001).gpu_busy_fraction == 1


def test_the_team_report_csv_and_invoice_show_busy_gpu_hours_and_the_idle_cost(monitored, world):
    gpu_busy_hand_over(job_ids=[monitored.pk], now=at(2026, 1, 5, 14))
    [row] = cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 1, 31), group_by="team")
    # paid: 6 + 1 GPU-hours (56.00); monitored 6 of them, half busy: 3 busy GPU-hours, idle cost 24.00
    assert (row["gpu_hours"], row["cost"]) == (Decimal("7.00"), Decimal("56.00"))
    assert (row["monitored_gpu_hours"], row["busy_gpu_hours"], row["gpu_efficiency"], row["idle_cost"]) == (
        Decimal("6.00"), Decimal("3.00"), 0.5, Decimal("24.00"))  # fmt: skip
    [csv_row] = list(csv.DictReader(io.StringIO(rows_to_csv([row]).lstrip("\ufeff"))))
    assert (csv_row["busy_gpu_hours"], csv_row["gpu_efficiency"], csv_row["idle_cost"]) == ("3.00", "0.5", "24.00")
    [user_row] = [r for r in cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 1, 31), group_by="user")]
    assert user_row["busy_gpu_hours"] == Decimal("3.00")

    bill = invoice(team=world.vision, month=dt.date(2026, 1, 1))
    assert (bill["monitored_gpu_hours"], bill["busy_gpu_hours"], bill["idle_cost"]) == (Decimal("6.00"), Decimal("3.00"), Decimal("24.00"))
    assert {line["job_id"]: line["busy_gpu_hours"] for line in bill["lines"]} == {5001: Decimal("3.00"), 5002: None}


def test_a_report_without_monitoring_says_nothing_of_busy_hours(world, settings):
    settings.TIME_ZONE = "UTC"
    usage_records_upsert(records=[acct(job_id=6001, gpus=1, start=at(2026, 1, 6, 10), hours=1)])
    [row] = cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 1, 31), group_by="gpu_type")
    assert row["busy_gpu_hours"] is None and row["gpu_efficiency"] is None and row["idle_cost"] is None
