"""Fixtures of the security tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def relays(monkeypatch):
    """No request of these tests may reach Slurm: relays and cancels are recorded, not run."""
    from jobs import tasks

    calls: dict[str, list[str]] = {"relay": [], "cancel": []}
    monkeypatch.setattr(tasks.job_relay, "delay", lambda job_id: calls["relay"].append(job_id))
    monkeypatch.setattr(tasks.job_cancel_relay, "delay", lambda job_id: calls["cancel"].append(job_id))
    return calls


@pytest.fixture
def inventory_small(db):
    """One partition 'gpu' (default) on one 4×a100 node, as a cluster sync would record it."""
    from django.utils import timezone

    from portal.models import NodeInfo, PartitionInfo

    now = timezone.now()
    PartitionInfo.objects.create(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=600,
                                 node_names=["a100-01"], seen_at=now)  # fmt: skip
    NodeInfo.objects.create(name="a100-01", state="IDLE", partitions=["gpu"], gpu_type="a100", gpus_total=4,
                            cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
