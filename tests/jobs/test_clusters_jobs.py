"""Jobs on several clusters: submission picks the cluster from the partition (the default cluster
when it is one of those that have it, as sbatch without --clusters; the explicit ``cluster`` field
chooses another; 400 naming ``cluster`` when only other clusters share the name), under the team's
account on that cluster; the relay, the sync (one squeue per cluster per cycle) and cancel use the
job's own cluster. The last tests run against both real local clusters (22.05 and 25.11), whose
partitions have the same names."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

import portal.slurm as slurm
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel, job_cancel_relay_run, job_relay_run, jobs_sync
from portal.models import NodeInfo, PartitionInfo, TeamClusterAccount
from portal.services import cluster_row, clusters_record, team_mirror
from portal.slurm import ClusterConfig, configured_clusters, get_gateway
from tests.support import job_overrides, CountingGateway, cluster_env, job_payload, skip_unless_ci, wait_for

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


@pytest.fixture
def two_inventories(settings, world):
    """Cluster ``main`` (the default: partitions gpu, debug) and ``east`` (gpu, h100only) as their
    syncs would record them; team vision has access to east as account ``vision-east``."""
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("main", "cli"), ClusterConfig("east", "cli"))
    clusters_record()
    main, east = cluster_row("main"), cluster_row("east")
    now = timezone.now()
    for cluster, partitions in ((main, ("gpu", "debug")), (east, ("gpu", "h100only"))):
        for index, name in enumerate(partitions):
            PartitionInfo.objects.create(cluster=cluster, name=name, is_default=index == 0, state="UP", default_time_minutes=60,
                                         max_time_minutes=600, node_names=[f"{cluster.name}-01"], seen_at=now)  # fmt: skip
        NodeInfo.objects.create(cluster=cluster, name=f"{cluster.name}-01", state="IDLE", partitions=list(partitions),
                                gpu_type="a100", gpus_total=4, cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
    TeamClusterAccount.objects.create(team=world.vision, cluster=east, slurm_account="vision-east")
    return main, east


def _submit(user, **fields):
    return client_for(user).post("/api/v1/jobs/", job_payload(gpus=1, **fields), format="json")


def test_a_partition_only_one_cluster_has_picks_that_cluster_and_the_teams_account_there(two_inventories, world):
    main, east = two_inventories
    response = _submit(world.alice, partition="h100only")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.cluster_id, response.json()["cluster"]) == (east.pk, "east")
    assert ["account", "vision-east"] in job_overrides(job)
    response = _submit(world.alice, partition="debug")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).cluster_id == main.pk
    assert ["account", "vision"] in job_overrides(Job.objects.get(pk=response.json()["id"]))


def _third_cluster_sharing(name: str):
    """Cluster ``west`` with a partition ``name`` (east has one too) and vision's account there."""
    from portal.snapshots import INVENTORY, snapshot_changed

    settings_clusters = list(configured_clusters()) + [ClusterConfig("west", "cli")]
    from django.conf import settings

    settings.GPUPORTAL_CLUSTERS = tuple(settings_clusters)
    clusters_record()
    west = cluster_row("west")
    PartitionInfo.objects.create(cluster=west, name=name, is_default=True, state="UP", default_time_minutes=60,
                                 max_time_minutes=600, node_names=["west-01"], seen_at=timezone.now())  # fmt: skip
    NodeInfo.objects.create(cluster=west, name="west-01", state="IDLE", partitions=[name], gpu_type="a100",
                            gpus_total=4, cpus_total=32, memory_mb=256000, seen_at=timezone.now())  # fmt: skip
    snapshot_changed(INVENTORY)
    return west


def test_a_partition_the_default_cluster_shares_goes_there_and_cluster_chooses_another(two_inventories, world):
    main, east = two_inventories
    response = _submit(world.alice, partition="gpu")  # main and east have it: main is the default
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).cluster_id == main.pk
    response = _submit(world.alice, partition="gpu", cluster="east")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).cluster_id == east.pk
    # no partition: the default cluster's default partition
    response = _submit(world.alice, partition="")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.cluster_id, job.partition) == (main.pk, "gpu")


