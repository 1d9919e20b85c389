"""Fixtures for the jobs tests: a synced-looking inventory for unit tests and a gateway wrapper that
counts calls to the REAL gateway. The local cluster and the real Celery worker are shared fixtures
in tests/conftest.py."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.models import NodeInfo, PartitionInfo
from tests.support import CountingGateway, job_payload, slurm_tags, wait_for  # noqa: F401 (re-exported)

# ---------------------------------------------------------------- unit-test helpers


@pytest.fixture
def inventory(db):
    """The local cluster's shape as sync_cluster would record it: partitions gpu (default, 60 min
    default, 72 h max) and debug (10 min / 60 min) on a100-01, a100-02 (4×a100) and h100-01 (4×h100)."""
    now = timezone.now()
    names = ["a100-01", "a100-02", "h100-01"]
    PartitionInfo.objects.create(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320, node_names=names, seen_at=now)
    PartitionInfo.objects.create(name="debug", is_default=False, state="UP", default_time_minutes=10, max_time_minutes=60, node_names=names, seen_at=now)
    for name in names:
        NodeInfo.objects.create(
            name=name, state="IDLE", partitions=["gpu", "debug"], gpu_type=name.split("-")[0], gpus_total=4,
            cpus_total=32, memory_mb=256000, seen_at=now,
        )  # fmt: skip
    _as_committed()


def _as_committed() -> None:
    """The inventory's rows are as a sync committed them before the test, not a change of the
    test's own transaction (which would read them from the database at every call)."""
    from portal.snapshots import snapshots_forget

    snapshots_forget()


# ---------------------------------------------------------------- the real gateway, counted


@pytest.fixture
def counting_gateway(use_gateway):
    """The real gateway wrapped to count calls, in use for the test."""
    from portal.slurm import get_gateway

    return use_gateway(CountingGateway(get_gateway()))
