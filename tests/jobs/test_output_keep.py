"""jobs.services.output.job_logs_keep, what the jobs sync calls before it deletes finished Kubernetes Jobs: which
Jobs may go (their log kept, or none to keep) and which stay (their log not readable now). The gateway
is the Kubernetes gateway with its log reads in memory (KeptLogs); tests/k8s/test_kubernetes_output.py
runs the same against the real API server and node agent."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import JobLogCopy
from jobs.services.output import job_logs_keep
from portal.slurm import SlurmUnavailable
from portal.slurm.kubernetes import KubernetesGateway
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

K8S = "gpuportal-k8s"


class KeptLogs(KubernetesGateway):
    """``job_logs`` from a dict by job number, then by array task index (None: not an array; a number
    left out: a log of its could not be read); ``down``: the API server does not answer."""

    def __init__(self, logs: dict[int, dict[int | None, tuple[str, bytes]]], *, down: bool = False, denied=()):
        super().__init__(cluster=K8S, kubeconfig="/nonexistent", timeout=1, image="i", gpu_type_label="l")
        self.logs, self.down, self.denied, self.asked = logs, down, denied, []

    def job_logs(self, jobs, *, limit_bytes, task=None):
        self.asked.append((sorted(jobs), limit_bytes) if task is None else (sorted(jobs), limit_bytes, task))
        if self.down:
            raise SlurmUnavailable("list pods: connection refused")
        logs = {n: {i: log for i, log in self.logs[n].items() if task is None or i == task} for _, n in jobs if n in self.logs}
        return logs, [f"namespace {ns}: denied" for ns in self.denied]


@pytest.fixture
def ended(world):
    def make(number, **fields):
        return JobFactory(team=world.vision, submitter=world.alice, state=JobState.COMPLETED, slurm_cluster=K8S,
                          slurm_job_id=number, started_at=timezone.now(), ended_at=timezone.now(), **fields)  # fmt: skip

    return make


def test_only_jobs_whose_log_is_kept_or_has_none_may_go_and_a_kept_log_is_not_read_again(ended, settings):
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 4
    read, unreadable, no_pod, kept = ended(11), ended(12), ended(13), ended(14)
    JobLogCopy.objects.create(job=kept, ended_at=kept.ended_at, saved_at=timezone.now(), pod="p-14", data=b"old")
    gateway = KeptLogs({11: {None: ("p-11", b"0123456789")}, 13: {}}, denied=["other"])
    jobs = [("ns", 11), ("ns", 12), ("ns", 13), ("ns", 14)]
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=jobs) == ([("ns", 14), ("ns", 11), ("ns", 13)], ["namespace other: denied"])
    assert gateway.asked == [([("ns", 11), ("ns", 12), ("ns", 13)], 5)]  # one byte past the cap: was there more
    copy = JobLogCopy.objects.get(job=read)
    assert (bytes(copy.data), copy.truncated, copy.pod, copy.ended_at) == (b"0123", True, "p-11", read.ended_at)
    assert not JobLogCopy.objects.filter(job__in=[unreadable, no_pod]).exists()
    assert bytes(JobLogCopy.objects.get(job=kept).data) == b"old"


def test_an_api_server_that_does_not_answer_keeps_every_job_whose_log_is_not_kept(ended, settings):
    ended(21), ended(22)
    assert job_logs_keep(gateway=KeptLogs({}, down=True), cluster=K8S, jobs=[("ns", 21), ("ns", 22)]) == ([], [])
    assert not JobLogCopy.objects.exists()
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 0  # none kept: every Job may go, no log read
    gateway = KeptLogs({}, down=True)
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 21), ("ns", 22)]) == ([("ns", 21), ("ns", 22)], [])
    assert gateway.asked == []


def test_an_arrays_tasks_each_keep_their_own_log_and_the_array_goes_only_once_every_tasks_log_is_kept(ended, settings):
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 100
    array, unread = ended(31, array="0-2", array_tasks=3), ended(32, array="0-1", array_tasks=2)
    gateway = KeptLogs({31: {0: ("p-0", b"task 0\n"), 1: ("p-1", b"task 1\n"), 2: ("p-2", b"task 2\n")}})
    # 32: one of its tasks' logs could not be read (left out whole): its Jobs stay, nothing kept of it
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 31), ("ns", 32)]) == ([("ns", 31)], [])
    copies = {c.task: (c.pod, bytes(c.data)) for c in JobLogCopy.objects.filter(job=array)}
    assert copies == {i: (f"p-{i}", f"task {i}\n".encode()) for i in range(3)}
    assert not JobLogCopy.objects.filter(job=unread).exists()
    # every task kept: not read again; a task kept of an array with one never started: read again, no copy twice
    gateway = KeptLogs({32: {0: ("p-0", b"only task 0 ran\n")}})
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 31), ("ns", 32)]) == ([("ns", 31), ("ns", 32)], [])
    assert gateway.asked == [([("ns", 32)], 101)]
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 32)]) == ([("ns", 32)], [])
    assert [(c.task, bytes(c.data)) for c in JobLogCopy.objects.filter(job=unread)] == [(0, b"only task 0 ran\n")]


def test_one_task_cancelled_alone_keeps_its_own_log_only_and_not_twice(ended, settings):
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 100
    array = ended(41, array="0-2", array_tasks=3)
    gateway = KeptLogs({41: {0: ("p-0", b"task 0 so far\n"), 1: ("p-1", b"task 1 so far\n")}})
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 41)], task=1) == ([("ns", 41)], [])
    assert gateway.asked == [([("ns", 41)], 101, 1)]  # that task's pods alone
    assert [(c.task, bytes(c.data)) for c in JobLogCopy.objects.filter(job=array)] == [(1, b"task 1 so far\n")]
    # kept: not read again for that task; another task of the same array is read
    assert job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 41)], task=1) == ([("ns", 41)], [])
    assert len(gateway.asked) == 1
    job_logs_keep(gateway=gateway, cluster=K8S, jobs=[("ns", 41)], task=0)
    assert gateway.asked[1:] == [([("ns", 41)], 101, 0)]
    assert sorted(JobLogCopy.objects.filter(job=array).values_list("task", flat=True)) == [0, 1]
