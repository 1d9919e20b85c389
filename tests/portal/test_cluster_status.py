"""The cluster status page and GET /api/v1/clusters/: one selector (portal.selectors.clusters_status)
for both — each cluster's name, Slurm version and relay backend (as its inventory sync found them),
health with its conditions, last sync, nodes and GPUs free per type, partitions and their limits."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import NodeInfo, PartitionInfo, SyncStatus
from portal.selectors import clusters_status
from portal.services import cluster_row, clusters_record, clusters_sync, sync_record_failure, sync_record_success
from portal.slurm import ClusterConfig
from tests.portal.test_clusters import dead_cluster_conf, live_and_dead  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_clusters(settings, world):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(settings.SLURM_CLUSTER, "cli"), ClusterConfig("east", "pyslurm"))
    clusters_record()
    main, east = cluster_row(settings.SLURM_CLUSTER), cluster_row("east")
    now = timezone.now()
    for cluster, name, gpu_type, total, allocated, state in (
        (main, "a100-01", "a100", 4, 1, "MIXED"), (main, "h100-01", "h100", 4, 0, "DRAIN"), (east, "a100-01", "a100", 8, 8, "ALLOCATED"),
    ):  # fmt: skip
        NodeInfo.objects.create(cluster=cluster, name=name, state=state, available=state != "DRAIN", partitions=["gpu"], gpu_type=gpu_type,
                                gpus_total=total, gpus_allocated=allocated, cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
    PartitionInfo.objects.create(cluster=main, name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320,
                                 node_names=["a100-01", "h100-01"], seen_at=now)  # fmt: skip
    PartitionInfo.objects.create(cluster=east, name="gpu", is_default=True, state="UP", max_time_minutes=None, node_names=["a100-01"],
                                 seen_at=now)  # fmt: skip
    sync_record_success("cluster", data={"slurm_version": "22.05.8", "relay_backend": "sbatch"})
    sync_record_success("cluster:east", data={"slurm_version": "25.11.7", "relay_backend": "pyslurm"})
    sync_record_failure("cluster:east", error="slurm_load_partitions: Unable to contact slurm controller")
    return main, east


def test_each_cluster_has_its_version_backend_health_gpus_and_partitions(two_clusters, settings, django_assert_num_queries):
    with django_assert_num_queries(5):
        main, east = clusters_status()
    assert (main["name"], main["is_default"], main["slurm_version"], main["relay_backend"]) == (settings.SLURM_CLUSTER, True, "22.05.8", "sbatch")
    assert (east["name"], east["slurm_version"], east["relay_backend"], east["configured_backend"]) == ("east", "25.11.7", "pyslurm", "pyslurm")
    assert {r["gpu_type"]: (r["free"], r["total"]) for r in main["gpu_types"]} == {"a100": (3, 4), "h100": (0, 4)}
    assert {r["gpu_type"]: (r["free"], r["total"]) for r in east["gpu_types"]} == {"a100": (0, 8)}
    assert [(p["name"], p["gpus_free"], p["gpus_total"], p["max_time_minutes"]) for p in main["partitions"]] == [("gpu", 3, 8, 4320)]
    assert [(p["name"], p["gpus_free"], p["gpus_total"], p["max_time_minutes"]) for p in east["partitions"]] == [("gpu", 0, 8, None)]
    # health: a list of conditions (more can be added), not one flag
    assert main["health"]["ok"] is False and [c["code"] for c in main["health"]["conditions"]] == ["nodes_unavailable"]
    assert "h100-01 (DRAIN)" in main["health"]["conditions"][0]["message"]
    assert [c["code"] for c in east["health"]["conditions"]] == ["sync_failing"]
    assert "Unable to contact" in east["health"]["conditions"][0]["message"]
    assert (main["nodes_available"], main["nodes_total"]) == (1, 2)


def test_the_page_and_the_api_show_the_same_clusters(two_clusters, client_for, world, settings):
    page = client_for("member").get("/clusters/")
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("22.05.8", "25.11.7", "pyslurm", "sbatch", 'data-condition="sync_failing"', 'data-condition="nodes_unavailable"',
                 'id="cluster-east"', f'id="cluster-{settings.SLURM_CLUSTER}"', "4320 min", "unlimited"):  # fmt: skip
        assert text in html, text
    api = APIClient()
    api.force_authenticate(world.alice)
    body = api.get("/api/v1/clusters/").json()
    assert body["count"] == 2
    by_name = {c["name"]: c for c in body["results"]}
    assert by_name["east"]["slurm_version"] == "25.11.7" and by_name["east"]["relay_backend"] == "pyslurm"
    assert by_name["east"]["health"]["conditions"][0]["code"] == "sync_failing"
    assert by_name[settings.SLURM_CLUSTER]["partitions"][0]["max_time_minutes"] == 4320
    assert by_name[settings.SLURM_CLUSTER]["gpu_types"][0] == {"gpu_type": "a100", "nodes": 1, "total": 4, "allocated": 1, "free": 3,
                                                               "unavailable": 0}  # fmt: skip


def test_the_dashboard_names_each_partitions_cluster(two_clusters, client_for, settings):
    html = client_for("member").get("/").content.decode()
    assert "<th>Cluster</th>" in html
    assert '<span class="badge cluster">east</span>' in html and f'<span class="badge cluster">{settings.SLURM_CLUSTER}</span>' in html
    assert 'href="/clusters/"' in html


@pytest.mark.slurm
def test_the_sync_records_the_slurm_version_and_relay_backend_and_a_dead_cluster_says_so(live_and_dead, client_for):  # noqa: F811
    clusters_sync()
    status = {c["name"]: c for c in clusters_status()}
    live = status[live_and_dead.name]
    assert live["slurm_version"].startswith(("22.05", "2")) and live["slurm_version"].count(".") == 2
    assert live["relay_backend"] == "sbatch"  # backend cli, not "auto": no native submit
    assert live["last_success_at"] is not None and live["partitions"]
    assert SyncStatus.objects.get(kind="cluster").data["slurm_version"] == live["slurm_version"]
    down = status["downsite"]
    assert down["slurm_version"] == "" and [c["code"] for c in down["health"]["conditions"]] == ["never_read"]
    html = client_for("member").get("/clusters/").content.decode()
    assert live["slurm_version"] in html and 'data-condition="never_read"' in html


def test_idle_nodes_with_gpus_allocated_are_a_condition_of_their_cluster(two_clusters, settings):
    """Slurm 22.05 can keep GPUs allocated on idle nodes after a controller takes control back (issue 42's
    site test: jobs pending on an idle cluster until `scontrol reconfigure`): the cluster's health names
    those nodes; an allocated or mixed node with GPUs allocated is not one."""
    main_cluster, _ = two_clusters
    NodeInfo.objects.create(cluster=main_cluster, name="a100-02", state="IDLE", partitions=["gpu"], gpu_type="a100",
                            gpus_total=4, gpus_allocated=4, cpus_total=32, memory_mb=256000, seen_at=timezone.now())  # fmt: skip
    main, east = clusters_status()
    assert [c["code"] for c in main["health"]["conditions"]] == ["nodes_unavailable", "gpus_held_by_no_job"]
    assert "a100-02 (4 of 4)" in main["health"]["conditions"][1]["message"]
    assert "a100-01" not in main["health"]["conditions"][1]["message"]  # MIXED with 1 allocated: a job holds it
    assert "gpus_held_by_no_job" not in [c["code"] for c in east["health"]["conditions"]]  # ALLOCATED 8 of 8
