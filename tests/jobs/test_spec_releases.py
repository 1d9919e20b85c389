"""A job's script against the sbatch of its cluster's Slurm release (issue 29, item 5): the release is
the one the cluster's last inventory sync read (``sinfo --version``); an option that release's
sbatch lacks is a 400 naming the line and the release, the same script to a cluster whose release
has it is accepted. A cluster whose release is not read yet, or not in the table, takes any
release's options. Against both real local clusters: tests/jobs/test_clusters_jobs.py."""

from __future__ import annotations

import pytest

from jobs.inventory import inventory
from jobs.models import Job
from portal.models import SyncStatus
from tests.jobs.test_clusters_jobs import two_inventories  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db

# --tres-per-task: 25.11's sbatch has it, 22.05's has not; --power: the other way round
ONLY_25_11 = "#!/bin/bash\n#SBATCH -p gpu -t 5 -n 2\n#SBATCH --tres-per-task=gres/gpu:1\nsrun true\n"
ONLY_22_05 = "#!/bin/bash\n#SBATCH -p gpu -t 5 --gres=gpu:1\n#SBATCH --power=level\nsrun true\n"


def synced(cluster: str, version: str) -> None:
    """What cluster_sync records of the cluster's Slurm version."""
    SyncStatus.objects.update_or_create(kind=SyncStatus.kind_for("cluster", cluster), defaults={"data": {"slurm_version": version}})


def submit(api_client_for, script: str, **fields):
    return api_client_for("member").post("/api/v1/jobs/", {"team": "vision", "script": script, **fields}, format="json")


def test_the_inventory_carries_each_cluster_s_release_as_the_sync_read_it(two_inventories):
    synced("main", "22.05.8")
    synced("east", "25.11.7")
    releases = {(c.cluster, c.name): c.slurm_release for c in inventory().partitions.values()}
    assert releases == {("main", "gpu"): "22.05", ("main", "debug"): "22.05", ("east", "gpu"): "25.11", ("east", "h100only"): "25.11"}
    synced("east", "24.05.1")  # a release the table does not have
    assert inventory().capacity("gpu", "east").slurm_release is None


def test_an_option_the_22_05_cluster_lacks_is_a_400_naming_the_line_and_the_release_and_25_11_takes_it(api_client_for, two_inventories, relays):
    synced("main", "22.05.8")
    synced("east", "25.11.7")
    refused = submit(api_client_for, ONLY_25_11, cluster="main")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["errors"]["script"] == [
        "line 3: #SBATCH --tres-per-task=gres/gpu:1: sbatch of Slurm 22.05 has no option --tres-per-task (25.11 has it)"
    ]
    assert Job.objects.count() == 0 and relays["drain"] == []
    accepted = submit(api_client_for, ONLY_25_11, cluster="east")
    assert accepted.status_code == 201, accepted.json()
    assert Job.objects.get(pk=accepted.json()["id"]).cluster.name == "east"


def test_an_option_only_22_05_has_is_refused_for_25_11_and_an_abbreviation_names_the_option(api_client_for, two_inventories, relays):
    synced("main", "22.05.8")
    synced("east", "25.11.7")
    refused = submit(api_client_for, ONLY_22_05, cluster="east")
    assert refused.status_code == 400
    assert refused.json()["errors"]["script"] == ["line 3: #SBATCH --power=level: sbatch of Slurm 25.11 has no option --power (22.05 has it)"]
    assert submit(api_client_for, ONLY_22_05, cluster="main").status_code == 201
    abbreviated = submit(api_client_for, ONLY_25_11.replace("--tres-per-task", "--tres-per-t"), cluster="main")
    assert abbreviated.json()["errors"]["script"] == [
        "line 3: #SBATCH --tres-per-t=gres/gpu:1: sbatch of Slurm 22.05 has no option --tres-per-t (25.11 has --tres-per-task)"
    ]


def test_the_script_s_own_cluster_choice_is_checked_against_that_cluster_s_release(api_client_for, two_inventories, relays):
    synced("main", "22.05.8")
    synced("east", "25.11.7")
    to_main = submit(api_client_for, ONLY_25_11.replace("-n 2\n", "-n 2 -M main\n"))
    assert to_main.status_code == 400 and "sbatch of Slurm 22.05 has no option --tres-per-task" in to_main.json()["errors"]["script"][0]
    assert submit(api_client_for, ONLY_25_11.replace("-n 2\n", "-n 2 -M east\n")).status_code == 201


@pytest.mark.parametrize("version", [None, "24.05.1"])
def test_a_cluster_whose_release_is_not_read_yet_or_not_in_the_table_takes_any_release_s_options(api_client_for, two_inventories, relays, version):
    if version:
        synced("main", version)
    assert submit(api_client_for, ONLY_25_11, cluster="main").status_code == 201
    assert submit(api_client_for, ONLY_22_05, cluster="main").status_code == 201
