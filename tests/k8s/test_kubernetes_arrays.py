"""Array jobs on the local Kubernetes cluster (issue 41): an ``--array`` job runs as one batch/v1 Job
per task (Kubernetes 1.20 has no Indexed Jobs), each pod with Slurm's SLURM_ARRAY_* variables, and
the portal follows it as it follows a Slurm array — one task row per task, one usage record per task,
the job's end folded from its tasks' — through the gateway's queue and accounting (one entry per task,
its own id and its array's). A cancel deletes every task's Job; a retried create makes none twice."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from rest_framework.test import APIClient

from accounting.models import UsageRecord
from accounting.services.ingestion import usage_ingest
from jobs.choices import JobState
from jobs.models import Job, JobLogCopy
from jobs.services import job_cancel, job_cancel_relay_run, job_relay_run, jobs_sync
from jobs.services.relay import _submission_for
from portal.slurm import get_gateway
from portal.slurm.kube_job import task_number
from tests.conftest import K8S_CLUSTER
from tests.support import job_payload, wait_for

pytestmark = pytest.mark.k8s

SCRIPT = ('#!/bin/bash\n#SBATCH --array=0-2\n'
          'echo "task=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT ($SLURM_ARRAY_TASK_MIN-$SLURM_ARRAY_TASK_MAX) '
          'array=$SLURM_ARRAY_JOB_ID"\nsleep "$SLURM_ARRAY_TASK_ID"\n')  # fmt: skip


def _post(user, **fields) -> str:
    api = APIClient()
    api.force_authenticate(user=user)
    body = job_payload(cluster=K8S_CLUSTER, **({"gpus": 1, "gpu_type": "a100", "cpus_per_gpu": 1, "memory_gb": 1,
                                                "time_limit_minutes": 5} | fields))  # fmt: skip
    body.pop("partition")
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    job_relay_run(job_id)
    return job_id


def _kube_jobs(k8s_portal, namespace, job_id):
    return client.BatchV1Api(k8s_portal).list_namespaced_job(namespace, label_selector=f"gpuportal.io/job={job_id}").items


def _synced_until(job_id, states, *, timeout=90):
    def reached():
        jobs_sync(cluster=K8S_CLUSTER)
        job = Job.objects.get(pk=job_id)
        return job if job.state in states else None

    return wait_for(reached, timeout=timeout, interval=0.5, what=f"the portal's job to reach {sorted(states)}")


def test_an_array_of_three_runs_as_three_jobs_each_task_sees_its_index_and_the_job_completes_with_three_tasks_and_usages(
    k8s_cluster, k8s_namespace, k8s_portal, world
):
    job_id = _post(world.alice, script=SCRIPT)
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.array, job.array_tasks) == (JobState.PENDING, "0-2", 3)
    kube_jobs = _kube_jobs(k8s_portal, k8s_namespace, job_id)
    assert sorted(j.metadata.name for j in kube_jobs) == [f"gpuportal-{job_id}-{i}" for i in range(3)]
    assert {j.metadata.labels["gpuportal.io/array-task"] for j in kube_jobs} == {"0", "1", "2"}
    assert all(j.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"} for j in kube_jobs)

    # a retried create (the relay's, after its create went through): 409 for each task, no second Job
    assert get_gateway(K8S_CLUSTER).submit(_submission_for(job)) == job.slurm_job_id
    assert len(_kube_jobs(k8s_portal, k8s_namespace, job_id)) == 3

    done = _synced_until(job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
    assert (done.state, done.exit_code) == (JobState.COMPLETED, 0)
    tasks = {t.index: t for t in done.array_task_rows.all()}
    assert sorted(tasks) == [0, 1, 2]
    assert {i: (t.state, t.exit_code, t.slurm_job_id) for i, t in tasks.items()} == {
        i: (JobState.COMPLETED, 0, task_number(job.slurm_job_id, i)) for i in range(3)}  # fmt: skip
    assert all(t.started_at is not None and t.ended_at >= t.started_at for t in tasks.values())
    # each task's times are its own pod's (they sleep for their index: they end apart)
    for pod in client.CoreV1Api(k8s_portal).list_namespaced_pod(k8s_namespace, label_selector=f"gpuportal.io/job={job_id}").items:
        ended = pod.status.container_statuses[0].state.terminated
        index = int(pod.metadata.labels["gpuportal.io/array-task"])
        assert (tasks[index].started_at, tasks[index].ended_at) == (ended.started_at, ended.finished_at), index

    # each task's output, read through the portal: its own pod's log
    api = APIClient()
    api.force_authenticate(user=world.alice)
    for index in range(3):
        chunk = api.get(f"/api/v1/jobs/{job_id}/output/", {"task": index}).json()
        assert chunk["data"] == f"task={index} of 3 (0-2) array={job.slurm_job_id}\n", chunk
    assert api.get(f"/api/v1/jobs/{job_id}/output/").json()["data"].startswith("task=0 of 3")  # default: the first

    usage_ingest(cluster=K8S_CLUSTER)
    records = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert sorted(r.job_id for r in records) == [task_number(job.slurm_job_id, i) for i in range(3)]
    assert all(r.gpus == 1 for r in records)


def test_cancel_of_a_running_array_deletes_every_tasks_job(k8s_cluster, k8s_namespace, k8s_portal, world):
    job_id = _post(world.alice, script="#!/bin/bash\n#SBATCH --array=0-2\nexec sleep 600\n")
    assert len(_kube_jobs(k8s_portal, k8s_namespace, job_id)) == 3

    def all_running():
        jobs_sync(cluster=K8S_CLUSTER)
        return Job.objects.get(pk=job_id).array_task_rows.filter(state=JobState.RUNNING).count() == 3

    wait_for(all_running, timeout=60, interval=0.5, what="the three tasks to run")
    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    assert job_cancel_relay_run(job_id) == "sent"
    wait_for(lambda: not _kube_jobs(k8s_portal, k8s_namespace, job_id), timeout=60, what="every task's Job to be deleted")
    job = _synced_until(job_id, {JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED})
    assert job.state == JobState.CANCELLED
    tasks = list(job.array_task_rows.all())
    assert len(tasks) == 3 and {t.state for t in tasks} == {JobState.CANCELLED}
    assert all(t.started_at is not None and t.slurm_job_id == task_number(job.slurm_job_id, t.index) for t in tasks)
    # what each running task ran up to the deletion, recorded by the cancel (no accounting keeps it)
    records = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert sorted(r.job_id for r in records) == sorted(t.slurm_job_id for t in tasks)


def test_a_throttled_array_is_a_400_naming_array_and_never_reaches_kubernetes(k8s_cluster, k8s_namespace, k8s_portal, world):
    api = APIClient()
    api.force_authenticate(user=world.alice)
    body = job_payload(cluster=K8S_CLUSTER, gpus=1, script="#!/bin/bash\n#SBATCH --array=0-3%2\ntrue\n")
    body.pop("partition")
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.json()
    messages = [m for ms in response.json()["errors"].values() for m in ms]
    assert any("--array" in m and "%N limit" in m for m in messages), messages
    assert not Job.objects.exists()
    assert client.BatchV1Api(k8s_portal).list_namespaced_job(k8s_namespace).items == []


def test_a_finished_arrays_jobs_are_deleted_by_the_ttl_and_each_tasks_output_is_read_from_its_kept_copy(
    k8s_cluster, k8s_namespace, k8s_portal, world, settings
):
    settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = 1
    job_id = _post(world.alice, script=SCRIPT)
    job = _synced_until(job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
    assert job.state == JobState.COMPLETED
    api = APIClient()
    api.force_authenticate(user=world.alice)
    live = {i: api.get(f"/api/v1/jobs/{job_id}/output/", {"task": i}).json()["data"] for i in range(3)}
    assert live == {i: f"task={i} of 3 (0-2) array={job.slurm_job_id}\n" for i in range(3)}
    assert jobs_sync(cluster=K8S_CLUSTER).get("deleted", 0) == 0  # usage not final yet: the Jobs stay
    assert len(_kube_jobs(k8s_portal, k8s_namespace, job_id)) == 3

    usage_ingest(cluster=K8S_CLUSTER)  # each task's final usage
    time.sleep(settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS + 1)
    assert jobs_sync(cluster=K8S_CLUSTER)["deleted"] == 1  # the array: its three Jobs in one deletecollection
    wait_for(lambda: not client.CoreV1Api(k8s_portal).list_namespaced_pod(k8s_namespace, label_selector=f"gpuportal.io/job={job_id}").items,
             timeout=30, what="the tasks' pods (and their logs) to be gone")  # fmt: skip
    assert _kube_jobs(k8s_portal, k8s_namespace, job_id) == []
    assert {c.task: bytes(c.data).decode() for c in JobLogCopy.objects.filter(job_id=job_id)} == live
    for index in range(3):
        chunk = api.get(f"/api/v1/jobs/{job_id}/output/", {"task": index}).json()
        assert (chunk["data"], chunk["eof"], chunk["final"], chunk["message"]) == (live[index], True, True, ""), index
    page = APIClient()
    page.force_login(world.alice)
    assert live[2].strip() in page.get(f"/jobs/{job_id}/output/?task=2", HTTP_HX_REQUEST="true").content.decode()