def test_a_partition_only_other_clusters_share_needs_the_cluster_field(two_inventories, world):
    main, east = two_inventories
    west = _third_cluster_sharing("h100only")
    TeamClusterAccount.objects.create(team=world.vision, cluster=west, slurm_account="vision-west")
    response = _submit(world.alice, partition="h100only")
    assert response.status_code == 400
    body = response.json()
    assert "cluster" in body["errors"] and "east, west" in body["errors"]["cluster"][0], body
    response = _submit(world.alice, partition="h100only", cluster="west")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).cluster_id == west.pk


def test_an_unknown_cluster_or_one_the_team_has_no_account_on_is_a_400_naming_cluster(two_inventories, world):
    response = _submit(world.alice, partition="gpu", cluster="west")
    assert response.status_code == 400 and "No such cluster" in response.json()["errors"]["cluster"][0]
    response = _submit(world.carol, team="nlp", partition="h100only")  # nlp has no account on east
    assert response.status_code == 400
    assert "no Slurm account on cluster 'east'" in response.json()["errors"]["cluster"][0]
    assert not Job.objects.filter(team=world.nlp).exists()


def test_a_batch_may_span_clusters_and_errors_name_the_job(two_inventories, world):
    main, east = two_inventories
    client = client_for(world.alice)
    body = [job_payload(gpus=1, partition="debug"), job_payload(gpus=1, partition="h100only")]
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert [j["cluster"] for j in response.json()] == ["main", "east"]
    _third_cluster_sharing("h100only")
    response = client.post("/api/v1/jobs/", [job_payload(gpus=1, partition="debug"), job_payload(gpus=1, partition="h100only")], format="json")
    assert response.status_code == 400 and "cluster" in response.json()["errors"]["1"]


def test_the_quote_names_the_cluster_when_the_partition_is_ambiguous(two_inventories, world):
    client = client_for(world.alice)
    _third_cluster_sharing("h100only")
    answer = client.post("/api/v1/jobs/quote/", {"partition": "h100only", "gpus": 1, "time_limit_minutes": 60}, format="json")
    assert answer.status_code == 400 and "cluster" in answer.json()["errors"]
    answer = client.post("/api/v1/jobs/quote/", {"partition": "h100only", "cluster": "east", "gpus": 1, "time_limit_minutes": 60}, format="json")
    assert answer.status_code == 200, answer.json()


# ---------------------------------------------------------------- both real clusters


@pytest.fixture(params=["cli", "pyslurm"])
def both_clusters(request, settings, cluster):
    """22.05 (the default, cli) and 25.11 (cli, or pyslurm: one pyslurm cluster in this process
    beside a CLI one), both synced; the fixture world's teams have the same account names on 25.11,
    mirrored there."""
    if request.param == "pyslurm":
        from portal.slurm.pyslurm import pyslurm_version

        if pyslurm_version() is None:
            skip_unless_ci("pyslurm is not installed in this venv (scripts/pyslurm)")
    env25 = cluster_env("25.11")
    settings.GPUPORTAL_CLUSTERS = (
        ClusterConfig(settings.SLURM_CLUSTER, "cli", settings.SLURM_CONF, settings.SLURM_BIN_DIR),
        ClusterConfig(env25["SLURM_CLUSTER"], request.param, env25["SLURM_CONF"], env25["SLURM_BIN_DIR"],
                      env25.get("SLURM_LIB_DIR", "")),
    )  # fmt: skip
    slurm.reset_gateway()
    assert (get_gateway(settings.SLURM_CLUSTER).name, get_gateway(env25["SLURM_CLUSTER"]).name) == ("cli", request.param)
    clusters_record()
    from portal.services import cluster_sync

    for config in configured_clusters():
        cluster_sync(cluster=config.name)
    second = cluster_row(env25["SLURM_CLUSTER"])
    for team in (cluster.vision, cluster.nlp):
        TeamClusterAccount.objects.create(team=team, cluster=second, slurm_account=team.slurm_account)
        team_mirror(team=team)
    yield settings.SLURM_CLUSTER, env25["SLURM_CLUSTER"]
    slurm.reset_gateway()


