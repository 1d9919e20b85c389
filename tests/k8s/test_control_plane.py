"""The local Kubernetes cluster (scripts/k8s): the real 1.20.2 API server, scheduler and controllers,
the emulated node agent playing the kubelet of two GPU nodes, reached as the portal reaches it — its
service account (GPUPORTAL_K8S_KUBECONFIG), in a team namespace of the test's own (``k8s_namespace``).

What is asserted is what Kubernetes itself says: the scheduler's binding and its events, the Job
controller's conditions, the ResourceQuota admission's refusal, the pod's log through pods/log (the API
server asks the agent's kubelet endpoint), and the host's own process table for a cancelled Job."""

import datetime
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support import wait_for

pytestmark = pytest.mark.k8s

GPU = "nvidia.com/gpu"
TYPE_LABEL = "gpuportal.io/gpu-type"
NOBODY = 65534  # a non-root user the agent runs the pods as (securityContext runAsUser/runAsGroup)


def gpu_job(name, *, gpus, script, gpu_type=None):
    """A batch/v1 Job of one pod running ``script`` with ``gpus`` GPUs (limits), on ``gpu_type``'s nodes."""
    container = {
        "name": "job",
        "image": "gpuportal/host",  # required by the API; the emulated node runs the command on the host
        "command": ["/bin/sh", "-c", script],
        "resources": {"limits": {GPU: str(gpus)}},
    }
    spec = {
        "restartPolicy": "Never",
        "securityContext": {"runAsUser": NOBODY, "runAsGroup": NOBODY},
        "containers": [container],
    }
    if gpu_type:
        spec["nodeSelector"] = {TYPE_LABEL: gpu_type}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": spec}},
    }


def job_pods(core, namespace, job):
    return core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items


def events_of(core, namespace, kind, name):
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    return core.list_namespaced_event(namespace, field_selector=selector).items


@pytest.fixture
def apis(k8s_portal):
    return client.BatchV1Api(k8s_portal), client.CoreV1Api(k8s_portal)


def test_nodes_offer_their_gpus_by_type_and_are_ready(apis):
    _, core = apis
    nodes = {
        n.metadata.name: n for n in core.list_node(label_selector="gpuportal.io/emulated-node=true").items
    }
    assert {
        name: (n.metadata.labels[TYPE_LABEL], n.status.allocatable[GPU]) for name, n in nodes.items()
    } == {
        "k8s-a100-01": ("a100", "4"),
        "k8s-h100-01": ("h100", "4"),
    }
    assert nodes["k8s-h100-01"].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    for node in nodes.values():
        assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
        assert not [t for t in node.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]


