"""Submission to a Kubernetes cluster (issue 41): what a batch/v1 Job cannot express is a 400 at
submission naming the directive (or field) and why — several nodes, a reservation, a QOS, an srun
step — and nothing is stored; a job it can express is accepted on that cluster under the team's
namespace. The inventory is the one the Kubernetes cluster's sync records (its GPU nodes in one
partition, tests/k8s/test_kubernetes_jobs.py reads it from the real API server); the cluster page and
the API list the cluster with its scheduler and version."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Job
from portal.models import NodeInfo, PartitionInfo, SyncStatus, TeamClusterAccount
from portal.selectors import clusters_status
from portal.services import cluster_row, clusters_record, sync_record_success
from portal.slurm import ClusterConfig, configured_clusters, slurm_clusters
from tests.support import job_overrides, job_payload

pytestmark = pytest.mark.django_db

K8S = "gpuportal-k8s"


@pytest.fixture
def kube_inventory(settings, world):
    """``main`` (Slurm, the default: partition gpu) and ``gpuportal-k8s`` (Kubernetes: its partition
    and two GPU nodes as its sync records them); team vision's namespace there is ``vision-ns``."""
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("main", "cli"),
                                   ClusterConfig(K8S, "kubernetes", kind="kubernetes", kubeconfig="/nonexistent"))  # fmt: skip
    clusters_record()
    main, kube = cluster_row("main"), cluster_row(K8S)
    now = timezone.now()
    PartitionInfo.objects.create(cluster=main, name="gpu", is_default=True, state="UP", default_time_minutes=60,
                                 max_time_minutes=600, node_names=["main-01", "main-02"], seen_at=now)  # fmt: skip
    for node in ("main-01", "main-02"):
        NodeInfo.objects.create(cluster=main, name=node, state="IDLE", partitions=["gpu"], gpu_type="a100", gpus_total=4,
                                cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
    PartitionInfo.objects.create(cluster=kube, name="kubernetes", is_default=True, state="UP", node_names=["k8s-a100-01", "k8s-h100-01"],
                                 seen_at=now)  # fmt: skip
    for node, gpu_type in (("k8s-a100-01", "a100"), ("k8s-h100-01", "h100")):
        NodeInfo.objects.create(cluster=kube, name=node, state="IDLE", partitions=["kubernetes"], gpu_type=gpu_type,
                                gpus_total=4, cpus_total=16, memory_mb=64000, seen_at=now)  # fmt: skip
    TeamClusterAccount.objects.create(team=world.vision, cluster=kube, slurm_account="vision-ns")
    return main, kube


def _submit(user, **fields):
    client = APIClient()
    client.force_authenticate(user=user)
    body = job_payload(cluster=K8S, **({"gpus": 1} | fields))
    body.pop("partition")
    return client.post("/api/v1/jobs/", body, format="json")


def test_a_job_kubernetes_can_run_is_accepted_on_that_cluster_under_the_teams_namespace(kube_inventory, world):
    _, kube = kube_inventory
    response = _submit(world.alice, gpu_type="h100")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.cluster_id, response.json()["cluster"]) == (kube.pk, K8S)
    assert ["account", "vision-ns"] in job_overrides(job)
    assert (job.request["gpus"], job.request["gpu_type"]) == (1, "h100")


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"nodes": 2, "gpus": 2}, "nodes", "--nodes cannot run on Kubernetes cluster 'gpuportal-k8s': several nodes"),
        ({"nodes": None, "script": "#!/bin/bash\n#SBATCH --nodes=3\necho hi\n"}, "script", "--nodes=3: --nodes cannot run"),
        ({"script": "#!/bin/bash\n#SBATCH --reservation=maint\necho hi\n"}, "script", "a Slurm reservation has no counterpart"),
        ({"script": "#!/bin/bash\n#SBATCH --qos=high\necho hi\n"}, "script", "a Slurm QOS"),
        ({"script": "#!/bin/bash\necho start\nsrun python train.py\n"}, "script", "Line 3: srun steps"),
    ],
)
def test_what_kubernetes_cannot_express_is_a_400_naming_it_and_nothing_is_stored(kube_inventory, world, fields, field, says):
    response = _submit(world.alice, **fields)
    assert response.status_code == 400, response.json()
    assert any(says in message for message in response.json()["errors"][field]), response.json()
    assert not Job.objects.exists()


def test_an_array_with_a_limit_on_the_tasks_at_once_is_accepted_the_portal_enforces_it(kube_inventory, world):
    response = _submit(world.alice, array="0-3%2")
    assert response.status_code == 201, response.json()
    assert (Job.objects.get(pk=response.json()["id"]).array_tasks, Job.objects.get().array_throttle) == (4, 2)