@pytest.mark.slurm
def test_a_job_to_each_real_cluster_reaches_that_cluster_and_each_sync_makes_one_squeue(both_clusters, cluster):
    old, new = both_clusters
    client = client_for(cluster.alice)
    # both have "gpu": without a cluster, the default one (as sbatch without --clusters)
    answer = client.post("/api/v1/jobs/", job_payload(gpus=1, partition="gpu"), format="json").json()
    assert answer["cluster"] == old
    Job.objects.filter(pk=answer["id"]).delete()  # never relayed: the syncs below follow one job per cluster
    ids = {}
    for name in (old, new):
        response = client.post("/api/v1/jobs/", job_payload(name=f"to-{name}", gpus=1, partition="gpu", cluster=name,
                                                             script="#!/bin/bash\nsleep 300\n", time_limit_minutes=5), format="json")  # fmt: skip
        assert response.status_code == 201, response.json()
        ids[name] = response.json()["id"]
        assert job_relay_run(ids[name]) == "submitted"
    for name, other in ((old, new), (new, old)):
        job = Job.objects.get(pk=ids[name])
        assert job.slurm_cluster == name and job.slurm_job_id
        assert get_gateway(name).find_by_comment(job.slurm_tag) == job.slurm_job_id  # in its cluster …
        assert get_gateway(other).find_by_comment(job.slurm_tag) is None  # … and not in the other

    counting = {name: CountingGateway(get_gateway(name)) for name in (old, new)}
    slurm._gateways.update(counting)
    stats = {name: jobs_sync(cluster=name) for name in (old, new)}
    for name in (old, new):
        assert stats[name]["live"] == 1 and stats[name]["queue_calls"] == 1
        assert counting[name].calls["queue"] == 1, (name, dict(counting[name].calls))

    for name in (old, new):  # cancel: scancel on the job's own cluster
        job_cancel(user=cluster.alice, job=Job.objects.get(pk=ids[name]))
        assert job_cancel_relay_run(ids[name]) == "sent"

    def all_cancelled():
        for name in (old, new):
            jobs_sync(cluster=name)
        return all(Job.objects.get(pk=i).state == JobState.CANCELLED for i in ids.values())

    wait_for(all_cancelled, timeout=60, interval=0.5)


@pytest.mark.slurm
def test_an_option_only_25_11_has_is_refused_for_the_22_05_cluster_and_25_11_s_sbatch_takes_it(both_clusters, cluster):
    """Each cluster's Slurm release as its sync read it (sinfo --version): --tres-per-task is a 400
    naming the release and the line for 22.05, and the same script reaches 25.11's sbatch."""
    old, new = both_clusters
    script = "#!/bin/bash\n#SBATCH -p gpu -t 2 -n 2\n#SBATCH --tres-per-task=gres/gpu:1\nsleep 300\n"
    client = client_for(cluster.alice)
    refused = client.post("/api/v1/jobs/", {"team": "vision", "script": script, "cluster": old}, format="json")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["errors"]["script"] == [
        "line 3: #SBATCH --tres-per-task=gres/gpu:1: sbatch of Slurm 22.05 has no option --tres-per-task (25.11 has it)"
    ]
    accepted = client.post("/api/v1/jobs/", {"team": "vision", "script": script, "cluster": new}, format="json")
    assert accepted.status_code == 201, accepted.json()
    assert job_relay_run(accepted.json()["id"]) == "submitted"
    job = Job.objects.get(pk=accepted.json()["id"])
    assert job.slurm_cluster == new and get_gateway(new).find_by_comment(job.slurm_tag) == job.slurm_job_id
    job_cancel(user=cluster.alice, job=job)
    assert job_cancel_relay_run(job.pk) == "sent"


def test_the_form_offers_the_cluster_when_several_are_served_and_submits_there(two_inventories, world, client):
    main, east = two_inventories
    client.force_login(world.alice)
    page = client.get("/jobs/new/").content.decode()
    assert '<select name="cluster"' in page and '<option value="east">east</option>' in page
    assert "gpu (default) on east, main" in page  # one choice per partition name, naming its clusters
    body = {"team": "vision", "script": "#!/bin/bash\necho hi\n", "partition": "gpu", "cluster": "east", "gpus": "1",
            "idempotency_key": "form-east-1"}  # fmt: skip
    response = client.post("/jobs/new/", body)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Job.objects.get(idempotency_key="form-east-1").cluster_id == east.pk


def test_with_one_cluster_the_form_has_no_cluster_choice(inventory, world, client):
    client.force_login(world.alice)
    page = client.get("/jobs/new/").content.decode()
    assert '<input type="hidden" name="cluster"' in page and '<select name="cluster"' not in page
