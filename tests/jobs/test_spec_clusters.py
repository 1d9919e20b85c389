"""A script's ``#SBATCH -M name`` / ``--clusters=name`` (what users write for multi-cluster Slurm) is
the job's cluster when it names one the portal serves; the ``cluster`` field overrides it as sbatch's
command line does; several names, ``all`` or an unknown name are a 400 naming the script's line.
The relay never hands the directive to sbatch (portal.slurm.request): the job goes to its cluster's
own gateway. The last test submits such a script to the non-default real cluster (25.11)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from gpuportal_sbatch.directives import CLUSTER_OPTIONS, parse_directives
from jobs import services
from jobs.models import Job
from jobs.services import job_relay_run
from jobs.spec import directives_table, parse_script
from portal.models import TeamClusterAccount
from portal.slurm import get_gateway
from portal.slurm.cli import sbatch_argv
from tests.jobs.test_clusters_jobs import both_clusters, two_inventories  # noqa: F401  (fixtures)
from tests.support import job_overrides, job_payload

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"


def _post(user, body):
    client = APIClient()
    client.force_authenticate(user=user)
    return client.post(URL, body, format="json")


def _script(*directives: str) -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "echo hi\n"


def _submit(user, *directives: str, **fields):
    body = {"team": "vision", "script": _script("--gres=gpu:1 -t 10", *directives), **fields}
    return _post(user, body)


@pytest.mark.parametrize("directive", ["-M east", "--clusters=east", "--clusters east", "--cluster=east", "-M EAST"])
def test_a_scripts_cluster_directive_picks_that_cluster_and_the_teams_account_there(two_inventories, world, relays, unix_users,
                                                                                    directive):
    main, east = two_inventories
    response = _submit(world.alice, directive)  # partition gpu is on both: without -M, main
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.cluster_id, response.json()["cluster"], job.partition) == (east.pk, "east", "gpu")
    assert ["account", "vision-east"] in job_overrides(job)
    # what Slurm gets: neither the directive nor a --clusters option (the gateway is east's own)
    spec = services._submission_for(job)
    assert not any(d.option in CLUSTER_OPTIONS for d in parse_directives(spec.request.script))
    assert not any(option in CLUSTER_OPTIONS for option, _ in spec.options)
    assert not any(arg.startswith(("--clusters", "--cluster", "-M")) for arg in sbatch_argv(spec))
    assert not any(d["option"] in CLUSTER_OPTIONS for d in job.directives)  # the options Slurm gets, as shown


def test_the_cluster_field_overrides_the_scripts_directive(two_inventories, world, relays):
    main, east = two_inventories
    response = _submit(world.alice, "-M east", cluster="main")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).cluster_id == main.pk
    # as sbatch's command line replaces the script's -M whatever it says: even "all" or an unknown name
    for value in ("all", "west", "main,east"):
        response = _submit(world.alice, f"-M {value}", cluster="east")
        assert response.status_code == 201, (value, response.json())
        assert Job.objects.get(pk=response.json()["id"]).cluster_id == east.pk


@pytest.mark.parametrize("value", ["main,east", "all", "ALL"])
def test_several_clusters_or_all_is_a_400_naming_the_line_and_saying_to_name_one(two_inventories, world, relays, value):
    response = _submit(world.alice, f"--clusters={value}")
    assert response.status_code == 400
    body = response.json()
    assert set(body["errors"]) == {"script"}, body
    assert body["errors"]["script"] == [
        f"line 3: #SBATCH --clusters={value}: the portal submits a job to one cluster: name one (clusters here: east, main)."
    ]
    assert body["detail"].startswith("The job cannot be submitted: line 3:")
    assert not Job.objects.exists()


def test_an_unknown_cluster_in_the_script_is_a_400_naming_it_and_the_clusters_served(two_inventories, world, relays):
    response = _submit(world.alice, "-M west")
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "script": ["line 3: #SBATCH -M west: no such cluster: 'west' (clusters here: east, main)."]
    }
    # the same name as the field: under `cluster`, naming the clusters too
    response = _submit(world.alice, cluster="west")
    assert response.json()["errors"]["cluster"] == ["No such cluster: 'west' (clusters here: east, main)."]
    assert not Job.objects.exists()


def test_a_cluster_the_team_has_no_account_on_is_refused_at_the_scripts_line(two_inventories, world, relays):
    TeamClusterAccount.objects.filter(team=world.vision).delete()
    response = _submit(world.alice, "-M east")
    assert response.status_code == 400
    assert response.json()["errors"] == {"script": ["line 3: #SBATCH -M east: this team has no Slurm account on cluster 'east'."]}


def test_a_partition_only_the_scripts_cluster_has_is_found_there_and_one_it_lacks_is_refused(two_inventories, world, relays):
    main, east = two_inventories
    response = _submit(world.alice, "-M east", "-p h100only")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).cluster_id == east.pk
    response = _submit(world.alice, "-M east", "-p debug")  # debug is main's only
    assert response.status_code == 400
    assert response.json()["errors"] == {"script": ["line 4: #SBATCH -p debug: No such partition: 'debug'."]}


def test_with_one_cluster_a_script_naming_it_is_accepted(inventory, world, relays, settings):
    response = _submit(world.alice, f"-M {settings.SLURM_CLUSTER}")
    assert response.status_code == 201, response.json()
    assert response.json()["cluster"] == settings.SLURM_CLUSTER
    response = _submit(world.alice, "-M elsewhere")
    assert response.status_code == 400
    assert response.json()["errors"]["script"] == [
        f"line 3: #SBATCH -M elsewhere: no such cluster: 'elsewhere' (clusters here: {settings.SLURM_CLUSTER})."
    ]


def test_a_batch_and_the_quote_read_the_scripts_cluster(two_inventories, world, relays):
    client = APIClient()
    client.force_authenticate(user=world.alice)
    batch = [job_payload(gpus=1, script=_script("-M east")), job_payload(gpus=1, script=_script("-M main"))]
    response = client.post(URL, batch, format="json")
    assert response.status_code == 201, response.json()
    assert [job["cluster"] for job in response.json()] == ["east", "main"]
    response = client.post(URL, [job_payload(gpus=1), job_payload(gpus=1, script=_script("-M all"))], format="json")
    assert response.status_code == 400 and set(response.json()["errors"]) == {"1"}
    assert "name one" in response.json()["errors"]["1"]["script"][0]
    quote = client.post("/api/v1/jobs/quote/", {"script": _script("--gres=gpu:1 -t 60", "-M a,b")}, format="json")
    assert quote.status_code == 400 and "name one" in quote.json()["errors"]["script"][0], quote.json()


def test_the_forms_table_says_what_a_cluster_directive_does():
    rows, error = directives_table(parse_script(_script("-M east", "--gres=gpu:1")))
    assert error == ""
    assert rows[0]["option"] == "clusters" and rows[0]["meaning"] == "cluster (the cluster field overrides it)"


# ---------------------------------------------------------------- real sbatch, the non-default cluster


@pytest.mark.slurm
def test_a_script_with_M_reaches_the_non_default_cluster_through_its_own_gateway(both_clusters, cluster):
    """``#SBATCH -M <the 25.11 cluster>`` (alone on its line, and beside other options on one line)
    through the portal: the job runs on 25.11 and not on 22.05; sbatch of the 22.05 cluster would
    refuse that name (its slurmdbd does not know it) and 25.11's, given the directive, would ask its
    slurmdbd for the controller: the gateway sends neither."""
    old, new = both_clusters
    client = APIClient()
    client.force_authenticate(user=cluster.alice)
    scripts = {
        "alone": f"#!/bin/bash\n#SBATCH -M {new}\n#SBATCH --gres=gpu:1 -t 5 -J m-alone\nsleep 300\n",
        # the line is written again without -M: its other options still reach sbatch
        "beside": f"#!/bin/bash\n#SBATCH --gres=gpu:1 -M {new} -J 'm beside' -t 5\nsleep 300\n",
    }
    ids = {}
    for label, script in scripts.items():
        response = client.post(URL, {"team": "vision", "script": script}, format="json")
        assert response.status_code == 201, response.json()
        assert response.json()["cluster"] == new
        ids[label] = response.json()["id"]
        assert job_relay_run(ids[label]) == "submitted", Job.objects.get(pk=ids[label]).last_relay_error
    queue = {entry.job_id: entry for entry in get_gateway(new).queue()}
    for label, job_id in ids.items():
        job = Job.objects.get(pk=job_id)
        assert job.slurm_cluster == new and job.slurm_job_id
        assert get_gateway(new).find_by_comment(job.slurm_tag) == job.slurm_job_id, label  # on 25.11 …
        assert get_gateway(old).find_by_comment(job.slurm_tag) is None, label  # … not on 22.05
        entry = queue[job.slurm_job_id]
        assert (entry.name, entry.time_limit_minutes) == ({"alone": "m-alone", "beside": "m beside"}[label], 5)
        assert "gpu" in entry.tres_per_node and entry.tres_per_node.endswith("1"), entry.tres_per_node
        get_gateway(new).cancel(job.slurm_job_id)