def test_a_node_marked_not_ready_is_ready_again_within_one_heartbeat(k8s_admin):
    """After an API server outage longer than the node monitor's grace period, the node controller sets a
    node's Ready condition to Unknown and taints it NoSchedule; a kubelet puts Ready back at its next
    status check (10 s), so pods schedule again at once (CI, 2026-12-07: the agent posted its status only
    every 60 s and a pod stayed Pending for a minute). Here the admin sets Ready=Unknown as the node
    controller does, three times: each time the agent restores it, and the controller lifts its taints,
    within 25 s (measured here: Ready again after 8–10 s, untainted after 10–12 s; the agent's old 60-s
    period would pass all three rounds by chance about once in fourteen)."""
    core = client.CoreV1Api(k8s_admin)
    name = "k8s-a100-01"

    def ready_and_untainted():
        node = core.read_node(name)
        ready = {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
        return ready and not [t for t in node.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]

    wait_for(ready_and_untainted, timeout=30, what=f"{name} to be Ready before the test")
    for _ in range(3):
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                   "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        core.patch_node_status(name, {"status": {"conditions": [unknown]}})
        assert {c.type: c.status for c in core.read_node(name).status.conditions}["Ready"] == "Unknown"
        wait_for(ready_and_untainted, timeout=25, interval=0.5, what=f"{name} Ready and untainted again")


def test_portal_service_account_has_only_its_rights(apis, k8s_namespace):
    batch, core = apis
    with pytest.raises(ApiException) as secrets:
        core.list_namespaced_secret(k8s_namespace)
    assert secrets.value.status == 403
    with pytest.raises(ApiException) as elsewhere:
        batch.create_namespaced_job("kube-system", gpu_job("intruder", gpus=1, script="true"))
    assert elsewhere.value.status == 403
    with pytest.raises(ApiException) as bare_pod:
        core.create_namespaced_pod(k8s_namespace, gpu_job("p", gpus=1, script="true")["spec"]["template"] | {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"}})  # fmt: skip
    assert bare_pod.value.status == 403
    assert batch.list_namespaced_job(k8s_namespace).items == []


def test_job_with_two_gpus_for_a100_is_bound_to_the_a100_node_run_and_completed(apis, k8s_namespace):
    batch, core = apis
    name = f"job-{uuid.uuid4().hex[:8]}"
    batch.create_namespaced_job(
        k8s_namespace,
        gpu_job(name, gpus=2, gpu_type="a100", script='echo "gpus=$NVIDIA_VISIBLE_DEVICES uid=$(id -u)"'),
    )

    job = wait_for(
        what="the Job to complete",
        predicate=lambda: (j := batch.read_namespaced_job(name, k8s_namespace)).status.succeeded and j,
    )
    assert {c.type: c.status for c in job.status.conditions} == {"Complete": "True"}
    [pod] = job_pods(core, k8s_namespace, name)
    assert pod.spec.node_name == "k8s-a100-01"
    assert pod.status.phase == "Succeeded"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert terminated.started_at <= terminated.finished_at
    scheduled = [
        e for e in events_of(core, k8s_namespace, "Pod", pod.metadata.name) if e.reason == "Scheduled"
    ]
    assert "k8s-a100-01" in scheduled[0].message
    # pods/log: the API server asks the node's kubelet endpoint (the agent) for it
    output = core.read_namespaced_pod_log(pod.metadata.name, k8s_namespace, container="job")
    gpus = output.split("gpus=")[1].split()[0].split(",")
    assert len(gpus) == 2 and set(gpus) <= {"0", "1", "2", "3"}
    assert f"uid={NOBODY}" in output


def test_pod_asking_for_five_gpus_stays_pending_with_the_schedulers_reason(apis, k8s_namespace):
    batch, core = apis
    batch.create_namespaced_job(k8s_namespace, gpu_job("too-big", gpus=5, script="true"))

    def failed_scheduling():
        pods = job_pods(core, k8s_namespace, "too-big")
        events = pods and events_of(core, k8s_namespace, "Pod", pods[0].metadata.name)
        return [e for e in events or [] if e.reason == "FailedScheduling"]

    [event, *_] = wait_for(what="the scheduler's FailedScheduling event", predicate=failed_scheduling)
    assert "0/2 nodes are available" in event.message
    assert "Insufficient nvidia.com/gpu" in event.message
    [pod] = job_pods(core, k8s_namespace, "too-big")
    assert pod.status.phase == "Pending" and pod.spec.node_name is None


def test_resource_quota_refuses_a_pod_over_the_namespace_gpu_cap(apis, k8s_namespace):
    batch, core = apis
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
             "spec": {"hard": {f"requests.{GPU}": "2"}}}  # fmt: skip
    core.create_namespaced_resource_quota(k8s_namespace, quota)
    # admission counts against the quota once the resource-quota controller has computed its status
    wait_for(
        what="the quota's status",
        predicate=lambda: core.read_namespaced_resource_quota("gpus", k8s_namespace).status.hard,
    )

    batch.create_namespaced_job(k8s_namespace, gpu_job("over-cap", gpus=4, gpu_type="h100", script="true"))

    def refused():
        events = events_of(core, k8s_namespace, "Job", "over-cap")
        return [e for e in events if e.reason == "FailedCreate" and "exceeded quota" in e.message]

    [event, *_] = wait_for(what="the Job controller's FailedCreate event", predicate=refused)
    assert f"requested: requests.{GPU}=4" in event.message
    assert job_pods(core, k8s_namespace, "over-cap") == []


def test_deleting_a_running_job_ends_its_process(apis, k8s_namespace):
    batch, core = apis
    batch.create_namespaced_job(
        k8s_namespace, gpu_job("long", gpus=1, gpu_type="h100", script='echo "pid=$$"; exec sleep 600')
    )

    def running_pid():
        pods = job_pods(core, k8s_namespace, "long")
        if not pods or pods[0].status.phase != "Running":
            return None
        output = core.read_namespaced_pod_log(pods[0].metadata.name, k8s_namespace)
        return "pid=" in output and int(output.split("pid=")[1].split()[0])

    pid = wait_for(what="the Job's pod to run", predicate=running_pid)
    with open(f"/proc/{pid}/status") as status:
        assert f"Uid:\t{NOBODY}" in status.read()

    batch.delete_namespaced_job("long", k8s_namespace, propagation_policy="Background")

    wait_for(what="the pod to be removed", predicate=lambda: not job_pods(core, k8s_namespace, "long"))
    wait_for(what="its process to end", predicate=lambda: not process_runs(pid), timeout=10)


def process_runs(pid):
    """The process exists and is not a zombie (ended, not yet reaped by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_kubelet_endpoint_answers_only_the_clusters_certificates(apis):
    """The agent's kubelet port serves pods' logs to the API server (its kubelet client certificate)
    and to nobody without a certificate of the cluster's CA."""
    import socket
    import ssl

    _, core = apis
    node = core.read_node("k8s-a100-01")
    port = node.status.daemon_endpoints.kubelet_endpoint.port
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    refused = pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        refused,
        context.wrap_socket(raw) as tls,
    ):
        tls.sendall(b"GET /containerLogs/kube-system/x/y HTTP/1.0\r\n\r\n")
        # TLS 1.3: the server's refusal (no client certificate) arrives with the first read
        tls.recv(1024) or pytest.fail("no TLS alert")


def test_following_a_pods_log_streams_it_to_the_end(apis, k8s_namespace):
    """pods/log?follow=true (what `gpuportal logs --follow` will read): the API server streams what the
    agent's kubelet endpoint sends while the process runs, and the stream ends when the process does."""
    batch, core = apis
    script = "for i in 1 2 3; do echo line$i; sleep 0.5; done"
    batch.create_namespaced_job(k8s_namespace, gpu_job("chatty", gpus=1, script=script))

    def running_pod():
        pods = job_pods(core, k8s_namespace, "chatty")
        return pods and pods[0].status.phase in ("Running", "Succeeded") and pods[0].metadata.name

    name = wait_for(what="the Job's pod to start", predicate=running_pod)
    stream = core.read_namespaced_pod_log(name, k8s_namespace, follow=True, _preload_content=False)
    try:
        assert stream.read().decode() == "line1\nline2\nline3\n"
    finally:
        stream.release_conn()
    pod = core.read_namespaced_pod(name, k8s_namespace)
    assert pod.status.phase == "Succeeded"
