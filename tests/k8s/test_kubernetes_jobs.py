"""Jobs through the portal on the local Kubernetes cluster (issue 41), as a configured cluster beside the
Slurm one (``k8s_cluster``: its inventory read from the real API server; team vision's account there is
this test's namespace). What is asserted is what Kubernetes itself holds: the Job the portal created
(its spec), where the real scheduler bound its pod, what the process printed (pods/log), the Job
controller's verdict as the portal's state, a create retried making no second Job (counted by
label), and a cancel deleting the Job and ending its process."""

from __future__ import annotations

import contextlib
import logging

import pytest
from kubernetes import client
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel, job_cancel_relay_run, job_relay_run, jobs_sync
from jobs.services.relay import _submission_for
from portal.selectors import clusters_status
from portal.slurm import get_gateway
from portal.unix import unix_ids
from tests.conftest import K8S_CLUSTER
from tests.support import job_payload, wait_for

pytestmark = pytest.mark.k8s

TYPE_LABEL = "gpuportal.io/gpu-type"


def _post(user, **fields):
    api = APIClient()
    api.force_authenticate(user=user)
    body = job_payload(cluster=K8S_CLUSTER, **fields)
    body.pop("partition")
    return api.post("/api/v1/jobs/", body, format="json")


def _kube_jobs(k8s_portal, namespace, job_id):
    selector = f"gpuportal.io/job={job_id}"
    return client.BatchV1Api(k8s_portal).list_namespaced_job(namespace, label_selector=selector).items


def _pods(k8s_portal, namespace, job_id):
    selector = f"gpuportal.io/job={job_id}"
    return client.CoreV1Api(k8s_portal).list_namespaced_pod(namespace, label_selector=selector).items


def _synced_until(job_id, states, *, timeout=60):
    def reached():
        jobs_sync(cluster=K8S_CLUSTER)
        job = Job.objects.get(pk=job_id)
        return job if job.state in states else None

    return wait_for(reached, timeout=timeout, interval=0.5, what=f"the portal's job to reach {sorted(states)}")


def test_the_cluster_is_listed_with_its_version_and_gpu_nodes(k8s_cluster):
    [row] = [row for row in clusters_status() if row["name"] == K8S_CLUSTER]
    assert row["version"] == "Kubernetes v1.20.2"
    assert (row["kind"], row["relay_backend"], row["health"]["ok"]) == ("kubernetes", "kubernetes", True)
    assert {g["gpu_type"]: g["total"] for g in row["gpu_types"]} == {"a100": 4, "h100": 4}
    assert [p["name"] for p in row["partitions"]] == ["kubernetes"]


