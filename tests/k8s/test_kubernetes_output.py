"""What outlives a Kubernetes Job on the real control plane (issue 41):

- a job's output: the sync keeps its pod's log (pods/log, as the node agent serves it) before it deletes
  the finished Job, and the job page, the API and `gpuportal logs` read that copy once the pod is gone —
  whole, or its first GPUPORTAL_K8S_LOG_COPY_MAX_BYTES saying it was cut; a log that cannot be read
  (the node agent, the kubelet, down) keeps its Job for a later cycle;
- a job's charge: a usage reading taken while the job ran and written after the portal's cancel
  recorded what ran up to the Job's deletion does not undercut it (the ordering made deterministic
  through the service functions: the ingestion's read, the cancel, the ingestion's write)."""

from __future__ import annotations

import datetime as dt
import subprocess
import time

import pytest
from django.utils import timezone
from kubernetes import client
from rest_framework.test import APIClient

from accounting.models import UsageRecord
from accounting.services import usage_records_upsert
from accounting.services.ingestion import usage_ingest
from jobs.choices import JobState
from jobs.models import Job, JobLogCopy
from jobs.services import job_cancel, job_cancel_relay_run, job_relay_run, jobs_sync
from portal.slurm import get_gateway
from tests.conftest import K8S_CLUSTER, ROOT
from tests.support import job_payload, wait_for

pytestmark = pytest.mark.k8s

LONG = '#!/bin/bash\nfor i in $(seq 1 20); do echo "line $i of a log longer than the copy kept"; done\n'


def _post(user, **fields) -> str:
    api = APIClient()
    api.force_authenticate(user=user)
    body = job_payload(cluster=K8S_CLUSTER, **({"gpus": 1, "gpu_type": "a100", "cpus_per_gpu": 1, "memory_gb": 1,
                                                "time_limit_minutes": 5} | fields))  # fmt: skip
    body.pop("partition")
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    job_relay_run(job_id)  # with live_server (a committing database) the POST's own relay may have sent it
    assert Job.objects.get(pk=job_id).state == JobState.PENDING
    return job_id


def _labelled(k8s_portal, namespace, kind: str):
    api = client.BatchV1Api(k8s_portal).list_namespaced_job if kind == "jobs" else client.CoreV1Api(k8s_portal).list_namespaced_pod
    return api(namespace, label_selector="gpuportal.io/managed-by=gpuportal").items


def _ended_and_charged(ids, k8s_portal, namespace) -> dict[str, str]:
    """Sync until the jobs have ended, record their final usage; their pods' logs as the API serves them."""
    def ended():
        jobs_sync(cluster=K8S_CLUSTER)
        return Job.objects.filter(pk__in=ids, state=JobState.COMPLETED).count() == len(ids)

    wait_for(ended, timeout=60, interval=0.5, what="the jobs to complete")
    usage_ingest(cluster=K8S_CLUSTER)
    core = client.CoreV1Api(k8s_portal)
    pods = {p.metadata.labels["gpuportal.io/job"]: p.metadata.name for p in _labelled(k8s_portal, namespace, "pods")}
    return {str(job_id): core.read_namespaced_pod_log(pods[str(job_id)], namespace) for job_id in ids}


def _k8s(*args):
    return subprocess.run([str(ROOT / "scripts" / "k8s"), *args], check=True, capture_output=True, text=True, timeout=300)


@pytest.fixture
def restore_k8s(k8s_portal):
    yield
    _k8s("up")


