"""What the GPUs did, end to end against the real parts: a job on the local cluster whose Prolog writes
the GPU job mapping, the emulated dcgm-exporter (scripts/gpu-exporter) and the real Prometheus
(scripts/prometheus up), read by the portal's one range query per cycle (jobs.services.gpu_usage_sync).

The job holds 2 GPUs and loads only its first: a process bound to it (CUDA_VISIBLE_DEVICES = that
index) with GPUPORTAL_GPU_UTIL=90 — the exporter's documented way a job sets its GPU's utilisation."""

from __future__ import annotations

import datetime as dt
import os
import time
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from accounting.models import Rate, UsageRecord
from accounting.selectors import cost_report
from accounting.services import usage_ingest
from jobs.choices import TERMINAL_STATES, JobState
from jobs.gpu_report import job_gpu_report
from jobs.models import Job, JobGpuIdleAlert, JobGpuSample, JobGpuSummary, JobGpuUsage
from jobs.services import gpu_usage_sync, job_relay_run, jobs_sync
from portal import prometheus
from tests.support import job_payload, skip_unless_ci, slurm_cancel_tagged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

LOAD_FIRST_GPU = (
    "#!/bin/bash\n"
    "# load the first GPU of the job at 90 % with 20 000 MiB; the second idles\n"
    'CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%%,*} GPUPORTAL_GPU_UTIL=90 GPUPORTAL_GPU_MEM_MIB=20000 exec sleep 300\n'
)
IDLE = "#!/bin/bash\nexec sleep 300\n"


@pytest.fixture
def real_prometheus(settings):
    """The local Prometheus (scripts/prometheus up; `make test` exports PROMETHEUS_URL), read at a
    2 s step (its scrape interval in tests)."""
    url = os.environ.get("PROMETHEUS_URL", "")
    if not url:
        skip_unless_ci("PROMETHEUS_URL not set: run scripts/prometheus up (make test does)")
    settings.PROMETHEUS_URL = url
    settings.GPU_USAGE_STEP_SECONDS = 2
    settings.GPU_SERIES_MIN_BUCKET_SECONDS = 2  # a job of a minute keeps a series of several points
    try:
        prometheus.gpu_series(*_window(), 2)
    except prometheus.PrometheusUnavailable as exc:
        skip_unless_ci(f"Prometheus not answering: {exc}")
    return url


def _window():
    now = timezone.now()
    return now - dt.timedelta(seconds=10), now


def _run(cluster, script: str, name: str) -> Job:
    client = APIClient()
    client.force_authenticate(user=cluster.alice)
    response = client.post("/api/v1/jobs/", job_payload(name=name, script=script, gpus=2, time_limit_minutes=5), format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    job_relay_run(str(job.pk))
    wait_for(lambda: (jobs_sync(), Job.objects.get(pk=job.pk).state == JobState.RUNNING)[1], timeout=60, what="the job running")
    return Job.objects.get(pk=job.pk)


def _sync_until(predicate, *, timeout=60.0):
    def step():
        gpu_usage_sync()
        return predicate()

    return wait_for(step, timeout=timeout, interval=2.0, what="the GPU figures")


def test_a_job_loading_gpu_0_and_leaving_gpu_1_idle_shows_each_gpu_and_the_teams_idle_cost(cluster, real_prometheus, settings):
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=timezone.localdate() - dt.timedelta(days=1))
    job = _run(cluster, LOAD_FIRST_GPU, "gpu-half-busy")
    try:
        # the load starts when the job's script does, a moment after Slurm says RUNNING (seconds on a
        # loaded machine: the first samples of GPU 0 are 0 % then); wait until its mean shows the load
        _sync_until(lambda: JobGpuUsage.objects.filter(job=job, samples__gte=6).count() == 2
                    and any(r.util_mean > 60 for r in JobGpuUsage.objects.filter(job=job)))
    finally:
        slurm_cancel_tagged([job])
    rows = sorted(JobGpuUsage.objects.filter(job=job), key=lambda r: int(r.gpu))
    busy, idle = rows
    assert busy.util_peak == 90 and busy.util_mean > 60, (busy.util_mean, busy.samples)
    assert busy.mem_peak == 20000
    assert idle.util_peak == 0 and idle.idle_samples == idle.samples
    assert {r.host for r in rows} == {rows[0].host} and rows[0].slurm_job_id == job.slurm_job_id

    client = APIClient()
    client.force_authenticate(user=cluster.alice)
    body = client.get(f"/api/v1/jobs/{job.pk}/").json()["gpu_usage"]
    assert body["verdict"] == "1 of 2 GPUs idle for 100 % of the run"
    assert [g["util_peak"] for g in body["gpus"]] == [90, 0]
    assert len(body["chart"]["series"]) == 2 and body["status"]["failing_since"] is None
    # a running job's chart: the raw points read from Prometheus at the chart's resolution
    live_busy, live_idle = ([v for v in s["util"] if v is not None] for s in body["chart"]["series"])
    assert max(live_busy) > 60 and live_idle and max(live_idle) == 0
    assert not JobGpuSample.objects.exists()  # nothing raw in PostgreSQL

    # the team's report: the usage accounting ingests from slurmdbd, with the GPUs' busy share
    wait_for(lambda: (jobs_sync(), Job.objects.get(pk=job.pk).state in TERMINAL_STATES)[1], timeout=60, what="the job ended")
    started = Job.objects.get(pk=job.pk).started_at

    def ingested():
        usage_ingest(since=started - dt.timedelta(minutes=5))
        gpu_usage_sync()
        return UsageRecord.objects.filter(portal_job_uuid=job.pk, gpu_busy_fraction__isnull=False).first()

    record = wait_for(ingested, timeout=60, interval=2.0, what="the usage record with its busy share")
    # frozen: its figures and one downsampled series (from Prometheus) kept as its summary
    _sync_until(lambda: JobGpuSummary.objects.filter(job=job).exists())
    stored = job_gpu_report(Job.objects.get(pk=job.pk))
    kept_busy, kept_idle = ([v for v in s["util"] if v is not None] for s in stored["chart"]["series"])
    assert len(stored["chart"]["labels"]) >= 3 and max(kept_busy) > 60 and kept_idle and max(kept_idle) == 0
    assert [g["util_mean"] for g in stored["gpus"]] == [round(r.util_mean, 1) for r in sorted(
        JobGpuUsage.objects.filter(job=job), key=lambda r: int(r.gpu))]  # fmt: skip
    # the share of the rows as they are now (the syncs since added the job's last points)
    rows = list(JobGpuUsage.objects.filter(job=job))
    share = Decimal(sum(r.util_sum for r in rows)) / Decimal(100 * sum(r.samples for r in rows))
    record.refresh_from_db()  # the syncs since set its share from the rows they completed
    assert record.gpu_busy_fraction == share.quantize(Decimal("0.000001")) and Decimal("0.2") < share < Decimal("0.5")
    day = timezone.localdate()
    [row] = cost_report(start=day, end=day, group_by="team", team=cluster.vision)
    assert row["busy_gpu_hours"] == (Decimal(record.gpu_seconds) * record.gpu_busy_fraction / 3600).quantize(Decimal("0.01"))
    # other (unmonitored) jobs of the team in the window add to its cost, not to its idle cost
    cost = sum((s.cost for s in record.slices.all()), Decimal(0))
    assert cost > 0 and row["idle_cost"] == (cost * (1 - record.gpu_busy_fraction)).quantize(Decimal("0.01"))


