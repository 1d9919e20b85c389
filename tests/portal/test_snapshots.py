"""portal/snapshots.py: the inventory and the rate book are read once per change, per process, and
every writer's change is seen at the next read."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from unittest import mock

import pytest
from django.utils import timezone

from accounting.rates import gpu_hour_price
from accounting.services import rate_create
from jobs.spec import inventory
from portal.models import NodeInfo, PartitionInfo
from portal.snapshots import INVENTORY, snapshot, snapshot_changed


@pytest.fixture(autouse=True)
def private_cache(settings):
    """A cache of this test's own: other test runs on the machine flush the shared Redis cache database."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "snap"}}


def test_the_inventory_is_read_once_until_the_sync_changes_it(world, inventory_small, django_assert_num_queries):
    with django_assert_num_queries(4):  # partitions (with their clusters), nodes, policies, clusters
        assert inventory().capacity("").name == "gpu"
    with django_assert_num_queries(0):
        assert inventory().capacity("gpu").max_time_minutes == 600
    # what cluster_sync does in its transaction
    PartitionInfo.objects.filter(name="gpu").update(max_time_minutes=30)
    NodeInfo.objects.create(name="h100-01", state="IDLE", partitions=["gpu"], gpu_type="h100", gpus_total=4,
                            cpus_total=32, memory_mb=256000, seen_at=timezone.now())  # fmt: skip
    PartitionInfo.objects.filter(name="gpu").update(node_names=["a100-01", "h100-01"])
    snapshot_changed(INVENTORY)
    capacity = inventory().capacity("gpu")
    assert capacity.max_time_minutes == 30 and capacity.gpu_types == ["a100", "h100"]


def test_another_process_sees_the_change_through_the_version_in_the_cache(world, inventory_small):
    from portal import snapshots

    assert inventory().capacity("gpu").max_time_minutes == 600
    held = dict(snapshots._held)
    PartitionInfo.objects.filter(name="gpu").update(max_time_minutes=45)
    snapshot_changed(INVENTORY)  # in "the writer's" process: moves the version in Redis
    snapshots._held.update(held)  # "another process" still holds the old copy under the old version
    assert inventory().capacity("gpu").max_time_minutes == 45


def test_a_new_rate_is_priced_at_the_next_quote(world):
    day = timezone.localdate() - dt.timedelta(days=1)
    rate_create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), effective_from=day)
    now = timezone.now()
    assert gpu_hour_price(gpu_type="a100", at=now)[0] == Decimal("10")
    rate_create(gpu_type="a100", price_per_gpu_hour=Decimal("11"), effective_from=timezone.localdate())
    assert gpu_hour_price(gpu_type="a100", at=now)[0] == Decimal("11")


def test_without_the_cache_the_rows_are_read_every_time(world, settings):
    loads = []

    def load():
        loads.append(1)
        return len(loads)

    with mock.patch("portal.snapshots.cache.get", side_effect=ConnectionError("redis down")):
        assert snapshot("test-down", load) == 1
        assert snapshot("test-down", load) == 2
    assert snapshot("test-down", load) == 3  # the cache is back: a first copy …
    assert snapshot("test-down", load) == 3  # … then kept
    settings.SNAPSHOT_MAX_AGE_SECONDS = 0
    assert snapshot("test-down", load) == 4