def test_a_job_submitted_through_the_api_runs_as_a_kubernetes_job_on_its_gpu_type_and_completes(
    k8s_worker, k8s_cluster, k8s_namespace, k8s_portal, world
):
    script = '#!/bin/bash\necho "gpus=$NVIDIA_VISIBLE_DEVICES uid=$(id -u) epochs=$EPOCHS"\n'
    response = _post(world.alice, script=script, gpu_type="h100", gpus=2, cpus_per_gpu=1, memory_gb=2, time_limit_minutes=5)
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]

    # the real worker's relay created it in the team's namespace (the API's commit published the drain)
    [kube_job] = wait_for(lambda: _kube_jobs(k8s_portal, k8s_namespace, job_id), what="the Job in the namespace")
    assert kube_job.metadata.name == f"gpuportal-{job_id}"
    pod_spec = kube_job.spec.template.spec
    [container] = pod_spec.containers
    assert container.resources.limits == {"nvidia.com/gpu": "2"}
    assert container.resources.requests == {"cpu": "2", "memory": "2Gi"}
    assert pod_spec.node_selector == {TYPE_LABEL: "h100"}
    assert kube_job.spec.active_deadline_seconds == 5 * 60
    alice_uid, alice_gid = unix_ids("alice")
    assert (pod_spec.security_context.run_as_user, pod_spec.security_context.run_as_group) == (alice_uid, alice_gid)
    assert {e.name: e.value for e in container.env}["EPOCHS"] == "3"
    assert container.command == ["/bin/bash", "-c", script]

    job = _synced_until(job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
    assert (job.state, job.exit_code, job.slurm_cluster) == (JobState.COMPLETED, 0, K8S_CLUSTER)
    assert job.started_at is not None and job.ended_at >= job.started_at
    [pod] = _pods(k8s_portal, k8s_namespace, job_id)
    assert pod.spec.node_name == "k8s-h100-01"  # the real scheduler, by the node selector
    output = client.CoreV1Api(k8s_portal).read_namespaced_pod_log(pod.metadata.name, k8s_namespace)
    assert f"uid={alice_uid} epochs=3" in output
    assert len(output.split("gpus=")[1].split()[0].split(",")) == 2
    # the job's output through the portal: the pod's log (pods/log), on the API and the job page
    api = APIClient()
    api.force_authenticate(user=world.alice)
    chunk = api.get(f"/api/v1/jobs/{job_id}/output/").json()
    assert (chunk["data"], chunk["eof"], chunk["final"]) == (output, True, True)
    page = APIClient()
    page.force_login(world.alice)
    assert f"uid={alice_uid} epochs=3" in page.get(f"/jobs/{job_id}/output/", HTTP_HX_REQUEST="true").content.decode()


def test_a_retried_create_makes_no_second_job_and_a_relay_that_died_after_it_adopts_the_job(
    k8s_cluster, k8s_namespace, k8s_portal, world
):
    response = _post(world.alice, script="#!/bin/bash\nsleep 30\n", gpus=1, gpu_type="a100", time_limit_minutes=2)
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    assert job_relay_run(job_id) == "submitted"
    job = Job.objects.get(pk=job_id)

    gateway = get_gateway(K8S_CLUSTER)
    assert gateway.submit(_submission_for(job)) == job.slurm_job_id  # 409 AlreadyExists: the same Job
    # a relay that died after its create: the row still ACCEPTED, claimed before
    Job.objects.filter(pk=job_id).update(state=JobState.ACCEPTED, slurm_job_id=None, slurm_cluster="", relay_attempts=1)
    from urllib.parse import urlsplit

    server = urlsplit(k8s_portal.configuration.host)
    with RequestLog(f"{server.hostname}:{server.port}").recording() as requests:
        assert job_relay_run(job_id) == "adopted"
    assert requests == [("GET", "/apis/batch/v1/jobs")]  # one list by the job's label, not the sync's three
    assert Job.objects.get(pk=job_id).slurm_job_id == job.slurm_job_id
    assert len(_kube_jobs(k8s_portal, k8s_namespace, job_id)) == 1
    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    job_cancel_relay_run(job_id)


def test_a_multi_node_job_is_a_400_naming_nodes_and_never_reaches_kubernetes(k8s_cluster, k8s_namespace, k8s_portal, world):
    response = _post(world.alice, script="#!/bin/bash\n#SBATCH --nodes=2\nsrun hostname\n", nodes=None, gpus=2)
    assert response.status_code == 400, response.json()
    messages = response.json()["errors"]["script"]
    assert any("--nodes=2" in m and "several nodes" in m for m in messages), messages
    assert any("srun steps" in m for m in messages), messages
    assert not Job.objects.exists()
    assert client.BatchV1Api(k8s_portal).list_namespaced_job(k8s_namespace).items == []


def test_cancel_deletes_the_job_ends_its_process_and_the_portal_says_cancelled(k8s_cluster, k8s_namespace, k8s_portal, world):
    response = _post(world.alice, script='#!/bin/bash\necho "pid=$$"\nexec sleep 600\n', gpus=1, gpu_type="a100")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    assert job_relay_run(job_id) == "submitted"
    _synced_until(job_id, {JobState.RUNNING})

    def pid():
        pods = _pods(k8s_portal, k8s_namespace, job_id)
        log = pods and client.CoreV1Api(k8s_portal).read_namespaced_pod_log(pods[0].metadata.name, k8s_namespace)
        return log and "pid=" in log and int(log.split("pid=")[1].split()[0])

    process = wait_for(pid, what="the job's process to print its pid")
    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    assert job_cancel_relay_run(job_id) == "sent"

    wait_for(lambda: not _kube_jobs(k8s_portal, k8s_namespace, job_id), what="the Job to be deleted")
    job = _synced_until(job_id, {JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED})
    assert job.state == JobState.CANCELLED and job.ended_at is not None
    wait_for(lambda: not _runs(process), timeout=30, what="the job's process to end")


def test_a_job_waiting_for_gpus_shows_the_schedulers_reason(k8s_cluster, k8s_namespace, world):
    ids = []
    for _ in range(2):  # the second cannot have the node's 4 H100s while the first holds them
        response = _post(world.alice, script="#!/bin/bash\nsleep 600\n", gpus=4, gpu_type="h100")
        assert response.status_code == 201, response.json()
        ids.append(response.json()["id"])
        assert job_relay_run(ids[-1]) == "submitted"

    def waiting_with_reason():
        jobs_sync(cluster=K8S_CLUSTER)
        job = Job.objects.get(pk=ids[1])
        return job.state == JobState.PENDING and "Insufficient nvidia.com/gpu" in job.state_reason and job

    job = wait_for(waiting_with_reason, timeout=60, interval=0.5, what="the scheduler's reason on the pending job")
    assert "nodes are available" in job.state_reason
    for job_id in ids:
        job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
        job_cancel_relay_run(job_id)


class RequestLog(logging.Handler):
    """Every HTTP request urllib3 (the kubernetes client's transport) makes to the API server, as its
    documented DEBUG log line of each response says it: (method, path and query). No double: the
    requests are real, and counted where they leave the process."""

    def __init__(self, host_port: str):
        super().__init__(logging.DEBUG)
        self.host_port, self.requests = host_port, []

    def emit(self, record):
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) >= 5 and f"{args[1]}:{args[2]}" == self.host_port:
            self.requests.append((args[3], str(args[4]).split("?")[0]))

    @contextlib.contextmanager
    def recording(self):
        logger = logging.getLogger("urllib3.connectionpool")
        level = logger.level
        logger.addHandler(self)
        logger.setLevel(logging.DEBUG)
        try:
            self.requests.clear()
            yield self.requests
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


