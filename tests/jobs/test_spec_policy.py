"""QOS, constraints and MaxArraySize checked before Slurm against what the inventory sync read from
the cluster (portal.models.ClusterPolicyInfo, NodeInfo.features), each a 400 naming the directive's
line in the words of Slurm's refusal; where sbatch would accept, the portal accepts."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import Job
from portal.models import ClusterPolicyInfo, NodeInfo

URL = "/api/v1/jobs/"
pytestmark = pytest.mark.django_db


@pytest.fixture
def policy(inventory):
    """The inventory of tests/jobs/conftest.py plus a policy: QOS normal and high (the team's account
    vision may use normal only), a100 nodes with ib,nvlink and the h100 node with ib, MaxArraySize 100."""
    ClusterPolicyInfo.objects.create(qos=["high", "normal"], account_qos={"vision": ["normal"]}, max_array_size=100, seen_at=timezone.now())
    NodeInfo.objects.filter(gpu_type="a100").update(features=["ib", "nvlink"])
    NodeInfo.objects.filter(gpu_type="h100").update(features=["ib"])


def post(api_client_for, script, **fields):
    return api_client_for("member").post(URL, {"team": "vision", "script": "#!/bin/bash\n" + script + "true\n", **fields}, format="json")


@pytest.mark.parametrize(
    ("script", "fields", "field", "words"),
    [
        ("#SBATCH --gres=gpu:1\n#SBATCH --qos=nosuch\n", {}, "script",
         "line 3: #SBATCH --qos=nosuch: invalid qos specification: the cluster has no QOS 'nosuch' (QOS here: high, normal)"),
        ("#SBATCH --gres=gpu:1 -q high\n", {}, "script", "line 2: #SBATCH -q high: invalid qos specification: account 'vision' may use QOS normal, not 'high'"),
        ("#SBATCH --gres=gpu:1\n", {"qos": "nosuch"}, "qos", "Invalid qos specification"),
        ("#SBATCH --gres=gpu:1\n#SBATCH -C v100\n", {}, "script",
         "line 3: #SBATCH -C v100: invalid feature specification: partition gpu has no feature v100 (features there: ib, nvlink)"),
        ("#SBATCH --gres=gpu:1 --constraint=ib&infiniband\n", {}, "script", "has no feature infiniband"),
        ("#SBATCH --gres=gpu:1 --constraint=x|y\n", {}, "script", "has no feature x or feature y"),
        ("#SBATCH --gres=gpu:1 --constraint=ib*4\n", {}, "script", "partition gpu has no 4 nodes with feature ib"),
        ("#SBATCH --gres=gpu:1\n", {"constraint": "v100"}, "constraint", "Invalid feature specification"),
        ("#SBATCH --gres=gpu:1\n#SBATCH --array=1-100\n", {}, "script",
         "line 3: #SBATCH --array=1-100: invalid job array specification: index 100 is beyond the cluster's MaxArraySize (100: indexes 0–99)"),
        ("#SBATCH --gres=gpu:1 --array=5,200%2\n", {}, "script", "index 200"),
        ("#SBATCH --gres=gpu:1\n", {"array": "0-100"}, "array", "Invalid job array specification"),
    ],
)  # fmt: skip
def test_refused_before_slurm_in_slurms_words(api_client_for, policy, relays, script, fields, field, words):
    response = post(api_client_for, script, **fields)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert set(body) == {"detail", "errors"}
    assert any(words in message for message in body["errors"][field]), body
    assert Job.objects.count() == 0 and relays["drain"] == []


@pytest.mark.parametrize(
    "script",
    [
        "#SBATCH --gres=gpu:1 --qos=normal\n",
        "#SBATCH --gres=gpu:1 --qos=NORMAL\n",  # sbatch accepts it: QOS names match case-insensitively
        "#SBATCH --gres=gpu:1 -C nvlink\n",
        "#SBATCH --gres=gpu:1 -C 'ib&nvlink'\n",
        "#SBATCH --gres=gpu:1 --constraint=v100|nvlink\n",  # one branch can match
        "#SBATCH --gres=gpu:1 -N 2 --constraint=[nvlink*1&ib*1]\n",
        "#SBATCH --gres=gpu:1 --constraint=a100!x\n",  # not read here: Slurm decides
        "#SBATCH --gres=gpu:1 --array=0-99\n",
    ],
)
def test_what_sbatch_would_accept_is_accepted(api_client_for, policy, relays, script):
    response = post(api_client_for, script)
    assert response.status_code == 201, response.json()


def test_an_account_the_sync_did_not_see_is_not_refused_a_qos_the_cluster_has(api_client_for, policy, relays):
    ClusterPolicyInfo.objects.update(account_qos={})
    assert post(api_client_for, "#SBATCH --gres=gpu:1 -q high\n").status_code == 201


def test_before_the_first_policy_sync_qos_and_features_are_left_to_slurm_and_the_array_to_the_setting(
    api_client_for, inventory, relays, settings
):
    settings.SLURM_MAX_ARRAY_SIZE = 10
    assert post(api_client_for, "#SBATCH --gres=gpu:1 -q nosuch -C v100\n").status_code == 201
    response = post(api_client_for, "#SBATCH --gres=gpu:1 -a 0-10\n")
    assert response.status_code == 400 and "MaxArraySize (10:" in response.json()["errors"]["script"][0]
