"""The screenshots of docs/screenshots/ (linked from the README): the main pages at desktop (1366 px)
and phone (390 px) width, of a small made-up site (two clusters, an array job, a month of usage).

Run by ``scripts/screenshots`` (which sets SCREENSHOTS_DIR); skipped otherwise, so the test runs
spend nothing on it. No Slurm needed: the rows are what the syncs would have written."""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from tests.browser.helpers import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OUT = os.environ.get("SCREENSHOTS_DIR", "")
WIDTHS = {"desktop": (1366, 860), "phone": (390, 844)}


@pytest.fixture
def site(world, settings):
    """Two clusters' inventory, an array job half done, a finished and a pending job, a rate and
    January 2026's usage."""
    from accounting.models import Rate
    from accounting.services import usage_records_upsert
    from jobs.choices import JobState
    from jobs.models import Job, JobArrayTask, JobEvent
    from portal.models import NodeInfo, PartitionInfo
    from portal.services import cluster_row, clusters_record, sync_record_success
    from portal.slurm import ClusterConfig
    from tests.accounting.helpers import acct, at

    settings.TIME_ZONE = "Europe/Berlin"
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(settings.SLURM_CLUSTER, "cli"), ClusterConfig("lab25", "pyslurm"))
    clusters_record()
    world.vision.name = "视觉组 Łódź"
    world.vision.save()
    now = timezone.now()
    for cluster, version, backend, nodes in (
        (cluster_row(settings.SLURM_CLUSTER), "22.05.8", "sbatch", [("a100-01", "a100", 3), ("a100-02", "a100", 4), ("h100-01", "h100", 0)]),
        (cluster_row("lab25"), "25.11.7", "pyslurm", [("l40s-01", "l40s", 6), ("a100-01", "a100", 2)]),
    ):  # fmt: skip
        for name, gpu_type, allocated in nodes:
            total = 8 if gpu_type == "l40s" else 4
            NodeInfo.objects.create(cluster=cluster, name=name, state="MIXED" if allocated else "IDLE", partitions=["gpu", "debug"],
                                    gpu_type=gpu_type, gpus_total=total, gpus_allocated=allocated, cpus_total=64, memory_mb=512000,
                                    seen_at=now)  # fmt: skip
        names = [n for n, _, _ in nodes]
        PartitionInfo.objects.create(cluster=cluster, name="gpu", is_default=True, state="UP", default_time_minutes=60,
                                     max_time_minutes=4320, node_names=names, seen_at=now)  # fmt: skip
        PartitionInfo.objects.create(cluster=cluster, name="debug", state="UP", default_time_minutes=10, max_time_minutes=60,
                                     node_names=names, seen_at=now)  # fmt: skip
        kind = "cluster" if cluster.name == settings.SLURM_CLUSTER else f"cluster:{cluster.name}"
        sync_record_success(kind, data={"slurm_version": version, "relay_backend": backend})
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal(8), effective_from=dt.date(2025, 1, 1))

    def job(name, state, **extra):
        row = Job.objects.create(team=world.vision, submitter=world.alice, name=name, script="#!/bin/bash\n#SBATCH --gpus=1\npython train.py\n",
                                 partition="gpu", gpu_type="a100", gpus=1, time_limit_minutes=30, workdir="/home/alice/runs",
                                 state=state, currency="CNY",
                                 **{"estimated_gpu_hours": Decimal("0.50"), "estimated_cost": Decimal("4.00"), **extra})  # fmt: skip
        JobEvent.objects.create(job=row, state=JobState.ACCEPTED, reason="Accepted by the portal", at=row.created_at)
        return row

    job("resnet50-baseline", JobState.COMPLETED, slurm_job_id=9480, exit_code=0, started_at=now - dt.timedelta(hours=2),
        ended_at=now - dt.timedelta(hours=1))  # fmt: skip
    job("bert-eval", JobState.PENDING, slurm_job_id=9533, state_reason="Resources")
    sweep = job("lr-sweep", JobState.RUNNING, slurm_job_id=9529, array="0-3", array_tasks=4, started_at=now - dt.timedelta(minutes=3),
                estimated_gpu_hours=Decimal("2.00"), estimated_cost=Decimal("16.00"))  # fmt: skip
    for index, state, minutes in ((0, JobState.COMPLETED, 3), (1, JobState.RUNNING, 2), (2, JobState.RUNNING, 1)):
        JobArrayTask.objects.create(job=sweep, index=index, slurm_job_id=9530 + index, state=state, started_at=now - dt.timedelta(minutes=minutes),
                                    ended_at=now if state == JobState.COMPLETED else None,
                                    exit_code=0 if state == JobState.COMPLETED else None)  # fmt: skip
    usage_records_upsert(records=[
        acct(account="vision", user="alice", start=at(2026, 1, 2 + i, 9), hours=1 + i % 3, gpus=1 + i % 2, job_id=8100 + i) for i in range(6)
    ] + [acct(account="nlp", user="carol", start=at(2026, 1, 9, 9), hours=3, job_id=8200)])  # fmt: skip
    return {"array_job": sweep}


@pytest.mark.skipif(not OUT, reason="scripts/screenshots regenerates docs/screenshots/ (SCREENSHOTS_DIR)")
def test_screenshots_of_the_main_pages(site, chromium, live_server):
    out = Path(OUT)
    out.mkdir(parents=True, exist_ok=True)
    pages = [
        ("dashboard", "alice", "/"),
        ("jobs", "alice", "/jobs/"),
        ("job-array", "alice", f"/jobs/{site['array_job'].pk}/"),
        ("job-form", "alice", "/jobs/new/"),
        ("clusters", "alice", "/clusters/"),
        ("invoice", "finn", "/accounting/invoices/vision/2026-01/"),
    ]
    written = []
    for username in ("alice", "finn"):
        context = chromium.new_context(base_url=live_server.url, viewport={"width": 1366, "height": 860}, locale="en-GB",
                                       timezone_id="Europe/Berlin", device_scale_factor=1)  # fmt: skip
        page = context.new_page()
        log_in(page, username)
        for width_name, (width, height) in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": height})
            for name, user, path in pages:
                if user != username:
                    continue
                page.goto(path)
                page.wait_for_load_state("networkidle")
                target = out / f"{name}-{width_name}.png"
                page.screenshot(path=str(target), full_page=False, animations="disabled")
                written.append(target)
        context.close()
    assert len(written) == len(pages) * len(WIDTHS)
    assert all(p.stat().st_size > 5_000 for p in written)
