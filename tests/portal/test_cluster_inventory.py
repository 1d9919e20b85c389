"""Cluster inventory: sync_cluster reads partitions and nodes from the real local cluster; pages and
API show GPUs per type and partition; when Slurm cannot be read they say the data is stale — never zeros."""

from __future__ import annotations

import io
import os
import re
import subprocess

import pytest
from django.conf import settings
from django.core.management import call_command

from portal.models import ClusterPolicyInfo, NodeInfo, PartitionInfo, SyncStatus
from portal.services import cluster_sync
from portal.slurm import SlurmUnavailable, get_gateway, reset_gateway
from portal.slurm.cli import _clean_env
from tests.support import CountingGateway, skip_unless_ci

pytestmark = [pytest.mark.django_db, pytest.mark.slurm]


@pytest.fixture
def gateway():
    reset_gateway()
    yield get_gateway()
    reset_gateway()


@pytest.fixture
def slurm_commands(monkeypatch):
    """Every Slurm command the gateway runs during the test, as its argv with the executable's path
    cut to its name (``("scontrol", "show", "node", "-o")``): the cli backend runs each command with
    subprocess.run, and the pyslurm backend runs the ones it delegates through the cli backend."""
    commands: list[tuple[str, ...]] = []
    real_run = subprocess.run

    def run(argv, *args, **kwargs):
        commands.append((os.path.basename(argv[0]), *argv[1:]))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr("portal.slurm.cli.subprocess.run", run)
    return commands


def reads_of(commands, what: str) -> int:
    """How many of ``commands`` read ``what`` ("node", "partition") from slurmctld."""
    return sum(1 for argv in commands if argv[:3] == ("scontrol", "show", what))


def test_sync_cluster_records_partitions_nodes_and_policy_in_a_fixed_number_of_slurm_calls(gateway, use_gateway, slurm_commands):
    counting = use_gateway(CountingGateway(gateway))
    out = io.StringIO()
    call_command("sync_cluster", stdout=out)
    assert dict(counting.calls) == {"nodes": 1, "partitions": 1, "policy": 1, "version": 1}
    if gateway.name == "cli":  # partitions and nodes (with the nodes' features and the partitions'
        # allocation flags); the policy's three (QOS, associations, config); the version: none per
        # node, QOS or account
        assert sorted(argv[0] for argv in slurm_commands) == ["sacctmgr", *["scontrol"] * 4, "sinfo"]
        assert (reads_of(slurm_commands, "node"), reads_of(slurm_commands, "partition")) == (1, 1)
    assert f"Recorded {len(gateway.partitions())} partitions and {len(gateway.nodes())} nodes." in out.getvalue()

    gpu = PartitionInfo.objects.get(name="gpu")
    assert (gpu.is_default, gpu.max_time_minutes, gpu.default_time_minutes) == (True, 72 * 60, 60)
    debug = PartitionInfo.objects.get(name="debug")
    assert (debug.is_default, debug.max_time_minutes, debug.default_time_minutes) == (False, 60, 10)
    nodes = {n.name: n for n in NodeInfo.objects.all()}
    assert set(nodes) == {"a100-01", "a100-02", "h100-01"}
    assert [(nodes[n].gpu_type, nodes[n].gpus_total) for n in sorted(nodes)] == [("a100", 4), ("a100", 4), ("h100", 4)]
    assert SyncStatus.objects.get(kind="cluster").failing_since is None


def test_one_sync_reads_the_nodes_and_the_partitions_once_on_every_backend(slurm_target, slurm_commands, use_gateway):
    """Issue 39: the policy no longer reads ``scontrol show node/partition`` a second time. cli (22.05,
    25.11): one ``scontrol show node`` and one ``scontrol show partition`` in the whole cycle; pyslurm
    (25.11): the nodes once through pyslurm (Nodes.load in nodes()), no ``scontrol show node``, and
    the partitions once through scontrol (see PyslurmGateway.partitions). The features and limits
    recorded are still the cluster's."""
    gateway = get_gateway()
    assert gateway.name == slurm_target.backend
    try:
        gateway.ping()
    except SlurmUnavailable as exc:
        skip_unless_ci(f"Slurm {slurm_target.release} cluster not up: {exc}")
    counting = use_gateway(CountingGateway(gateway))
    slurm_commands.clear()
    assert cluster_sync() == {"partitions": 3, "nodes": 3}
    assert (counting.calls["nodes"], counting.calls["partitions"], counting.calls["policy"]) == (1, 1, 1)
    node_reads, partition_reads = reads_of(slurm_commands, "node"), reads_of(slurm_commands, "partition")
    if slurm_target.backend == "cli":
        assert (node_reads, partition_reads) == (1, 1), slurm_commands
        assert len(slurm_commands) == 6, slurm_commands  # + assoc_mgr qos, sacctmgr assoc, show config, sinfo --version
    else:
        assert (node_reads, partition_reads) == (0, 1), slurm_commands
        assert len(slurm_commands) == 5, slurm_commands  # the same but the nodes, read by pyslurm
    assert {n.name: n.features for n in NodeInfo.objects.all()} == {"a100-01": ["a100"], "a100-02": ["a100"], "h100-01": ["h100"]}
    limits = ClusterPolicyInfo.objects.get().partition_limits
    assert limits["train"]["exclusive"] is True and limits["gpu"]["exclusive"] is False
    assert set(limits) == {"gpu", "debug", "train"}


