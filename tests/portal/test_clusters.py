"""One portal, several clusters: GPUPORTAL_CLUSTERS read strictly, Cluster rows recorded from it, a gateway
per cluster, the inventory sync per cluster (a fixed number of Slurm calls each), one cluster down
leaving the others syncing and /healthz naming it. Against the real local clusters: 22.05, and a
copy of its configuration whose controller port nothing listens on (the shared daemons are never
stopped); the 25.11 cluster where it is built."""

from __future__ import annotations

import socket

import pytest
from django.core.exceptions import ImproperlyConfigured

import portal.slurm as slurm
from portal.env import Env
from portal.models import Cluster, NodeInfo, PartitionInfo, SyncStatus
from portal.services import cluster_sync, clusters_record, clusters_sync
from portal.slurm import ClusterConfig, configured_clusters, get_gateway
from portal.slurm.clusters import ClusterConfigError, parse_clusters
from tests.support import CountingGateway, cluster_env

pytestmark = pytest.mark.django_db


# ---------------------------------------------------------------- configuration


def test_gpuportal_clusters_are_read_from_the_key_value_form_and_from_json():
    text = "name=gpuportal,backend=cli,conf=/etc/slurm/slurm.conf;name=gpuportal25,backend=pyslurm,conf=/x/slurm.conf,bin=/x/bin,lib=/x/lib"
    expected = (
        ClusterConfig("gpuportal", "cli", "/etc/slurm/slurm.conf"),
        ClusterConfig("gpuportal25", "pyslurm", "/x/slurm.conf", "/x/bin", "/x/lib"),
    )
    assert parse_clusters(text) == expected
    json_text = '[{"name": "gpuportal", "backend": "cli", "conf": "/etc/slurm/slurm.conf"}, ' \
                '{"name": "gpuportal25", "backend": "pyslurm", "conf": "/x/slurm.conf", "bin": "/x/bin", "lib": "/x/lib"}]'
    assert parse_clusters(json_text) == expected
    assert parse_clusters("name=solo") == (ClusterConfig("solo", "auto"),)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name=a;name=a", "named twice"),
        ("name=a,backend=slurmrestd", "backend 'slurmrestd'"),
        ("name=a,config=/x", "unknown key 'config'"),
        ("name=A B", "not a Slurm cluster name"),
        ("backend=cli", "not a Slurm cluster name"),
        ("name=a,conf", "not key=value"),
        ("[{]", "not valid JSON"),
        ('[{"name": "a", "conf": 1}]', "every value is a string"),
        (";", "at least one cluster"),
    ],
)
def test_a_bad_gpuportal_clusters_stops_start_up_naming_the_variable(text, says):
    with pytest.raises(ClusterConfigError, match=says):
        parse_clusters(text)
    with pytest.raises(ImproperlyConfigured, match=r"GPUPORTAL_CLUSTERS=.*" + says.replace("(", r"\(")):
        Env({"GPUPORTAL_CLUSTERS": text}).clusters("GPUPORTAL_CLUSTERS", [])


def test_without_gpuportal_clusters_the_one_cluster_of_the_slurm_variables_is_served(settings):
    settings.GPUPORTAL_CLUSTERS = ()
    settings.SLURM_CLUSTER, settings.SLURM_BACKEND, settings.SLURM_CONF = "site", "cli", "/etc/site/slurm.conf"
    settings.SLURM_BIN_DIR, settings.SLURM_LIB_DIR = "/opt/site/bin", "/opt/site/lib"
    assert configured_clusters() == (ClusterConfig("site", "cli", "/etc/site/slurm.conf", "/opt/site/bin", "/opt/site/lib"),)
    assert Env({}).clusters("GPUPORTAL_CLUSTERS", []) == ()


