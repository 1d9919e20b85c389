"""Faults of the local Kubernetes cluster (scripts/k8s): the node agent killed while a pod runs, the API
server crashing. What is asserted is what Kubernetes says afterwards (the pod's and the Job's status)
and, for the agent, the host's own record of the process (its exit code and end)."""

import datetime
import subprocess

import pytest
from kubernetes import client

from tests.k8s.test_control_plane import gpu_job, job_pods
from tests.support import wait_for
from tests.workers import ROOT

pytestmark = pytest.mark.k8s


def k8s(*args):
    return subprocess.run([str(ROOT / "scripts" / "k8s"), *args], check=True, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.fixture
def restore_k8s(k8s_portal):
    """Whatever a test stopped is started again (scripts/k8s up starts only what is missing)."""
    yield
    k8s("up")


def test_a_pod_that_ends_while_its_node_agent_is_dead_is_reported_as_it_ended(k8s_portal, k8s_namespace,
                                                                               restore_k8s):  # fmt: skip
    batch, core = client.BatchV1Api(k8s_portal), client.CoreV1Api(k8s_portal)
    batch.create_namespaced_job(
        k8s_namespace, gpu_job("outlives", gpus=1, gpu_type="a100", script="echo up; sleep 2; exit 3")
    )
    pod = wait_for(
        what="the pod to run",
        predicate=lambda: [p for p in job_pods(core, k8s_namespace, "outlives") if p.status.phase == "Running"],
    )[0]

    k8s("kill", "node-agent")
    # the process ends (exit 3) while no agent runs: Kubernetes still says Running
    wait_for(what="the process to end", predicate=lambda: not subprocess.run(
        ["pgrep", "-f", "sleep 2; exit 3"], check=False, capture_output=True).stdout, timeout=30)  # fmt: skip
    assert core.read_namespaced_pod(pod.metadata.name, k8s_namespace).status.phase == "Running"
    agent_back = datetime.datetime.now(datetime.UTC)
    k8s("up")

    job = wait_for(what="the Job to fail", predicate=lambda: (j := batch.read_namespaced_job("outlives", k8s_namespace))
                   .status.failed and j)  # fmt: skip
    assert [c.type for c in job.status.conditions] == ["Failed"]
    pod = core.read_namespaced_pod(pod.metadata.name, k8s_namespace)
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 3, "Error")
    # the end is when the process ended (what it is charged for), not when the agent came back to see it
    assert terminated.started_at < terminated.finished_at <= agent_back


def test_after_the_api_server_crashed_the_nodes_stay_ready_and_jobs_run(k8s_portal, k8s_namespace, restore_k8s):
    batch, core = client.BatchV1Api(k8s_portal), client.CoreV1Api(k8s_portal)
    k8s("kill", "kube-apiserver")
    k8s("up")

    batch.create_namespaced_job(k8s_namespace, gpu_job("after-crash", gpus=4, gpu_type="h100", script="echo ok"))
    wait_for(what="the Job to complete",
             predicate=lambda: batch.read_namespaced_job("after-crash", k8s_namespace).status.succeeded)  # fmt: skip
    [pod] = job_pods(core, k8s_namespace, "after-crash")
    assert pod.spec.node_name == "k8s-h100-01"
    assert core.read_namespaced_pod_log(pod.metadata.name, k8s_namespace) == "ok\n"
    for node in core.list_node(label_selector="gpuportal.io/emulated-node=true").items:
        assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