def test_the_same_two_node_job_goes_to_the_slurm_cluster(kube_inventory, world):
    client = APIClient()
    client.force_authenticate(user=world.alice)
    response = client.post("/api/v1/jobs/", job_payload(nodes=2, gpus=2, partition="gpu"), format="json")
    assert response.status_code == 201, response.json()


def test_the_kubernetes_cluster_is_listed_with_its_scheduler_and_version_and_left_out_of_slurms_paths(kube_inventory, world):
    sync_record_success(SyncStatus.kind_for("cluster", K8S), data={"slurm_version": "v1.20.2", "relay_backend": "kubernetes"})
    sync_record_success(SyncStatus.kind_for("cluster", "main"), data={"slurm_version": "22.05.8", "relay_backend": "sbatch"})
    rows = {row["name"]: row for row in clusters_status()}
    assert (rows[K8S]["kind"], rows[K8S]["version"], rows[K8S]["relay_backend_label"]) == (
        "kubernetes", "Kubernetes v1.20.2", "Kubernetes API (batch/v1 Jobs)")  # fmt: skip
    assert (rows["main"]["kind"], rows["main"]["version"]) == ("slurm", "Slurm 22.05.8")
    assert [g["gpu_type"] for g in rows[K8S]["gpu_types"]] == ["a100", "h100"]
    assert [c.name for c in configured_clusters()] == ["main", K8S]
    assert [c.name for c in slurm_clusters()] == ["main"]

    client = APIClient()
    client.force_authenticate(user=world.alice)
    listed = {row["name"]: row for row in client.get("/api/v1/clusters/").json()["results"]}
    assert (listed[K8S]["kind"], listed[K8S]["version"]) == ("kubernetes", "Kubernetes v1.20.2")
    page = APIClient()
    page.force_login(world.alice)
    html = page.get("/clusters/").content.decode()
    assert "Kubernetes v1.20.2" in html and "Slurm 22.05.8" in html


def test_a_booking_on_the_kubernetes_cluster_is_refused(kube_inventory, world):
    from accounting.services.bookings import bookable_cluster
    from portal.exceptions import ApplicationError

    with pytest.raises(ApplicationError, match="bookings are Slurm reservations"):
        bookable_cluster(K8S)


ALLOWED_IMAGE = "registry.example.org/ml/pytorch:24.05"


@pytest.mark.parametrize(
    ("image", "stored"),
    [("", ""), ("docker.io/site/default:1", "docker.io/site/default:1"), (ALLOWED_IMAGE, ALLOWED_IMAGE),
     (f"  {ALLOWED_IMAGE} ", ALLOWED_IMAGE)],
    ids=["none-the-default", "the-default-named", "allowed", "allowed-padded"],
)  # fmt: skip
def test_a_job_may_name_an_image_the_site_allows_and_its_kubernetes_job_runs_in_it(kube_inventory, world, settings, image, stored):
    from portal.slurm.kube_job import job_manifest
    from portal.slurm.types import JobRequest, JobSubmission

    settings.GPUPORTAL_K8S_IMAGE = "docker.io/site/default:1"
    settings.GPUPORTAL_K8S_IMAGES = [ALLOWED_IMAGE]
    response = _submit(world.alice, gpu_type="h100", image=image)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.request["image"] == stored  # in the one stored request, handed to the translator unchanged
    submission = JobSubmission(request=JobRequest.from_json(job.request), uid=1000, gid=1000)
    _, body = job_manifest(submission, image=settings.GPUPORTAL_K8S_IMAGE, gpu_type_label="gpuportal.io/gpu-type")
    assert body["spec"]["template"]["spec"]["containers"][0]["image"] == (stored or "docker.io/site/default:1")


def test_an_image_off_the_sites_list_is_a_400_naming_the_field_and_nothing_is_stored(kube_inventory, world, settings):
    settings.GPUPORTAL_K8S_IMAGE = "docker.io/site/default:1"
    settings.GPUPORTAL_K8S_IMAGES = [ALLOWED_IMAGE]
    response = _submit(world.alice, gpu_type="h100", image="docker.io/someone/miner:latest")
    assert response.status_code == 400, response.json()
    [message] = response.json()["errors"]["image"]
    assert "'docker.io/someone/miner:latest' is not an image this site allows" in message
    assert f"docker.io/site/default:1, {ALLOWED_IMAGE}" in message
    assert not Job.objects.exists()


def test_an_image_for_a_slurm_cluster_is_a_400_naming_the_field(kube_inventory, world, settings):
    settings.GPUPORTAL_K8S_IMAGES = [ALLOWED_IMAGE]
    client = APIClient()
    client.force_authenticate(user=world.alice)
    response = client.post("/api/v1/jobs/", job_payload(cluster="main", image=ALLOWED_IMAGE), format="json")
    assert response.status_code == 400, response.json()
    assert "runs Slurm, which runs no container images" in response.json()["errors"]["image"][0]
    assert not Job.objects.exists()
