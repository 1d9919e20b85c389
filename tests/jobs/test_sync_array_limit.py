"""A ``%N`` array on Kubernetes (issue 41), in the jobs sync: no scheduler holds its tasks back there, so
the sync starts the next ones (gateway.array_tasks_start) as earlier ones end, from the cycle's one
list of Jobs — never more than N unfinished, never a task cancelled alone, none once the whole job's
cancel is asked for — and shows the tasks not started as pending. The gateway is the Kubernetes
gateway with its list and creates in memory (HeldTasks); tests/k8s/test_kubernetes_arrays.py runs
the same against the real API server."""

from __future__ import annotations

import pytest
from django.utils import timezone

import jobs.services.sync as sync_module
from jobs.choices import JobState
from jobs.models import Job, JobArrayTask
from jobs.services import job_array_task_cancel, job_cancel, jobs_sync
from portal.slurm import SlurmUnavailable
from portal.slurm.kube_job import task_number
from portal.slurm.kubernetes import KubernetesGateway
from portal.slurm.types import QueueEntry
from tests.jobs.test_spec_kubernetes import K8S, _submit, kube_inventory  # noqa: F401 — the fixture

pytestmark = pytest.mark.django_db
NUMBER = 4_000_000_000


class HeldTasks(KubernetesGateway):
    """The array's task Jobs the cluster holds, by index, in Slurm's words (``tasks``); ``created``: the
    indexes each array_tasks_start was asked for; ``down``: creates fail as the API server not answering."""

    def __init__(self, job: Job):
        super().__init__(cluster=K8S, kubeconfig="/nonexistent", timeout=1, image="i", gpu_type_label="l")
        self.job, self.tasks, self.created, self.down = job, {}, [], False

    def queue(self):
        now = timezone.now()
        return [
            QueueEntry(job_id=task_number(NUMBER, i), name="a", user="alice", account="vision-ns", partition="kubernetes",
                       state=state, reason="None", comment=self.job.slurm_tag, nodes="", num_nodes=1, submit_time=now,
                       start_time=now if state != "PENDING" else None, end_time=now if state == "COMPLETED" else None,
                       time_limit_minutes=30, tres_per_node="gres:gpu:1", array_job_id=NUMBER, array_tasks=str(i))
            for i, state in sorted(self.tasks.items())
        ]  # fmt: skip

    def accounting(self, start, end, *, job_ids=None):
        return []

    def array_tasks_start(self, submission, indexes):
        if self.down:
            raise SlurmUnavailable("create job: connection refused")
        assert dict(submission.request.options)["array"] == "0-5%2"  # the stored request, as the relay hands it
        self.created.append(list(indexes))
        self.tasks.update(dict.fromkeys(indexes, "PENDING"))


@pytest.fixture
def held(kube_inventory, world, settings, monkeypatch, relays):  # noqa: F811
    settings.SLURM_SUBMIT_AS_USER = False
    settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = 0
    response = _submit(world.alice, array="0-5%2")
    assert response.status_code == 201, response.json()
    Job.objects.filter(pk=response.json()["id"]).update(state=JobState.PENDING, slurm_job_id=NUMBER, slurm_cluster=K8S)
    gateway = HeldTasks(Job.objects.get(pk=response.json()["id"]))
    gateway.tasks = {0: "PENDING", 1: "PENDING"}  # what the submission created: the first two
    monkeypatch.setattr(sync_module, "get_gateway", lambda name=None: gateway)
    return gateway


def _tasks(job) -> dict[int, str]:
    return dict(JobArrayTask.objects.filter(job=job).values_list("index", "state"))


def test_the_next_tasks_start_as_earlier_ones_end_never_more_than_the_limit_and_the_others_show_pending(held, world):
    job = held.job
    assert jobs_sync(cluster=K8S)["array_tasks_started"] == 0
    assert held.created == [] and _tasks(job) == dict.fromkeys(range(6), JobState.PENDING)
    held.tasks = {0: "RUNNING", 1: "RUNNING"}
    jobs_sync(cluster=K8S)
    assert held.created == [] and Job.objects.get(pk=job.pk).state == JobState.RUNNING

    held.tasks[0] = "COMPLETED"  # one slot free: the lowest waiting task, once
    assert jobs_sync(cluster=K8S)["array_tasks_started"] == 1
    assert held.created == [[2]]
    assert _tasks(job) == {0: JobState.COMPLETED, 1: JobState.RUNNING} | dict.fromkeys(range(2, 6), JobState.PENDING)
    jobs_sync(cluster=K8S)  # task 2's Job held now (pending): nothing more
    assert held.created == [[2]]

    # a waiting task cancelled alone is never started; the whole job's cancel asked for: nothing more started
    job_array_task_cancel(user=world.alice, job=Job.objects.get(pk=job.pk), index=3)
    held.tasks |= {1: "COMPLETED", 2: "RUNNING"}
    jobs_sync(cluster=K8S)
    assert held.created == [[2], [4]]
    job_cancel(user=world.alice, job=Job.objects.get(pk=job.pk))
    held.tasks |= {2: "COMPLETED", 4: "COMPLETED"}
    jobs_sync(cluster=K8S)
    assert held.created == [[2], [4]]


def test_a_create_that_fails_is_tried_again_next_cycle_and_the_tasks_stay_pending(held):
    held.tasks = {0: "COMPLETED", 1: "COMPLETED"}
    held.down = True
    stats = jobs_sync(cluster=K8S)
    assert "connection refused" in stats["array_tasks_error"] and held.created == []
    job = Job.objects.get(pk=held.job.pk)
    assert job.state == JobState.PENDING and _tasks(job)[2] == JobState.PENDING
    held.down = False
    jobs_sync(cluster=K8S)
    assert held.created == [[2, 3]]


def test_a_task_the_cluster_held_once_is_never_created_again(held):
    held.tasks = {0: "RUNNING", 1: "RUNNING"}
    jobs_sync(cluster=K8S)
    del held.tasks[1]  # its Job deleted by hand: the task is not run a second time
    held.tasks[0] = "COMPLETED"
    jobs_sync(cluster=K8S)
    assert held.created == [[2, 3]]  # two slots (0 ended, 1 gone): the next two, not task 1
