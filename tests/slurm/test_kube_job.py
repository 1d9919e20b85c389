"""portal.slurm.kube_job: the stored request (built by the one builder, as the portal builds it) as a
batch/v1 Job — GPUs in limits, the type as a node selector, the time limit as activeDeadlineSeconds,
CPUs and memory as requests, the environment, the submitter's ids, the site's image, the script as the
command, the name from the portal's job — and the one rule of what Kubernetes cannot express. The
Job as the real API server takes it and runs it: tests/k8s/test_kubernetes_jobs.py."""

from __future__ import annotations

import uuid

import pytest

from portal.slurm.clusters import ClusterConfig, ClusterConfigError, parse_clusters
from portal.slurm.kube_job import (
    array_limit,
    job_manifest,
    job_manifests,
    job_name,
    job_number,
    refusal,
    script_refusal,
    task_number,
)
from portal.slurm.tags import slurm_tag
from portal.slurm.types import SlurmRejected
from tests.support import slurm_job

LABEL = "gpuportal.io/gpu-type"
SCRIPT = "#!/bin/bash\n#SBATCH --job-name=train\necho start\npython train.py\n"


def _submission(script=SCRIPT, *, job=None, uid=4242, gid=4343, reservation="", **fields):
    job = job or uuid.uuid4()
    fields = {"gpus": 2, "gpu_type": "a100", "time_limit_minutes": 90, "cpus_per_gpu": 4, "memory_mb": 16384, "name": "train"} | fields
    return job, slurm_job(script, account="team-vision", partition="kubernetes", comment=slurm_tag(job), uid=uid,
                          gid=gid, reservation=reservation, environment={"EPOCHS": "3"}, workdir="/home/ann", **fields)  # fmt: skip


def test_the_request_becomes_a_job_in_the_teams_namespace_with_its_gpus_type_time_ids_and_script():
    job, submission = _submission()
    namespace, body = job_manifest(submission, image="site/cuda:12", gpu_type_label=LABEL)

    assert namespace == "team-vision"
    assert body["metadata"]["name"] == job_name(job) == f"gpuportal-{job}"
    assert body["metadata"]["labels"]["gpuportal.io/job"] == str(job)
    assert body["metadata"]["labels"]["gpuportal.io/job-number"] == str(job_number(job))
    assert body["metadata"]["annotations"] == {"gpuportal.io/job-name": "train", "gpuportal.io/tag": slurm_tag(job)}
    spec = body["spec"]
    assert (spec["backoffLimit"], spec["parallelism"], spec["completions"]) == (0, 1, 1)
    assert spec["activeDeadlineSeconds"] == 90 * 60
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {LABEL: "a100"}
    assert pod["securityContext"] == {"runAsUser": 4242, "runAsGroup": 4343}
    assert pod["restartPolicy"] == "Never"
    [container] = pod["containers"]
    assert container["image"] == "site/cuda:12"
    assert container["command"] == ["/bin/bash", "-c", submission.request.script]
    assert container["workingDir"] == "/home/ann"
    assert container["env"] == [{"name": "EPOCHS", "value": "3"}]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "8", "memory": "16384Mi"}}


def test_the_same_job_gets_the_same_name_and_number_and_another_job_others():
    job = uuid.uuid4()
    first = job_manifest(_submission(job=job)[1], image="i", gpu_type_label=LABEL)[1]
    again = job_manifest(_submission(job=job)[1], image="i", gpu_type_label=LABEL)[1]
    other = job_manifest(_submission()[1], image="i", gpu_type_label=LABEL)[1]
    assert first["metadata"] == again["metadata"]
    assert first["metadata"]["name"] != other["metadata"]["name"]
    assert 0 < job_number(job) < 2**53  # a JSON number any client reads exactly