def test_a_job_whose_gpus_all_idle_alerts_its_submitter_once(cluster, real_prometheus, settings, django_capture_on_commit_callbacks):
    settings.GPU_IDLE_ALERT_MINUTES = 0.1  # 6 s of idle GPUs (30 min on a site)
    cluster.alice.email = "alice@example.org"
    cluster.alice.save()
    job = _run(cluster, IDLE, "gpu-idle")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            _sync_until(lambda: JobGpuIdleAlert.objects.filter(job=job).exists())
            time.sleep(2)
            gpu_usage_sync()  # still idle: no second alert
    finally:
        slurm_cancel_tagged([job])
    alert = JobGpuIdleAlert.objects.get(job=job)
    assert alert.gpus == 2 and alert.emailed_at is not None
    mine = [m for m in mail.outbox if str(job.pk) in m.body]
    assert len(mine) == 1 and mine[0].to == ["alice@example.org"]
    assert "idle" in mine[0].subject and f"/jobs/{job.pk}/" in mine[0].body


def test_the_sync_cycles_query_count_is_the_same_for_2_and_40_ended_jobs_against_the_real_prometheus(
    world, real_prometheus, settings
):
    """The whole cycle (gpu_usage_sync: the range query, the freeze with its own range query to the
    real Prometheus, the busy hand-over, the alerts): as many database queries whatever it freezes.
    The shared clusters' jobs come and go in the local Prometheus, so the cycles ask it for a metric
    no exporter prints: both range queries are real and answer nothing (the folding of points is
    counted with points in test_gpu_usage.py)."""
    settings.GPU_METRIC_UTIL, settings.GPU_METRIC_MEMORY = "gpuportal_test_no_such_metric", ""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.services import gpu_usage_record
    from tests.factories import JobFactory

    def cycle(jobs: int, first_id: int) -> int:
        now = timezone.now()
        made = [JobFactory(team=world.vision, submitter=world.alice, gpus=2, state=JobState.RUNNING, slurm_cluster="gpuportal",
                           slurm_job_id=first_id + i, started_at=now - dt.timedelta(minutes=5)) for i in range(jobs)]  # fmt: skip
        gpu_usage_record([prometheus.GpuSeries(cluster="gpuportal", job=str(j.slurm_job_id), host="a100-01", gpu=str(g), model="",
                                               points=[(now - dt.timedelta(seconds=10), 50.0, None)])
                          for j in made for g in range(2)], step=2)  # fmt: skip
        Job.objects.filter(pk__in=[j.pk for j in made]).update(state=JobState.COMPLETED, ended_at=now - dt.timedelta(minutes=1))
        with CaptureQueriesContext(connection) as queries:
            stats = gpu_usage_sync()
        assert "error" not in stats and stats["final"] == 2 * jobs, stats
        return len(queries)

    gpu_usage_sync()  # the first cycle ever creates its status row
    assert cycle(2, 900_000) == cycle(40, 910_000)
    assert JobGpuSummary.objects.count() == 42