def test_sync_cluster_records_what_the_cluster_itself_says_about_qos_features_and_array_size(gateway):
    """Compared with Slurm's own commands, run here (the local cluster has no node features: its
    nodes record none, and a constraint is then refused by the spec; see tests/jobs/test_spec_policy.py)."""
    cluster_sync()
    env = _clean_env(settings.SLURM_CONF)
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, env=env, check=True).stdout
    qos = subprocess.run(["sacctmgr", "-nP", "show", "qos", "format=name"], capture_output=True, text=True, env=env, check=True).stdout
    nodes = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, env=env, check=True).stdout
    policy = ClusterPolicyInfo.objects.get()
    assert policy.max_array_size == int(re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.M).group(1))
    assert sorted(policy.qos) == sorted(qos.split()) and "normal" in policy.qos
    assert "normal" in policy.account_qos["root"]
    features = dict(re.findall(r"NodeName=(\S+) .*?AvailableFeatures=(\S+)", nodes))
    for node in NodeInfo.objects.all():
        assert ",".join(node.features) == ("" if features[node.name] == "(null)" else features[node.name])


def test_without_slurmdbd_the_partitions_and_nodes_are_still_recorded_and_the_last_policy_stays(gateway, use_gateway):
    """sacctmgr needs slurmdbd, which the shared cluster must keep: its failure is the one thing faked."""
    cluster_sync()
    ClusterPolicyInfo.objects.update(qos=["normal", "high"], partition_limits={"gpu": {"exclusive": True}})
    NodeInfo.objects.filter(name="a100-01").update(features=["ib"])
    PartitionInfo.objects.filter(name="debug").update(max_time_minutes=1)

    class NoSlurmdbd(CountingGateway):
        def policy(self):
            raise SlurmUnavailable("sacctmgr: error: Problem talking to the database: Connection refused", command="sacctmgr")

    use_gateway(NoSlurmdbd(gateway))
    assert cluster_sync() == {"partitions": 3, "nodes": 3}
    assert PartitionInfo.objects.get(name="debug").max_time_minutes == 60  # read again
    assert ClusterPolicyInfo.objects.get().qos == ["normal", "high"]  # the last policy read, limits included
    assert ClusterPolicyInfo.objects.get().partition_limits == {"gpu": {"exclusive": True}}
    assert NodeInfo.objects.get(name="a100-01").features == ["a100"]  # read again, with the nodes
    status = SyncStatus.objects.get(kind="cluster")
    assert status.failing_since is None and "Problem talking to the database" in status.data["policy_error"]


def test_cluster_api_shows_gpus_per_type_and_partition(gateway, api_client_for):
    cluster_sync()
    response = api_client_for("member").get("/api/v1/cluster/")
    assert response.status_code == 200
    body = response.json()
    by_type = {row["gpu_type"]: row for row in body["gpu_types"]}
    assert by_type["a100"]["total"] == 8 and by_type["h100"]["total"] == 4
    for row in by_type.values():
        assert row["free"] + row["allocated"] + row["unavailable"] == row["total"]
    parts = {p["name"]: p for p in body["partitions"]}
    assert parts["gpu"]["gpus_total"] == 12 and parts["gpu"]["max_gpus_per_node"] == 4
    assert parts["gpu"]["gpu_types"] == ["a100", "h100"]
    assert body["stale"] is False and body["last_success_at"]


def test_when_slurm_cannot_be_read_the_page_says_stale_since_when_and_keeps_the_last_figures(
    gateway, settings, client_for, api_client_for
):
    cluster_sync()
    settings.SLURM_BIN_DIR = "/nonexistent-slurm-bin"  # every Slurm command now fails to start
    reset_gateway()
    with pytest.raises(SlurmUnavailable):
        cluster_sync()
    status = SyncStatus.objects.get(kind="cluster")
    assert status.failing_since is not None and status.last_success_at is not None

    page = client_for("member").get("/")
    text = page.content.decode()
    assert "Cluster data is stale" in text
    assert status.failing_since.strftime("%Y-%m-%d %H:%M") in text
    assert "free of 8" in text  # the last good figures, not zeros

    body = api_client_for("member").get("/api/v1/cluster/").json()
    assert body["stale"] is True and body["failing_since"]
    assert {r["gpu_type"]: r["total"] for r in body["gpu_types"]} == {"a100": 8, "h100": 4}


def test_nothing_read_yet_says_so_instead_of_showing_zeros(client_for):
    text = client_for("member").get("/").content.decode()
    assert "The cluster has not been read yet" in text
    assert "free of 0" not in text
