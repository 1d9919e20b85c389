"""Issue 40 item 4 in Chromium: the GPU chart of a running job moves while its page is open. The
GPU figures are the portal's rows (what the GPU-usage sync writes from Prometheus: the one fake is
the GPU hardware); points added while the page is open appear on its chart without a reload, through
the section's own poll (one request for all the job's GPUs)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job, JobGpuSample, JobGpuUsage
from tests.browser.helpers import log_in

pytestmark = [pytest.mark.browser]

expect = pytest.importorskip("playwright.sync_api").expect


def _add_points(usages, start: dt.datetime, count: int, util: float) -> None:
    JobGpuSample.objects.bulk_create(
        JobGpuSample(usage=usage, at=start + dt.timedelta(minutes=i), util=util, mem_mib=1024.0) for usage in usages for i in range(count)
    )
    JobGpuUsage.objects.filter(pk__in=[u.pk for u in usages]).update(
        samples=F("samples") + count, util_sum=F("util_sum") + util * count, last_at=start + dt.timedelta(minutes=count - 1)
    )


def test_the_gpu_chart_of_a_running_job_moves_without_a_reload(world, live_server, browsing, settings):
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # monitoring on; the page never asks Prometheus
    settings.GPU_USAGE_SYNC_SECONDS = 1  # the section polls every max(this, the page's 3 s)
    start = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=20)
    job = Job.objects.create(
        team=world.vision, submitter=world.alice, name="live-chart", script="#!/bin/bash\ntrue", partition="gpu",
        gpu_type="a100", gpus=2, time_limit_minutes=60, workdir="/tmp", state=JobState.RUNNING, slurm_job_id=4040,
        slurm_cluster="x", submitted_at=start, started_at=start, estimated_gpu_hours=2,
    )  # fmt: skip
    usages = [
        JobGpuUsage.objects.create(job=job, slurm_job_id=4040, host="a100-01", gpu=str(i), model_name="A100", step_seconds=60,
                                   first_at=start, last_at=start)  # fmt: skip
        for i in range(2)
    ]
    _add_points(usages, start, 5, 40.0)
    page = browsing.page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url) if "/gpu/" in request.url else None)
    log_in(page, world.alice.username)
    page.goto(f"/jobs/{job.pk}/")
    labels = "() => Chart.getChart(document.getElementById('chart-gpu-util')).data.labels.length"
    first = page.evaluate(labels)
    assert first >= 5 and page.evaluate("() => Chart.getChart(document.getElementById('chart-gpu-util')).data.datasets.length") == 2
    _add_points(usages, start + dt.timedelta(minutes=5), 10, 90.0)  # ten more minutes of figures arrive
    grown = f"() => {{ const c = Chart.getChart(document.getElementById('chart-gpu-util')); return c && c.data.labels.length > {first}; }}"
    page.wait_for_function(grown, timeout=15_000)
    assert "#" not in page.url and requests, "the chart moved through the section's poll"
    assert all(url.endswith(f"/jobs/{job.pk}/gpu/") for url in requests)  # one request for all GPUs, not one per GPU
    browsing.assert_clean()
