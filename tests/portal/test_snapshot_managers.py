"""portal.snapshots.SnapshotManager: every way a cached model's rows are written moves its snapshot —
save, delete, a queryset's update(), bulk_create(), bulk_update() and delete(), the admin, the
cluster records — so the next read sees the rows (this process) and the version in the cache has
moved (every other process); and a new job never points at the snapshot's shared Cluster row."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.inventory import inventory
from portal.models import Cluster, ClusterPolicyInfo, NodeInfo, PartitionInfo
from portal.snapshots import INVENTORY, snapshot_version

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_cache(settings):
    """A cache of this test's own: other test runs on the machine flush the shared Redis cache database."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "snapmgr"}}


def _version() -> str | None:
    return snapshot_version(INVENTORY)


def _warm() -> str | None:
    inventory()
    return _version()


def _node(name: str) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", partitions=["gpu"], gpu_type="h100", gpus_total=4, cpus_total=32,
                    memory_mb=256000, seen_at=timezone.now())  # fmt: skip


def test_a_querysets_update_is_seen_at_the_next_read(inventory_small):
    before = _warm()
    PartitionInfo.objects.filter(name="gpu").update(max_time_minutes=30)
    assert inventory().capacity("gpu").max_time_minutes == 30
    assert _version() != before


def test_bulk_create_and_bulk_update_are_seen_at_the_next_read(inventory_small):
    before = _warm()
    NodeInfo.objects.bulk_create([_node("h100-01")])
    (part,) = PartitionInfo.objects.filter(name="gpu")
    part.node_names = ["a100-01", "h100-01"]
    PartitionInfo.objects.bulk_update([part], ["node_names"])
    assert inventory().capacity("gpu").gpu_types == ["a100", "h100"]
    assert _version() != before


def test_a_save_and_the_querysets_delete_are_seen_at_the_next_read(inventory_small):
    before = _warm()
    part = PartitionInfo.objects.get(name="gpu")
    part.default_time_minutes = 15
    part.save()
    assert inventory().capacity("gpu").default_time_minutes == 15
    moved = _version()
    assert moved != before
    PartitionInfo.objects.filter(name="gpu").delete()
    assert inventory().capacity("gpu") is None
    assert _version() != moved


def test_an_instances_delete_is_seen_at_the_next_read(inventory_small):
    _warm()
    NodeInfo.objects.get(name="a100-01").delete()
    assert inventory().capacity("gpu").nodes == ()


def test_an_admin_edit_of_a_partition_is_seen_at_the_next_read(inventory_small, client_for):
    part = PartitionInfo.objects.get(name="gpu")
    before = _warm()
    client = client_for("admin")
    page = client.get(f"/admin/portal/partitioninfo/{part.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields if name != "seen_at"}
    data.update({"max_time_minutes": 45, "node_names": '["a100-01"]', "seen_at_0": f"{part.seen_at:%Y-%m-%d}",
                 "seen_at_1": f"{part.seen_at:%H:%M:%S}"})  # fmt: skip
    data = {k: ("" if v is None else v) for k, v in data.items()}
    response = client.post(f"/admin/portal/partitioninfo/{part.pk}/change/", data)
    assert response.status_code == 302, getattr(response, "context", None) and response.context["adminform"].form.errors
    assert inventory().capacity("gpu").max_time_minutes == 45
    assert _version() != before


def test_recording_the_clusters_moves_the_inventory(inventory_small):
    from portal.services import clusters_record

    before = _warm()
    clusters_record()
    assert _version() != before


def test_a_cluster_policy_change_is_seen_at_the_next_read(inventory_small):
    cluster = Cluster.objects.get(is_default=True)
    _warm()
    ClusterPolicyInfo.objects.update_or_create(
        cluster=cluster, defaults={"qos": ["normal", "long"], "max_array_size": 7, "seen_at": timezone.now()}
    )
    capacity = inventory().capacity("gpu")
    assert inventory().policy(capacity).max_array_size == 7


def test_a_new_job_gets_its_own_copy_of_the_cluster_row(inventory_small):
    capacity = inventory().capacity("gpu")
    first, second = capacity.cluster_for_job(), capacity.cluster_for_job()
    assert first.pk == second.pk == capacity.cluster_row.pk
    assert first is not capacity.cluster_row and first is not second
    first.name = "changed"
    assert capacity.cluster_row.name != "changed"