def test_a_sync_cycle_makes_one_list_of_jobs_and_of_pods_whatever_the_number_of_namespaces(
    k8s_cluster, k8s_namespace, k8s_more_namespaces, k8s_portal, world
):
    from urllib.parse import urlsplit

    from portal.models import TeamClusterAccount

    server = urlsplit(k8s_portal.configuration.host)
    log = RequestLog(f"{server.hostname}:{server.port}")
    namespaces = [k8s_namespace, *k8s_more_namespaces(2)]
    placed, measured = [], {}
    for added in (namespaces[:1], namespaces[1:]):  # 1 namespace with a job, then 3
        for namespace in added:
            # team vision's namespace at submission decides the job's (its request's --account)
            TeamClusterAccount.objects.filter(team=world.vision, cluster__name=K8S_CLUSTER).update(slurm_account=namespace)
            response = _post(world.alice, script="#!/bin/bash\nsleep 120\n", gpus=1, time_limit_minutes=3)
            assert response.status_code == 201, response.json()
            assert job_relay_run(response.json()["id"]) == "submitted"
            placed.append(response.json()["id"])

        def running():  # measured with every job running: none waits, so no events list
            jobs_sync(cluster=K8S_CLUSTER)
            return Job.objects.filter(pk__in=placed, state=JobState.RUNNING).count() == len(placed)

        wait_for(running, timeout=60, interval=0.5, what="the jobs to run")
        with log.recording() as requests:
            assert jobs_sync(cluster=K8S_CLUSTER)["live"] == len(placed)
        measured[len(placed)] = sorted(requests)
    kube_jobs = client.BatchV1Api(k8s_portal).list_job_for_all_namespaces(label_selector="gpuportal.io/managed-by=gpuportal").items
    mine = {j.metadata.labels["gpuportal.io/job"]: j.metadata.namespace for j in kube_jobs}
    assert sorted(mine[str(job_id)] for job_id in placed) == sorted(namespaces)  # one job in each of 3 namespaces
    expected = sorted([("GET", "/api/v1/namespaces"), ("GET", "/apis/batch/v1/jobs"), ("GET", "/api/v1/pods")])
    assert measured[1] == measured[3] == expected, measured  # cluster-scoped lists: 3 requests, 1 namespace or 3
    print(f"API requests per sync cycle: 1 namespace {len(measured[1])}, 3 namespaces {len(measured[3])}: {measured[3]}")
    for job_id in placed:
        job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
        job_cancel_relay_run(job_id)


def _runs(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_job_waiting_for_another_is_held_by_the_portal_until_it_completes_then_runs(
    k8s_cluster, k8s_namespace, k8s_portal, world
):
    """Kubernetes has no dependencies: the portal holds the child (ACCEPTED, no Job created) while its
    parent is live, and relays it once the parent has completed; a parent that fails fails it."""
    from jobs.services import job_relay_drain_run

    parent = _post(world.alice, name="k8s-first", script="#!/bin/bash\nsleep 3\n", gpus=1, cpus_per_gpu=1, memory_gb=1,
                   time_limit_minutes=5).json()["id"]  # fmt: skip
    child = _post(world.alice, name="k8s-second", script="#!/bin/bash\necho second\n", gpus=1, cpus_per_gpu=1, memory_gb=1,
                  time_limit_minutes=5, depends_on=[parent]).json()["id"]  # fmt: skip
    job_relay_drain_run(limit=10)
    assert Job.objects.get(pk=parent).state == JobState.PENDING
    assert Job.objects.get(pk=child).state == JobState.ACCEPTED and _kube_jobs(k8s_portal, k8s_namespace, child) == []
    _synced_until(parent, {JobState.COMPLETED})
    job_relay_drain_run(limit=10)  # what the sync published when the parent ended
    assert len(_kube_jobs(k8s_portal, k8s_namespace, child)) == 1
    assert _synced_until(child, {JobState.COMPLETED}).exit_code == 0

    failing = _post(world.alice, name="k8s-fails", script="#!/bin/bash\nexit 4\n", gpus=1, cpus_per_gpu=1, memory_gb=1,
                    time_limit_minutes=5).json()["id"]  # fmt: skip
    orphan = _post(world.alice, name="k8s-orphan", script="#!/bin/bash\ntrue\n", gpus=1, cpus_per_gpu=1, memory_gb=1,
                   time_limit_minutes=5, depends_on=[failing]).json()["id"]  # fmt: skip
    job_relay_drain_run(limit=10)
    assert _synced_until(failing, {JobState.FAILED}).exit_code == 4  # the emulated node ends the pod as the command did
    job_relay_drain_run(limit=10)
    orphan_job = Job.objects.get(pk=orphan)
    assert orphan_job.state == JobState.SUBMIT_FAILED and _kube_jobs(k8s_portal, k8s_namespace, orphan) == []
    assert orphan_job.state_reason == f"Job {failing}, which this job waits for, ended FAILED: it can never start."