def test_configured_clusters_are_recorded_and_one_no_longer_configured_becomes_inactive(settings):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("alpha", "cli", "/a/slurm.conf"), ClusterConfig("beta", "pyslurm", "/b/slurm.conf", "/b/bin", "/b/lib"))
    clusters_record()
    rows = {c.name: c for c in Cluster.objects.filter(name__in=["alpha", "beta"])}
    assert (rows["alpha"].is_default, rows["alpha"].backend, rows["alpha"].slurm_conf) == (True, "cli", "/a/slurm.conf")
    assert (rows["beta"].is_default, rows["beta"].bin_dir, rows["beta"].lib_dir, rows["beta"].active) == (False, "/b/bin", "/b/lib", True)
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("beta", "cli", "/b/slurm.conf"),)
    clusters_record()
    assert Cluster.objects.get(is_default=True).name == "beta"
    assert not Cluster.objects.get(name="alpha").active
    assert Cluster.objects.get(name="beta").backend == "cli"


def test_each_cluster_gets_its_own_gateway_with_its_slurm_conf_bin_and_lib_dirs(settings):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("alpha", "cli", "/a/slurm.conf"), ClusterConfig("beta", "cli", "/b/slurm.conf", "/b/bin", "/b/lib"))
    slurm.reset_gateway()
    try:
        alpha, beta = get_gateway("alpha"), get_gateway("beta")
        assert get_gateway() is alpha and get_gateway("beta") is beta  # built once per process
        assert (alpha.cluster, alpha.slurm_conf, alpha.bin_dir) == ("alpha", "/a/slurm.conf", "")
        assert (beta.cluster, beta.slurm_conf, beta._exe("sbatch")) == ("beta", "/b/slurm.conf", "/b/bin/sbatch")
        assert beta._env["SLURM_CONF"] == "/b/slurm.conf" and beta._env["LD_LIBRARY_PATH"].split(":")[0] == "/b/lib"
        assert alpha._env["SLURM_CONF"] == "/a/slurm.conf"
        with pytest.raises(KeyError, match="'gamma' is not configured"):
            get_gateway("gamma")
    finally:
        slurm.reset_gateway()


def test_the_beat_runs_the_slurm_reads_once_per_cluster(settings):
    from portal.project.celery import _beat_schedule

    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("alpha"), ClusterConfig("beta"))
    schedule = _beat_schedule()
    for task, name in (("portal.tasks.cluster_sync_task", "cluster-sync"), ("jobs.tasks.jobs_sync_task", "jobs-sync"),
                       ("accounting.tasks.usage_ingest_task", "usage-ingest"),
                       ("accounting.tasks.rollup_check_task", "accounting-rollup")):  # fmt: skip
        entries = {key: entry["kwargs"] for key, entry in schedule.items() if entry["task"] == task}
        assert entries == {name: {"cluster": "alpha"}, f"{name}@beta": {"cluster": "beta"}}


# ---------------------------------------------------------------- against real clusters


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def dead_cluster_conf(settings, tmp_path):
    """The local 22.05 cluster's slurm.conf with SlurmctldPort moved to a port nothing listens on: a
    cluster whose controller does not answer, without touching the shared daemons."""
    if not settings.SLURM_CONF:
        pytest.skip("no local cluster configuration (scripts/cluster up)")
    from pathlib import Path

    text = Path(settings.SLURM_CONF).read_text()
    lines = [f"SlurmctldPort={_free_port()}" if line.startswith("SlurmctldPort=") else line for line in text.splitlines()]
    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return str(conf)


@pytest.fixture
def live_and_dead(settings, dead_cluster_conf, cluster):
    """Two clusters: the live local one (the default) and ``downsite`` whose controller does not answer."""
    settings.SLURM_TIMEOUT = 3
    live = ClusterConfig(settings.SLURM_CLUSTER, "cli", settings.SLURM_CONF, settings.SLURM_BIN_DIR)
    settings.GPUPORTAL_CLUSTERS = (live, ClusterConfig("downsite", "cli", dead_cluster_conf))
    slurm.reset_gateway()
    clusters_record()
    yield live
    slurm.reset_gateway()


