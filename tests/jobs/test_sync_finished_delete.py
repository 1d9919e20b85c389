"""The jobs sync's deletion of finished Kubernetes Jobs (jobs.services.sync._finished_jobs_delete): which
jobs' Jobs go — a job that is not an array by its queue entry, an array by its tasks' entries (each with
its own id and the array's number) once every task ended before the TTL's cut, the portal's job is
terminal and each task's usage is final or the task never started — and that their logs are kept first
(KeptLogs: the Kubernetes gateway with its log reads in memory). tests/k8s/test_kubernetes_output.py
runs it against the real API server."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from accounting.models import UsageRecord
from jobs.choices import JobState
from jobs.models import JobLogCopy
from jobs.services.sync import _finished_jobs_delete
from portal.slurm.kube_job import task_number
from portal.slurm.types import QueueEntry
from tests.factories import JobFactory
from tests.jobs.test_output_keep import K8S, KeptLogs

pytestmark = pytest.mark.django_db

NOW = timezone.now()
CUT = NOW - dt.timedelta(minutes=10)


class Deleting(KeptLogs):
    def jobs_delete(self, jobs):
        self.deleted = sorted(jobs)
        return len(self.deleted), []


def _entry(job_id, *, state="COMPLETED", ended=CUT - dt.timedelta(minutes=1), started=True, array=None, task=""):
    return QueueEntry(job_id=job_id, name="j", user="1000", account="ns", partition="kubernetes", state=state, reason="None",
                      comment="", nodes="", num_nodes=1, submit_time=CUT - dt.timedelta(hours=1),
                      start_time=CUT - dt.timedelta(minutes=30) if started else None, end_time=ended,
                      time_limit_minutes=5, tres_per_node="", array_job_id=array, array_tasks=task)  # fmt: skip


def _charged(world, *job_ids):
    for job_id in job_ids:
        UsageRecord.objects.create(
            cluster=K8S, job_id=job_id, submit_time=CUT, start_time=CUT, state="COMPLETED", account="ns", team=world.vision,
            unix_user="alice", gpus=1, gpu_seconds=60, elapsed_seconds=60, known_until=CUT, first_seen_at=CUT, provisional=False,
        )  # fmt: skip


def _job(world, number, **fields):
    return JobFactory(**({"team": world.vision, "submitter": world.alice, "state": JobState.COMPLETED, "slurm_cluster": K8S,
                          "slurm_job_id": number, "started_at": CUT, "ended_at": CUT} | fields))  # fmt: skip


def _array(number, *, never_started=(), **entry):
    return [_entry(task_number(number, i), array=number, task=str(i), started=i not in never_started, **entry) for i in range(3)]


def test_an_arrays_jobs_go_once_every_task_ended_before_the_cut_and_is_charged_each_tasks_log_kept_first(world, settings):
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 100
    _job(world, 100, array="0-2", array_tasks=3)
    _job(world, 200, array="0-2", array_tasks=3)  # one task ended after the cut
    _job(world, 300, array="0-2", array_tasks=3)  # one task's usage not final yet
    unended = _job(world, 400, array="0-2", array_tasks=3, state=JobState.RUNNING, ended_at=None)  # the portal's job not terminal
    _job(world, 500, array="0-2", array_tasks=3)  # task 2 never started: nothing to charge
    _job(world, 600)  # not an array
    queue = [*_array(100), *_array(200)[:2], _entry(task_number(200, 2), array=200, task="2", ended=NOW),
             *_array(300), *_array(400), *_array(500, never_started=(2,)), _entry(600)]  # fmt: skip
    _charged(world, *(task_number(n, i) for n in (100, 200, 400, 500) for i in range(3)), *(task_number(300, i) for i in (0, 1)), 600)
    logs = {n: {i: (f"p-{n}-{i}", f"{n} task {i}\n".encode()) for i in range(3)} for n in (100, 200, 300, 400, 500)}
    gateway = Deleting(logs | {600: {None: ("p-600", b"not an array\n")}})

    assert _finished_jobs_delete(gateway, queue, cluster=K8S, older_than=CUT) == (3, [])
    assert gateway.deleted == [("ns", 100), ("ns", 500), ("ns", 600)]
    assert {(c.job.slurm_job_id, c.task): bytes(c.data) for c in JobLogCopy.objects.select_related("job")} == {
        **{(100, i): f"100 task {i}\n".encode() for i in range(3)},
        **{(500, i): f"500 task {i}\n".encode() for i in range(3)},  # KeptLogs serves what it holds; the reader asks by task
        (600, None): b"not an array\n",
    }  # fmt: skip
    assert not JobLogCopy.objects.filter(job=unended).exists()


def test_an_array_whose_task_log_cannot_be_read_keeps_its_jobs(world, settings):
    settings.GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = 100
    _job(world, 100, array="0-2", array_tasks=3)
    _charged(world, *(task_number(100, i) for i in range(3)))
    gateway = Deleting({})  # its log left out: not readable now
    gateway.deleted = []
    assert _finished_jobs_delete(gateway, _array(100), cluster=K8S, older_than=CUT) == (0, [])
    assert gateway.asked == [([("ns", 100)], 101)] and not JobLogCopy.objects.exists()
