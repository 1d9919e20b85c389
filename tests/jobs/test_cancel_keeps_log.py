"""A Kubernetes job cancelled while it runs (issue 41): the cancel deletes its Jobs, and their pods' logs
(the job's output) with them, so job_cancel_relay_run keeps the logs first (job_logs_keep, each task's
for an array) — and when they cannot be read, cancels all the same. The gateway is the Kubernetes one
with its log reads and its delete in memory; tests/k8s/test_kubernetes_output.py runs it for real."""

from __future__ import annotations

import pytest

from jobs.choices import JobState
from jobs.models import Job, JobLogCopy
from jobs.services import job_cancel, job_cancel_relay_run
from portal.models import Cluster
from portal.services import clusters_record
from portal.slurm import ClusterConfig
from tests.factories import JobFactory
from tests.jobs.test_output_keep import K8S, KeptLogs

pytestmark = pytest.mark.django_db


class Cancelling(KeptLogs):
    def cancel(self, job_id):
        self.cancelled = job_id


@pytest.fixture
def running_kube_array(settings, world):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("main", "cli"),
                                   ClusterConfig(K8S, "kubernetes", kind="kubernetes", kubeconfig="/nonexistent"))  # fmt: skip
    clusters_record()
    return JobFactory(team=world.vision, submitter=world.alice, state=JobState.RUNNING, cluster=Cluster.objects.get(name=K8S),
                      slurm_cluster=K8S, slurm_job_id=77, array="0-1", array_tasks=2)  # fmt: skip


def test_a_running_jobs_logs_are_kept_before_its_cancel_deletes_its_jobs(running_kube_array, world, use_gateway):
    gateway = use_gateway(Cancelling({77: {0: ("p-0", b"task 0 so far\n"), 1: ("p-1", b"task 1 so far\n")}}))
    job_cancel(user=world.alice, job=running_kube_array)
    assert job_cancel_relay_run(running_kube_array.pk) == "sent" and gateway.cancelled == 77
    assert {c.task: bytes(c.data) for c in JobLogCopy.objects.filter(job=running_kube_array)} == {
        0: b"task 0 so far\n", 1: b"task 1 so far\n"}  # fmt: skip


def test_a_log_that_cannot_be_read_does_not_hold_the_cancel_back(running_kube_array, world, use_gateway):
    gateway = use_gateway(Cancelling({}, down=True))
    job_cancel(user=world.alice, job=running_kube_array)
    assert job_cancel_relay_run(running_kube_array.pk) == "sent" and gateway.cancelled == 77
    assert Job.objects.get(pk=running_kube_array.pk).cancel_sent_at is not None
    assert gateway.asked and not JobLogCopy.objects.exists()
