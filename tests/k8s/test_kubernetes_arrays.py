"""Array jobs on the local Kubernetes cluster (issue 41): an ``--array`` job runs as one batch/v1 Job
per task (Kubernetes 1.20 has no Indexed Jobs), each pod with Slurm's SLURM_ARRAY_* variables, and
the portal follows it as it follows a Slurm array — one task row per task, one usage record per task,
the job's end folded from its tasks' — through the gateway's queue and accounting (one entry per task,
its own id and its array's). A cancel deletes every task's Job; a retried create makes none twice. A
``%N`` limit is the portal's: the first N tasks' Jobs at submission, the next ones created by the sync
as earlier ones end. One task cancelled alone keeps its log (the worker's cancel keeps it first)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from rest_framework.test import APIClient

from accounting.models import UsageRecord
from accounting.services.ingestion import usage_ingest
from jobs.choices import JobState
from jobs.models import Job, JobLogCopy
from jobs.services import (
    job_array_task_cancel_relay_run,
    job_cancel,
    job_cancel_relay_run,
    job_relay_run,
    jobs_sync,
)
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


def _unfinished(kube_jobs) -> list[str]:
    """The task indexes of the Jobs that exist and have not finished (no Complete nor Failed condition)."""
    return sorted(j.metadata.labels["gpuportal.io/array-task"] for j in kube_jobs
                  if not any(c.type in ("Complete", "Failed") and c.status == "True" for c in j.status.conditions or []))  # fmt: skip


def test_a_throttled_array_runs_at_most_its_limit_at_once_the_portal_starting_the_next_tasks_and_every_task_is_charged(
    k8s_cluster, k8s_namespace, k8s_portal, world
):
    job_id = _post(world.alice, script="#!/bin/bash\n#SBATCH --array=0-3%2\necho \"task=$SLURM_ARRAY_TASK_ID\"\nsleep 2\n")
    job = Job.objects.get(pk=job_id)
    assert (job.array, job.array_tasks, job.array_throttle) == ("0-3%2", 4, 2)
    # the submission created the first two tasks' Jobs only
    assert sorted(j.metadata.name for j in _kube_jobs(k8s_portal, k8s_namespace, job_id)) == [f"gpuportal-{job_id}-{i}" for i in (0, 1)]
    jobs_sync(cluster=K8S_CLUSTER)
    states = dict(job.array_task_rows.values_list("index", "state"))
    assert states[2] == states[3] == JobState.PENDING  # the tasks waiting for a slot: pending, as on Slurm

    seen: set[str] = set()
    most = 0

    def ended():
        nonlocal most
        jobs_sync(cluster=K8S_CLUSTER)  # the only place tasks are created: the count after it is the cycle's highest
        kube_jobs = _kube_jobs(k8s_portal, k8s_namespace, job_id)
        seen.update(j.metadata.labels["gpuportal.io/array-task"] for j in kube_jobs)
        most = max(most, len(_unfinished(kube_jobs)))
        current = Job.objects.get(pk=job_id)
        return current if current.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED) else None

    done = wait_for(ended, timeout=120, interval=0.5, what="the throttled array to end")
    assert (done.state, done.exit_code) == (JobState.COMPLETED, 0)
    assert most == 2 and seen == {"0", "1", "2", "3"}  # never more than %2 at once; every task ran
    assert sorted(j.metadata.name for j in _kube_jobs(k8s_portal, k8s_namespace, job_id)) == [f"gpuportal-{job_id}-{i}" for i in range(4)]
    tasks = {t.index: t for t in done.array_task_rows.all()}
    assert {i: (t.state, t.exit_code) for i, t in tasks.items()} == {i: (JobState.COMPLETED, 0) for i in range(4)}
    # tasks 2 and 3 started once a task before them had ended
    first_end = min(tasks[0].ended_at, tasks[1].ended_at)
    assert tasks[2].started_at >= first_end and tasks[3].started_at >= first_end

    usage_ingest(cluster=K8S_CLUSTER)
    records = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert sorted(r.job_id for r in records) == [task_number(job.slurm_job_id, i) for i in range(4)]
    assert all(r.gpus == 1 and not r.provisional and r.gpu_seconds > 0 for r in records)  # each charged, final


def test_a_throttled_array_whose_cancel_is_asked_for_starts_no_more_tasks(k8s_cluster, k8s_namespace, k8s_portal, world):
    job_id = _post(world.alice, script="#!/bin/bash\n#SBATCH --array=0-3%1\nsleep 1\n")
    assert [j.metadata.name for j in _kube_jobs(k8s_portal, k8s_namespace, job_id)] == [f"gpuportal-{job_id}-0"]
    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))  # asked for; its relay not run yet

    def task_0_ended():
        jobs_sync(cluster=K8S_CLUSTER)
        return not _unfinished(_kube_jobs(k8s_portal, k8s_namespace, job_id))

    wait_for(task_0_ended, timeout=60, interval=0.5, what="task 0 to end")
    for _ in range(3):  # its slot is free, and the job's cancel asked for: no task is started
        jobs_sync(cluster=K8S_CLUSTER)
    assert [j.metadata.name for j in _kube_jobs(k8s_portal, k8s_namespace, job_id)] == [f"gpuportal-{job_id}-0"]
    assert job_cancel_relay_run(job_id) == "sent"
    job = _synced_until(job_id, {JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED})
    assert job.state == JobState.CANCELLED
    assert _kube_jobs(k8s_portal, k8s_namespace, job_id) == []
    assert dict(job.array_task_rows.values_list("index", "state")) == {
        0: JobState.COMPLETED, 1: JobState.CANCELLED, 2: JobState.CANCELLED, 3: JobState.CANCELLED}  # fmt: skip


def test_one_task_cancelled_alone_keeps_its_log_and_the_other_tasks_go_on(k8s_cluster, k8s_namespace, k8s_portal, world):
    job_id = _post(world.alice, script='#!/bin/bash\n#SBATCH --array=0-2\necho "task $SLURM_ARRAY_TASK_ID started"\nexec sleep 600\n')
    api = APIClient()
    api.force_authenticate(user=world.alice)

    def all_writing():
        jobs_sync(cluster=K8S_CLUSTER)
        return all(api.get(f"/api/v1/jobs/{job_id}/output/", {"task": i}).json()["data"] == f"task {i} started\n" for i in range(3))

    wait_for(all_writing, timeout=60, interval=0.5, what="the three tasks to run and write")
    response = api.post(f"/api/v1/jobs/{job_id}/cancel/?task=1")
    assert response.status_code == 202, response.json()
    assert len(_kube_jobs(k8s_portal, k8s_namespace, job_id)) == 3  # the request asked for it; the worker does it
    assert job_array_task_cancel_relay_run(job_id, 1) == "sent"  # what the job_array_task_cancel_relay task does
    wait_for(lambda: sorted(j.metadata.labels["gpuportal.io/array-task"] for j in _kube_jobs(k8s_portal, k8s_namespace, job_id)) == ["0", "2"],
             timeout=60, what="task 1's Job to be deleted")  # fmt: skip
    wait_for(lambda: not client.CoreV1Api(k8s_portal).list_namespaced_pod(
        k8s_namespace, label_selector=f"gpuportal.io/job={job_id},gpuportal.io/array-task=1").items, timeout=60,
        what="task 1's pod (and its log) to be gone")  # fmt: skip
    # its log kept by the cancel, that task's alone (the others still run: their logs are live)
    assert [(c.task, bytes(c.data).decode()) for c in JobLogCopy.objects.filter(job_id=job_id)] == [(1, "task 1 started\n")]
    chunk = api.get(f"/api/v1/jobs/{job_id}/output/", {"task": 1}).json()
    assert (chunk["data"], chunk["final"]) == ("task 1 started\n", True), chunk
    assert api.get(f"/api/v1/jobs/{job_id}/output/", {"task": 2}).json()["data"] == "task 2 started\n"
    jobs_sync(cluster=K8S_CLUSTER)
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.RUNNING  # the other tasks go on
    assert dict(job.array_task_rows.values_list("index", "state")) == {0: JobState.RUNNING, 1: JobState.CANCELLED, 2: JobState.RUNNING}
    assert job_array_task_cancel_relay_run(job_id, 1) == "nothing-to-do"  # a repeat (the sweeper's) does nothing


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
