"""Array jobs folded from squeue/sacct rows (jobs.arrays), without Slurm."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from jobs.arrays import (
    array_index_ranges,
    array_task_counts,
    array_tasks_record,
    array_tasks_to_start,
    array_view,
)
from jobs.choices import JobState
from jobs.models import JobArrayTask
from jobs.services import job_submit
from portal.slurm.types import AccountingRecord, QueueEntry

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def entry(job_id, tasks, state, **kw):
    return QueueEntry(job_id=job_id, name="a", user="alice", account="vision", partition="gpu", state=state, reason=kw.get("reason", "None"),
                      comment="", nodes="", num_nodes=1, submit_time=timezone.now(), start_time=kw.get("start"), end_time=kw.get("end"),
                      time_limit_minutes=5, tres_per_node="", array_job_id=100, array_tasks=tasks)  # fmt: skip


def record(job_id, index, state, exit_code, signal=0):
    return AccountingRecord(job_id=job_id, name="a", user="alice", account="vision", partition="gpu", state=state, exit_code=exit_code,
                            exit_signal=signal,
                            submit_time=timezone.now(), start_time=NOW, end_time=NOW, elapsed_seconds=1, time_limit_minutes=5, num_nodes=1,
                            nodes="a100-01", alloc_tres={"gres/gpu": 1}, req_tres={}, comment="", array_job_id=100,
                            array_tasks=str(index))  # fmt: skip


@pytest.fixture
def array_job(world, inventory, relays):
    job, _ = job_submit(user=world.alice, team=world.vision, script="#!/bin/bash\n#SBATCH -a 0-9%2 --gres=gpu:1\ntrue\n")
    job.slurm_job_id = 100
    return job


def test_queue_rows_fold_into_the_arrays_state_and_each_tasks(array_job):
    rows = [entry(100, "2-9", "PENDING", reason="JobArrayTaskLimit"), entry(101, "0", "RUNNING", start=NOW),
            entry(102, "1", "COMPLETED", start=NOW, end=NOW)]  # fmt: skip
    folded, tasks = array_view(array_job, rows, kind="queue")
    assert (folded.job_id, folded.state, folded.start_time) == (100, "RUNNING", NOW)
    assert tasks[0] == {"state": "RUNNING", "slurm_job_id": 101, "started_at": NOW, "ended_at": None}
    assert tasks[1]["state"] == "COMPLETED" and {tasks[i]["state"] for i in range(2, 10)} == {"PENDING"}
    assert array_tasks_record({array_job.pk: tasks}) == 10
    assert array_task_counts(array_job) == {"RUNNING": 1, "COMPLETED": 1, "PENDING": 8}
    only_pending, _ = array_view(array_job, rows[:1], kind="queue")
    assert (only_pending.state, only_pending.reason) == ("PENDING", "JobArrayTaskLimit")


def test_accounting_gives_the_final_state_and_exit_codes(array_job):
    rows = [record(101 + i, i, "COMPLETED", 0) for i in range(8)] + [record(109, 8, "FAILED", 0, signal=9), record(100, 9, "FAILED", 2)]
    folded, tasks = array_view(array_job, rows, kind="accounting")
    # the whole array: the highest exit code and the highest signal of its tasks (sacct's "0:9" of task 8)
    assert (folded.state, folded.exit_code, folded.exit_signal, folded.job_id) == ("FAILED", 2, 9, 100)
    array_tasks_record({array_job.pk: tasks})
    stored = {t.index: (t.state, t.exit_code, t.exit_signal, t.slurm_job_id) for t in JobArrayTask.objects.filter(job=array_job)}
    assert stored[9] == ("FAILED", 2, 0, 100) and stored[0] == ("COMPLETED", 0, 0, 101) and stored[8] == ("FAILED", 0, 9, 109)
    partial, _ = array_view(array_job, rows[:3], kind="accounting")
    assert partial.state == JobState.PENDING  # tasks still to come: not ended
    completed = [record(101 + i, i, "COMPLETED", 0) for i in range(9)]
    cancelled, _ = array_view(array_job, completed + [record(100, 9, "CANCELLED", 0)], kind="accounting")
    assert cancelled.state == "CANCELLED"
    assert (NOW - dt.timedelta(seconds=1)) < folded.end_time


def test_tasks_the_portal_recorded_as_ended_count_when_slurm_no_longer_shows_them(array_job):
    known = {9: {"state": "CANCELLED", "exit_code": None}}
    rows = [record(101 + i, i, "COMPLETED", 0) for i in range(9)]
    folded, tasks = array_view(array_job, rows, kind="accounting", known=known)
    assert folded.state == "CANCELLED" and 9 not in tasks  # ended: not rewritten
    folded, _ = array_view(array_job, rows, kind="accounting")
    assert folded.state == JobState.PENDING  # without it, task 9 would still be to come


@pytest.fixture
def live_array(array_job, use_gateway):
    from tests.fakes import FakeGateway

    JobArrayTask.objects.all().delete()
    array_job.state = JobState.RUNNING
    array_job.save(update_fields=["state", "slurm_job_id"])
    job = type(array_job).objects.get(pk=array_job.pk)
    return job, use_gateway(FakeGateway())


def ended_now(row, end):
    import dataclasses

    return dataclasses.replace(row, end_time=end)


def ended_queue(end):
    return [entry(101 + i, str(i), "COMPLETED", start=end, end=end) for i in range(9)] + [entry(100, "9", "FAILED", start=end, end=end)]


def test_an_exit_code_accounting_gave_survives_a_queue_row_without_one(live_array):
    from jobs.services import jobs_sync

    job, fake = live_array
    array_tasks_record({job.pk: {0: {"state": "FAILED", "exit_code": 0, "exit_signal": 9, "slurm_job_id": 101}}})
    fake.queue_entries = [entry(101, "0", "FAILED", start=NOW, end=NOW), entry(102, "1", "RUNNING", start=NOW),
                          entry(100, "2-9", "PENDING")]  # fmt: skip
    jobs_sync()
    task = JobArrayTask.objects.get(job=job, index=0)
    assert (task.exit_code, task.exit_signal) == (0, 9)  # squeue -t all shows no exit codes nor signals


def test_an_array_is_not_final_until_accounting_has_every_tasks_exit_code(live_array):
    from jobs.services import jobs_sync

    job, fake = live_array
    end = timezone.now()
    fake.queue_entries = ended_queue(end)
    # slurmdbd lags: no task 0 (the records end now: NOW is when the module was imported)
    fake.records = [ended_now(record(101 + i, i, "COMPLETED", 0), end) for i in range(1, 9)] + [ended_now(record(100, 9, "FAILED", 3), end)]
    jobs_sync()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and JobArrayTask.objects.get(job=job, index=0).exit_code is None
    fake.records.append(ended_now(record(101, 0, "COMPLETED", 0), end))
    jobs_sync()
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    assert dict(JobArrayTask.objects.filter(job=job).values_list("index", "exit_code")) == {**{i: 0 for i in range(9)}, 9: 3}


def test_a_slurm_array_whose_task_records_lag_behind_a_record_of_its_id_waits_for_them(live_array):
    """slurmdbd lags (CI saw it): every task ended in the queue, accounting has a record under the array's
    id but none of its tasks' yet. On Slurm those come: the array waits for their exit codes (only a
    Kubernetes array whose Jobs are deleted ends on such a record, tests/jobs/test_sync_array_limit.py)."""
    import dataclasses

    from jobs.services import jobs_sync

    job, fake = live_array
    end = timezone.now()
    fake.queue_entries = ended_queue(end)
    fake.records = [dataclasses.replace(ended_now(record(100, 9, "FAILED", 3), end), array_job_id=None, array_tasks="")]
    jobs_sync()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.exit_code is None
    fake.records = [ended_now(record(101 + i, i, "COMPLETED", 0), end) for i in range(9)] + [ended_now(record(100, 9, "FAILED", 3), end)]
    jobs_sync()
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)


def test_an_array_whose_task_accounting_never_records_ends_after_the_grace(live_array):
    from jobs.services import jobs_sync
    from jobs.services.sync import ACCOUNTING_GRACE_SECONDS

    job, fake = live_array
    end = timezone.now() - dt.timedelta(seconds=ACCOUNTING_GRACE_SECONDS + 10)
    fake.queue_entries = ended_queue(end)
    fake.records = [ended_now(record(101 + i, i, "COMPLETED", 0), end) for i in range(1, 9)]
    fake.records.append(ended_now(record(100, 9, "FAILED", 3), end))
    jobs_sync()
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    assert JobArrayTask.objects.get(job=job, index=0).exit_code is None


@pytest.mark.parametrize(
    ("listed", "done", "start", "waiting"),
    [
        ({}, set(), [0, 1], [2, 3, 4, 5]),  # nothing held yet: the first two
        ({0: "RUNNING", 1: "PENDING"}, set(), [], [2, 3, 4, 5]),  # two unfinished: none more
        ({0: "COMPLETED", 1: "RUNNING"}, set(), [2], [3, 4, 5]),  # one ended: one more, the lowest waiting
        ({0: "FAILED", 1: "CANCELLED", 2: "RUNNING"}, set(), [3], [4, 5]),  # any end frees a slot
        ({0: "COMPLETED", 1: "COMPLETED"}, {0, 1, 2}, [3, 4], [5]),  # 2 cancelled alone: never started again
        ({3: "RUNNING", 4: "RUNNING"}, {0, 1, 2}, [], [5]),  # the Jobs of ended tasks deleted: the records count
        ({i: "COMPLETED" for i in range(5)}, set(), [5], []),
        ({i: "COMPLETED" for i in range(6)}, set(), [], []),  # all held: nothing to start
    ],
)
def test_a_throttled_array_starts_the_lowest_waiting_tasks_while_fewer_than_its_limit_are_unfinished(listed, done, start, waiting):
    assert array_tasks_to_start([0, 1, 2, 3, 4, 5], 2, listed, done) == (start, waiting)


def test_an_arrays_tasks_not_started_are_a_squeue_record_of_ranges_pending_with_the_limits_reason(array_job):
    assert array_index_ranges([7, 2, 3, 4, 9]) == "2-4,7-7,9-9"
    assert array_index_ranges([5]) == "5-5" and array_index_ranges([]) == ""
    rows = [entry(101, "0", "COMPLETED", start=NOW, end=NOW),
            entry(100, array_index_ranges([1, 3, 4, 5, 6, 7, 8, 9]), "PENDING", reason="JobArrayTaskLimit"),
            entry(100, array_index_ranges([2]), "PENDING")]  # fmt: skip
    folded, tasks = array_view(array_job, rows, kind="queue")
    assert sorted(tasks) == list(range(10))  # every task seen: the sync asks accounting for none missing
    assert all(tasks[i] == {"state": "PENDING"} for i in range(1, 10))  # no own id nor start: not started
    assert (folded.state, folded.reason) == ("PENDING", "JobArrayTaskLimit")