@pytest.mark.slurm
def test_one_cluster_down_leaves_the_other_syncing_and_healthz_names_the_down_one(live_and_dead, client):
    results = clusters_sync()
    names = {p.name for p in slurm.get_gateway(live_and_dead.name).partitions()}  # scontrol's (gpu, debug, train)
    assert results[live_and_dead.name] == {"partitions": len(names), "nodes": 3}
    assert results["downsite"].startswith("unavailable")
    assert set(PartitionInfo.objects.filter(cluster__name=live_and_dead.name).values_list("name", flat=True)) == names
    assert not PartitionInfo.objects.filter(cluster__name="downsite").exists()
    assert SyncStatus.objects.get(kind="cluster").failing_since is None
    down = SyncStatus.objects.get(kind="cluster:downsite")
    assert down.failing_since is not None and down.last_success_at is None

    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 200, body  # the portal still serves the live cluster
    assert body["status"] == "degraded" and body["failing"] == ["slurm"]
    assert body["checks"]["slurm"]["down"] == ["downsite"]
    assert body["checks"]["slurm"]["clusters"][live_and_dead.name]["ok"] is True
    assert body["checks"]["slurm"]["clusters"]["downsite"]["ok"] is False
    assert body["checks"]["slurm"]["error"].startswith("downsite: ")

    cluster_sync(cluster=live_and_dead.name)  # the next beat: still fine for the live one
    assert SyncStatus.objects.get(kind="cluster").failing_since is None


@pytest.mark.slurm
def test_healthz_is_503_when_every_cluster_is_down(live_and_dead, dead_cluster_conf, settings, client):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(live_and_dead.name, "cli", dead_cluster_conf), ClusterConfig("downsite", "cli", dead_cluster_conf))
    slurm.reset_gateway()
    clusters_sync()
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["slurm"]["down"] == [live_and_dead.name, "downsite"]


@pytest.mark.slurm
def test_two_real_clusters_are_synced_each_with_one_partitions_and_one_nodes_call(settings, cluster):
    """22.05 (cli) and 25.11 (its default backend): each cluster's inventory recorded under its own
    Cluster row, one partitions() and one nodes() call per cluster per cycle."""
    env25 = cluster_env("25.11")
    settings.GPUPORTAL_CLUSTERS = (
        ClusterConfig(settings.SLURM_CLUSTER, "cli", settings.SLURM_CONF, settings.SLURM_BIN_DIR),
        ClusterConfig(env25["SLURM_CLUSTER"], "auto", env25["SLURM_CONF"], env25["SLURM_BIN_DIR"], env25.get("SLURM_LIB_DIR", "")),
    )
    slurm.reset_gateway()
    clusters_record()
    try:
        counting = {c.name: CountingGateway(get_gateway(c.name)) for c in configured_clusters()}
        slurm._gateways.update(counting)
        results = clusters_sync()
        for name, gateway in counting.items():
            assert results[name] == {"partitions": 3, "nodes": 3}, results
            assert (gateway.calls["partitions"], gateway.calls["nodes"], gateway.calls["policy"]) == (1, 1, 1), name
            assert set(NodeInfo.objects.filter(cluster__name=name).values_list("name", flat=True)) == {"a100-01", "a100-02", "h100-01"}
        assert PartitionInfo.objects.filter(name="gpu").count() == 2  # one per cluster
        assert SyncStatus.objects.get(kind=f"cluster:{env25['SLURM_CLUSTER']}").failing_since is None
    finally:
        slurm.reset_gateway()


@pytest.mark.django_db(transaction=True)
def test_an_upgraded_site_records_a_second_clusters_policy():
    """Before clusters the one policy row was written with pk=1 (the id sequence never moved): the
    migration puts the sequence past it, so the second cluster's policy row gets a fresh id."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    before = [("portal", "0005_cluster_policy_and_node_features")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    old.get_model("portal", "ClusterPolicyInfo").objects.create(pk=1, qos=["normal"], seen_at=timezone.now())
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from portal.models import Cluster, ClusterPolicyInfo

    second = Cluster.objects.create(name="second", backend="cli")
    policy = ClusterPolicyInfo.objects.create(cluster=second, qos=["normal"], seen_at=timezone.now())
    assert policy.pk != 1
    assert ClusterPolicyInfo.objects.count() == 2
