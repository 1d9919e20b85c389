"""A Kubernetes job's output once its Job is deleted (issue 41): jobs.selectors.job_output — the one reader
of the page, the API and the CLI — serves the copy of the pod's log the sync kept (JobLogCopy). The
cluster's kubeconfig does not exist here, so any call to the API server is an unreadable log: a whole
copy is served without one, a copy cut short when the log cannot be had, and it says it was cut.
tests/k8s/test_kubernetes_output.py proves it on the real control plane."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.models import JobLogCopy
from jobs.selectors import job_output
from portal.services import clusters_record
from portal.slurm import ClusterConfig
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

K8S = "gpuportal-k8s"
LOG = "epoch 1 loss 0.9\nepoch 2 loss 0.5\n".encode()


@pytest.fixture
def ended_kube_job(settings, world):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("main", "cli"),
                                   ClusterConfig(K8S, "kubernetes", kind="kubernetes", kubeconfig="/nonexistent"))  # fmt: skip
    clusters_record()
    return JobFactory(team=world.vision, submitter=world.alice, state=JobState.COMPLETED, slurm_cluster=K8S,
                      slurm_job_id=4242, started_at=timezone.now(), ended_at=timezone.now())  # fmt: skip


def _keep(job, data: bytes, *, truncated: bool) -> None:
    JobLogCopy.objects.create(job=job, ended_at=job.ended_at, saved_at=timezone.now(), pod="p-1", data=data, truncated=truncated)


def test_a_whole_copy_is_served_without_asking_the_api_server(ended_kube_job):
    assert "cannot be read" in job_output(job=ended_kube_job).message  # no copy: the pod's log, which cannot be had here
    _keep(ended_kube_job, LOG, truncated=False)
    chunk = job_output(job=ended_kube_job)
    assert (chunk.data.encode(), chunk.size, chunk.eof, chunk.final, chunk.message) == (LOG, len(LOG), True, True, "")
    tail = job_output(job=ended_kube_job, offset=8, length=8)
    assert (tail.data, tail.next_offset, tail.eof) == (LOG[8:16].decode(), 16, False)


def test_a_copy_cut_short_is_served_when_the_pods_log_is_gone_and_says_so_at_its_end(ended_kube_job, world):
    _keep(ended_kube_job, LOG[:20], truncated=True)
    first = job_output(job=ended_kube_job, offset=0, length=10)
    assert (first.data, first.eof, first.message) == (LOG[:10].decode(), False, "")
    last = job_output(job=ended_kube_job, offset=10, length=100)
    assert (last.data, last.next_offset, last.size, last.eof, last.final) == (LOG[10:20].decode(), 20, 20, True, True)
    assert "longer than the first 20 bytes the portal kept" in last.message and "GPUPORTAL_K8S_LOG_COPY_MAX_BYTES" in last.message

    api = APIClient()
    api.force_authenticate(user=world.alice)
    body = api.get(f"/api/v1/jobs/{ended_kube_job.pk}/output/").json()
    assert (body["data"], body["message"]) == (LOG[:20].decode(), last.message)
    page = APIClient()
    page.force_login(world.alice)
    html = page.get(f"/jobs/{ended_kube_job.pk}/output/", HTTP_HX_REQUEST="true").content.decode()
    assert "epoch 1 loss 0.9" in html and "the portal kept of it" in html  # the data, and the note beside it


def test_an_array_tasks_output_is_its_own_kept_copy_on_the_api_and_the_page(ended_kube_job, world):
    ended_kube_job.array, ended_kube_job.array_tasks = "0-2", 3
    ended_kube_job.save(update_fields=["array", "array_tasks"])
    for index in range(3):
        JobLogCopy.objects.create(job=ended_kube_job, task=index, ended_at=ended_kube_job.ended_at, saved_at=timezone.now(),
                                  pod=f"p-{index}", data=f"task {index}\n".encode())  # fmt: skip
    assert [job_output(job=ended_kube_job, task=i).data for i in range(3)] == [f"task {i}\n" for i in range(3)]
    assert job_output(job=ended_kube_job).data == "task 0\n"  # default: the first task's, as on Slurm
    api = APIClient()
    api.force_authenticate(user=world.alice)
    assert api.get(f"/api/v1/jobs/{ended_kube_job.pk}/output/", {"task": 2}).json()["data"] == "task 2\n"
    page = APIClient()
    page.force_login(world.alice)
    assert "task 1" in page.get(f"/jobs/{ended_kube_job.pk}/output/?task=1", HTTP_HX_REQUEST="true").content.decode()


def test_a_task_cancelled_alone_is_read_from_its_copy_while_its_array_goes_on(ended_kube_job, world):
    ended_kube_job.array, ended_kube_job.array_tasks, ended_kube_job.state = "0-2", 3, JobState.RUNNING
    ended_kube_job.ended_at = None
    ended_kube_job.save(update_fields=["array", "array_tasks", "state", "ended_at"])
    JobLogCopy.objects.create(job=ended_kube_job, task=1, ended_at=timezone.now(), saved_at=timezone.now(), pod="p-1",
                              data=LOG)  # fmt: skip
    chunk = job_output(job=ended_kube_job, task=1)  # its pod gone (here: no API server): the copy, whole
    assert (chunk.data.encode(), chunk.eof, chunk.final, chunk.message) == (LOG, True, True, "")
    assert "cannot be read" in job_output(job=ended_kube_job, task=0).message  # a running task: its pod's log only