def test_a_jobs_output_is_read_from_the_kept_copy_once_its_job_is_deleted_on_the_page_the_api_and_the_cli(
    k8s_cluster, k8s_namespace, k8s_portal, world, settings, live_server, monkeypatch, capsys
):
    from gpuportal_cli.main import main

    from portal.services import api_token_create

    settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = 1
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 100
    short = _post(world.alice, name="short", script='#!/bin/bash\necho "epoch 1 loss 0.42"\n')
    long = _post(world.alice, name="long", script=LONG)
    logs = _ended_and_charged([short, long], k8s_portal, k8s_namespace)
    assert logs[short] == "epoch 1 loss 0.42\n" and len(logs[long].encode()) > 100
    time.sleep(settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS + 1)

    assert jobs_sync(cluster=K8S_CLUSTER)["deleted"] == 2
    wait_for(lambda: not _labelled(k8s_portal, k8s_namespace, "pods"), timeout=30, what="the pods (and their logs) to be gone")
    assert not _labelled(k8s_portal, k8s_namespace, "jobs")
    copies = {str(c.job_id): c for c in JobLogCopy.objects.all()}
    assert (bytes(copies[short].data), copies[short].truncated) == (logs[short].encode(), False)
    assert (bytes(copies[long].data), copies[long].truncated) == (logs[long].encode()[:100], True)

    api = APIClient()
    api.force_authenticate(user=world.alice)
    chunk = api.get(f"/api/v1/jobs/{short}/output/").json()
    assert (chunk["data"], chunk["eof"], chunk["final"], chunk["message"]) == (logs[short], True, True, "")
    cut = api.get(f"/api/v1/jobs/{long}/output/").json()
    assert cut["data"] == logs[long][:100] and "longer than the first 100 bytes the portal kept" in cut["message"]
    page = APIClient()
    page.force_login(world.alice)
    assert "epoch 1 loss 0.42" in page.get(f"/jobs/{short}/", follow=True).content.decode()  # the job page
    assert "the portal kept of it" in page.get(f"/jobs/{long}/output/", HTTP_HX_REQUEST="true").content.decode()

    _, key = api_token_create(user=world.alice, name="logs after the Job")
    monkeypatch.setenv("GPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("GPUPORTAL_TOKEN", key)
    capsys.readouterr()
    assert main(["logs", str(short)]) == 0
    assert capsys.readouterr().out == logs[short]
    assert main(["logs", str(long)]) == 0
    printed = capsys.readouterr()
    assert printed.out == logs[long][:100] and "GPUPORTAL_K8S_LOG_COPY_MAX_BYTES" in printed.err


def test_a_log_that_cannot_be_read_keeps_its_job_until_it_can(k8s_cluster, k8s_namespace, k8s_portal, world, settings, restore_k8s):
    settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = 1
    job_id = _post(world.alice, name="kept", script='#!/bin/bash\necho "the only copy"\n')
    logs = _ended_and_charged([job_id], k8s_portal, k8s_namespace)
    time.sleep(settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS + 1)

    _k8s("kill", "node-agent")  # the kubelet that serves pods/log: the API server cannot read the log now
    assert jobs_sync(cluster=K8S_CLUSTER).get("deleted", 0) == 0
    assert len(_labelled(k8s_portal, k8s_namespace, "jobs")) == 1 and not JobLogCopy.objects.exists()

    _k8s("up")
    assert jobs_sync(cluster=K8S_CLUSTER)["deleted"] == 1
    wait_for(lambda: not _labelled(k8s_portal, k8s_namespace, "pods"), timeout=30, what="the pod to be gone")
    api = APIClient()
    api.force_authenticate(user=world.alice)
    assert api.get(f"/api/v1/jobs/{job_id}/output/").json()["data"] == logs[str(job_id)] == "the only copy\n"


def test_a_reading_taken_before_a_cancel_and_written_after_it_leaves_the_cancels_charge(
    k8s_cluster, k8s_namespace, k8s_portal, world
):
    job_id = _post(world.alice, name="cancelled", script="#!/bin/bash\nexec sleep 600\n", gpus=2)

    def running():
        jobs_sync(cluster=K8S_CLUSTER)
        return Job.objects.get(pk=job_id).state == JobState.RUNNING

    wait_for(running, timeout=60, interval=0.5, what="the job to run")
    time.sleep(2)  # so the cancel's charge is whole seconds past the reading's
    # the usage ingestion's read (usage_ingest: gateway.accounting of its window) ...
    began = timezone.now()
    number = Job.objects.get(pk=job_id).slurm_job_id
    reading = get_gateway(K8S_CLUSTER).accounting(began - dt.timedelta(hours=1), began)
    [running_record] = [r for r in reading if r.job_id == number]
    assert running_record.state == "RUNNING" and running_record.end_time is None
    time.sleep(2)
    # ... the cancel meanwhile: what ran up to the Job's deletion, recorded as final ...
    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    assert job_cancel_relay_run(job_id) == "sent"
    [charged] = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert (charged.provisional, charged.state) == (False, "CANCELLED")
    assert charged.gpu_seconds >= 2 * (running_record.elapsed_seconds + 2)
    final = (charged.end_time, charged.gpu_seconds, charged.state, charged.provisional)
    # ... and the ingestion's write of its earlier reading, then its next run with the Job gone
    assert usage_records_upsert(records=[running_record], now=began, cluster=K8S_CLUSTER).written == 0
    wait_for(lambda: not _labelled(k8s_portal, k8s_namespace, "jobs"), timeout=30, what="the Job to be deleted")
    usage_ingest(cluster=K8S_CLUSTER)
    charged.refresh_from_db()
    assert (charged.end_time, charged.gpu_seconds, charged.state, charged.provisional) == final


def test_a_job_cancelled_while_running_keeps_its_output_after_its_job_is_deleted(k8s_cluster, k8s_namespace, k8s_portal, world):
    job_id = _post(world.alice, name="cancelled", script='#!/bin/bash\necho "epoch 1 loss 0.7"\nexec sleep 600\n')
    core = client.CoreV1Api(k8s_portal)

    def printed():
        jobs_sync(cluster=K8S_CLUSTER)
        pods = _labelled(k8s_portal, k8s_namespace, "pods")
        return Job.objects.get(pk=job_id).state == JobState.RUNNING and pods and "epoch 1" in core.read_namespaced_pod_log(
            pods[0].metadata.name, k8s_namespace)  # fmt: skip

    wait_for(printed, timeout=60, interval=0.5, what="the job to run and print")
    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    assert job_cancel_relay_run(job_id) == "sent"
    wait_for(lambda: not _labelled(k8s_portal, k8s_namespace, "pods"), timeout=60, what="its Job and pod to be gone")

    def cancelled():
        jobs_sync(cluster=K8S_CLUSTER)
        return Job.objects.get(pk=job_id).state == JobState.CANCELLED

    wait_for(cancelled, timeout=30, interval=0.5, what="the portal's job to be cancelled")
    assert bytes(JobLogCopy.objects.get(job_id=job_id, task=None).data) == b"epoch 1 loss 0.7\n"
    api = APIClient()
    api.force_authenticate(user=world.alice)
    chunk = api.get(f"/api/v1/jobs/{job_id}/output/").json()
    assert (chunk["data"], chunk["final"], chunk["message"]) == ("epoch 1 loss 0.7\n", True, "")