def test_memory_per_gpu_and_per_cpu_and_no_type_no_time():
    _, submission = _submission(
        "#!/bin/sh\n#SBATCH --mem-per-gpu=2G\ntrue\n", gpu_type="", time_limit_minutes=None, memory_mb=None
    )
    _, body = job_manifest(submission, image="i", gpu_type_label=LABEL)
    pod = body["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "activeDeadlineSeconds" not in body["spec"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "8", "memory": "4096Mi"}
    assert pod["containers"][0]["command"][:2] == ["/bin/sh", "-c"]


def test_an_array_is_one_job_per_task_named_and_labelled_by_its_index_with_slurms_array_variables():
    job, submission = _submission("#!/bin/bash\n#SBATCH --array=1,3,5-7\necho $SLURM_ARRAY_TASK_ID\n")
    namespace, bodies = job_manifests(submission, image="i", gpu_type_label=LABEL)
    number = job_number(job)
    assert namespace == "team-vision"
    assert [b["metadata"]["name"] for b in bodies] == [f"gpuportal-{job}-{i}" for i in (1, 3, 5, 6, 7)]
    for index, body in zip((1, 3, 5, 6, 7), bodies):
        labels = body["metadata"]["labels"]
        assert labels["gpuportal.io/array-task"] == str(index) and labels["gpuportal.io/job-number"] == str(number)
        assert body["spec"]["template"]["metadata"]["labels"] == labels  # the pod says its task too
        env = {e["name"]: e["value"] for e in body["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env == {"EPOCHS": "3", "SLURM_ARRAY_JOB_ID": str(number), "SLURM_ARRAY_TASK_ID": str(index),
                       "SLURM_ARRAY_TASK_COUNT": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "7",
                       "SLURM_ARRAY_TASK_STEP": "1", "SLURM_JOB_ID": str(task_number(number, index))}  # fmt: skip
    assert len({task_number(number, i) for i in (1, 3, 5, 6, 7)} | {number}) == 6
    with pytest.raises(SlurmRejected, match="job_manifests"):
        job_manifest(submission, image="i", gpu_type_label=LABEL)
    # a %N limit is the portal's to enforce (the gateway creates the first N, the sync the others): every task's Job
    _, limited = _submission("#!/bin/bash\n#SBATCH --array=0-9%2\ntrue\n")
    assert len(job_manifests(limited, image="i", gpu_type_label=LABEL)[1]) == 10
    assert (array_limit("0-9%2"), array_limit("0-9"), array_limit("x%")) == (2, None, None)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("nodes", "2", "several nodes"),
        ("nodes", "1-3", "several nodes"),
        ("ntasks", "4", "srun"),
        ("reservation", "maint", "Slurm reservation"),
        ("array", "x", "not an array specification"),
        ("qos", "high", "QOS"),
        ("constraint", "nvlink", "node features"),
        ("exclusive", None, "to itself"),
        ("mem", "0", "all of the node's memory"),
        ("gres", "gpu:1,tmpdisk:10", "only GPUs"),
        ("hint", "nomultithread", "no meaning for a Kubernetes Job"),
    ],
)
def test_what_kubernetes_cannot_express_is_refused_with_why(option, value, says):
    assert says in refusal(option, value)


@pytest.mark.parametrize(
    ("option", "value"), [("nodes", "1"), ("nodes", None), ("ntasks", "1"), ("time", "10"), ("gres", "gpu:a100:2"),
                          ("mem", "4G"), ("cpus-per-task", "4"), ("job-name", "x"), ("account", "ns"),
                          ("array", "0-3"), ("array", "1,3,5-7"), ("array", "0-15:4"), ("array", "0-9%2")],
)  # fmt: skip
def test_what_it_expresses_passes(option, value):
    assert refusal(option, value) is None


def test_an_srun_step_is_found_on_its_line_and_a_comment_or_word_is_not():
    assert script_refusal("#!/bin/bash\n# srun later\necho srun\n  srun python x.py\n") == (
        4, "srun steps: Kubernetes has no srun; run the command directly"
    )  # fmt: skip
    assert script_refusal("#!/bin/bash\nsrunner\n") is None


def test_the_translation_refuses_again_what_validation_refuses_and_a_job_without_ids():
    _, multi = _submission(nodes=2, gpus=2)
    with pytest.raises(SlurmRejected, match="--nodes: several nodes"):
        job_manifest(multi, image="i", gpu_type_label=LABEL)
    _, booked = _submission(reservation="booking-1")
    with pytest.raises(SlurmRejected, match="--reservation"):
        job_manifest(booked, image="i", gpu_type_label=LABEL)
    _, as_root = _submission(uid=None, gid=None)
    with pytest.raises(SlurmRejected, match="non-root"):
        job_manifest(as_root, image="i", gpu_type_label=LABEL)


def test_gpuportal_clusters_name_a_kubernetes_cluster_after_the_slurm_ones():
    [slurm, kube] = parse_clusters("name=gpuportal;name=gpuportal-k8s,kind=kubernetes,kubeconfig=/etc/k.conf")
    assert slurm == ClusterConfig("gpuportal", "auto")
    assert (kube.name, kube.kind, kube.backend, kube.kubeconfig, kube.is_kubernetes) == (
        "gpuportal-k8s", "kubernetes", "kubernetes", "/etc/k.conf", True)  # fmt: skip
    for text, says in [
        ("name=k,kind=kubernetes", "first \\(default\\) cluster is a Slurm cluster"),
        ("name=a;name=k,kind=nomad", "kind 'nomad'"),
        ("name=a,kubeconfig=/x", "kubeconfig is for a cluster of kind kubernetes"),
        ("name=a;name=k,kind=kubernetes,backend=cli", "no Slurm backend"),
    ]:
        with pytest.raises(ClusterConfigError, match=says):
            parse_clusters(text)
