"""Issue 40 item 4 in Chromium, against the real parts: a job running on the local cluster loads its
first GPU (the emulated dcgm-exporter: the one fake is the GPU hardware), the real Prometheus scrapes
it, the GPU-usage sync (standing in for beat) records what it read. While the job's page is open its
GPU chart grows, without a reload, through the section's own poll: one request for all the job's
GPUs, each answered from one Prometheus range query (jobs.gpu_report)."""

from __future__ import annotations

import time

import pytest

from jobs.models import JobGpuUsage
from jobs.services import gpu_usage_sync
from tests.browser.helpers import log_in
from tests.jobs.test_gpu_usage_prometheus import LOAD_FIRST_GPU, _run, _sync_until, real_prometheus  # noqa: F401
from tests.support import slurm_cancel_tagged

pytestmark = [pytest.mark.browser, pytest.mark.slurm]

expect = pytest.importorskip("playwright.sync_api").expect

CHART = "Chart.getChart(document.getElementById('chart-gpu-util'))"


def test_the_gpu_chart_of_a_running_job_moves_without_a_reload(cluster, real_prometheus, live_server, browsing, settings):
    settings.GPU_USAGE_SYNC_SECONDS = 1  # the section polls every max(this, the page's 3 s)
    job = _run(cluster, LOAD_FIRST_GPU, "live-chart")
    try:
        _sync_until(lambda: JobGpuUsage.objects.filter(job=job, samples__gte=2).count() == 2)
        page = browsing.page()
        polls: list[str] = []
        page.on("request", lambda request: polls.append(request.url) if "/gpu/" in request.url else None)
        log_in(page, cluster.alice.username)
        page.goto(f"/jobs/{job.pk}/")
        page.wait_for_function(f"() => {CHART} && {CHART}.data.labels.length > 0", timeout=15_000)
        first = page.evaluate(f"() => {CHART}.data.labels.length")
        assert page.evaluate(f"() => {CHART}.data.datasets.length") == 2  # one line per GPU of the job
        deadline = time.monotonic() + 60
        while page.evaluate(f"() => {CHART}.data.labels.length") <= first:
            assert time.monotonic() < deadline, "the chart never moved while the page was open"
            gpu_usage_sync()  # what beat does every GPU_USAGE_SYNC_SECONDS
            page.wait_for_timeout(1000)
        assert "#" not in page.url and polls, "the chart moved through the section's poll, not a reload"
        assert all(url.endswith(f"/jobs/{job.pk}/gpu/") for url in polls)  # one request for all GPUs, not one per GPU
        # what it draws is what the exporter was told: the loaded GPU near 90 %, the other at 0
        peaks = page.evaluate(f"() => {CHART}.data.datasets.map(d => Math.max(...d.data.filter(v => v !== null)))")
        assert sorted(round(p) for p in peaks) == [0, 90], peaks
        browsing.assert_clean()
    finally:
        slurm_cancel_tagged([job])
