"""Array jobs (sbatch --array): one portal job with N tasks, followed from the one queue snapshot
(and the one accounting read) of each sync cycle.

squeue shows an array as rows ``123_4`` (a started task, its own id in %A) and ``123_[5-9]`` (the
tasks not started yet, on the array's own record); sacct -X as one row per started task (JobID
``123_4``). ``array_view`` folds them into one entry/record for the parent job (the state the job
is in as a whole) and the per-task states, which ``array_tasks_record`` stores."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from gpuportal_sbatch.directives import DirectiveError, parse_array

from jobs.choices import TERMINAL_STATES, JobState, state_from_slurm
from jobs.models import Job, JobArrayTask

# The parent's state while tasks differ: the first of these any task is in.
_LIVE_ORDER = (JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED, JobState.REQUEUED, JobState.PENDING)
# The parent's final state: the first of these any task ended in (all COMPLETED: COMPLETED).
_END_ORDER = (JobState.NODE_FAIL, JobState.BOOT_FAIL, JobState.OUT_OF_MEMORY, JobState.TIMEOUT, JobState.DEADLINE,
              JobState.PREEMPTED, JobState.FAILED, JobState.CANCELLED)


def _indexes(text: str) -> list[int]:
    try:
        return parse_array(text.strip("[]"))[0]
    except DirectiveError:
        return []


def group_by_array(rows) -> dict[int, list]:
    """Queue entries or accounting records of array jobs, by array id."""
    groups: dict[int, list] = {}
    for row in rows:
        if getattr(row, "array_job_id", None) is not None:
            groups.setdefault(row.array_job_id, []).append(row)
    return groups


def _fold_state(states: list[str], total: int, seen: int) -> str:
    live = [s for s in states if s not in TERMINAL_STATES]
    if live or seen < total:
        for state in _LIVE_ORDER:
            if state in live:
                return state
        return JobState.PENDING
    for state in _END_ORDER:
        if state in states:
            return state
    return JobState.COMPLETED


def array_view(job: Job, rows: list, *, kind: str, known: dict[int, dict] | None = None) -> tuple[Any, dict[int, dict]]:
    """(one entry/record standing for the whole array, {index: task values}) from the array's
    queue rows (``kind="queue"``) or accounting records (``kind="accounting"``). The folded row is
    the first row with state, start, end and exit code of the whole array; None without rows.
    ``known``: tasks already ended as the portal recorded them (a task cancelled before Slurm split
    it off the array shows in neither the queue nor accounting); rows win over them."""
    if not rows:
        return None, {}
    tasks: dict[int, dict] = dict(known or {})
    for row in rows:
        state = state_from_slurm(row.state) or JobState.PENDING
        for index in _indexes(row.array_tasks):
            values = {"state": state}
            if "-" not in row.array_tasks and "," not in row.array_tasks:  # a started task: its own id and times
                values.update(slurm_job_id=row.job_id, started_at=row.start_time,
                              ended_at=row.end_time if state in TERMINAL_STATES else None)  # fmt: skip
                if kind == "accounting":
                    values.update(exit_code=row.exit_code, exit_signal=row.exit_signal)
            prior = (known or {}).get(index)
            if "exit_code" not in values and prior is not None and prior.get("exit_code") is not None:
                # the queue has none: keep the ones accounting gave
                values.update(exit_code=prior["exit_code"], exit_signal=prior.get("exit_signal"))
            tasks[index] = values
    total = job.array_tasks
    if known:  # ended tasks stay ended; their values are not rewritten by this view
        tasks_out = {i: v for i, v in tasks.items() if i not in known or v is not known[i]}
    states = [t["state"] for t in tasks.values()]
    folded = _fold_state(states, total, len(tasks))
    starts = [r.start_time for r in rows if r.start_time and state_from_slurm(r.state) not in (JobState.PENDING,)]
    ended = folded in TERMINAL_STATES
    ends = [r.end_time for r in rows if r.end_time]
    exit_codes = [t.get("exit_code") for t in tasks.values() if t.get("exit_code") is not None]
    signals = [t.get("exit_signal") for t in tasks.values() if t.get("exit_signal") is not None]
    first = rows[0]
    changes = {"state": str(folded), "job_id": job.slurm_job_id or rows[0].array_job_id,
               "start_time": min(starts) if starts else None, "end_time": max(ends) if ended and ends else None}  # fmt: skip
    if kind == "accounting":  # the highest of the tasks' (a task killed by a signal shows on the whole array)
        changes.update(exit_code=max(exit_codes) if exit_codes else None, exit_signal=max(signals) if signals else None)
    if kind == "queue":
        pending = next((r for r in rows if state_from_slurm(r.state) == JobState.PENDING), None)
        changes["reason"] = pending.reason if pending is not None and folded == JobState.PENDING else "None"
    return dataclasses.replace(first, **changes), (tasks_out if known else tasks)


def forgotten_tasks(job: Job, record, known: dict[int, dict]) -> list:
    """Rows for the tasks of an array the scheduler has forgotten but for one record of the whole job
    (Kubernetes: a cancel deleted its tasks' Jobs, and no accounting keeps them): each task not
    already ended ends in that record's state and at its end, keeping the id and start the portal
    recorded for it. One query."""
    seen = {index: (own, started) for index, own, started in
            JobArrayTask.objects.filter(job=job).values_list("index", "slurm_job_id", "started_at")}  # fmt: skip
    return [
        dataclasses.replace(record, job_id=seen.get(index, (None, None))[0] or record.job_id, array_job_id=job.slurm_job_id,
                            array_tasks=str(index), start_time=seen.get(index, (None, None))[1], exit_code=None,
                            exit_signal=None)  # fmt: skip
        for index in _indexes(job.array) if index not in known
    ]


def ended_array_record(job: Job, whole, known: dict[int, dict]):
    """The record of an array the scheduler no longer holds but for one record of the whole job,
    every task of which the portal has recorded as ended already (Kubernetes: the cancel deleted the
    Jobs after the sync had seen each task end, so forgotten_tasks has none left to end): that record,
    in the state folded from the tasks' and with their highest exit code. None while a task is not
    recorded as ended."""
    if len(known) < (job.array_tasks or 0):
        return None
    states = [values["state"] for values in known.values()]
    codes = [values["exit_code"] for values in known.values() if values.get("exit_code") is not None]
    signals = [values["exit_signal"] for values in known.values() if values.get("exit_signal") is not None]
    return dataclasses.replace(whole, job_id=job.slurm_job_id, state=str(_fold_state(states, job.array_tasks, len(known))),
                               exit_code=max(codes) if codes else None, exit_signal=max(signals) if signals else None)  # fmt: skip


def array_task_indexes(job: Job) -> list[int]:
    """The indexes of the array's tasks (its --array value; no query)."""
    return _indexes(job.array)


def array_index_ranges(indexes: list[int]) -> str:
    """Sorted indexes as squeue writes a record of tasks not started ("0-3,5-5,7-9"): every part a range,
    so array_view reads them as such, never as one started task's row."""
    parts: list[str] = []
    for index in sorted(indexes):
        if parts and int(parts[-1].split("-")[1]) == index - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{index}"
        else:
            parts.append(f"{index}-{index}")
    return ",".join(parts)


def array_tasks_to_start(indexes: list[int], limit: int, listed: dict[int, str], done: Collection[int]) -> tuple[list[int], list[int]]:
    """An array under a ``%N`` limit whose scheduler does not hold its tasks back (Kubernetes: each task
    is a Job the portal creates): (the tasks to start now, the tasks still waiting), lowest index
    first as Slurm starts them. ``listed``: the tasks the scheduler holds, by index, in the portal's
    state (an ended one no longer counts against the limit); ``done``: the tasks never to start (again):
    recorded as ended, cancelled alone (no Job any more), or held by the scheduler once (a Job deleted
    by hand is not run twice). At most ``limit`` tasks are unfinished at once."""
    unfinished = sum(1 for state in listed.values() if state not in TERMINAL_STATES)
    waiting = [index for index in indexes if index not in listed and index not in done]
    room = max(0, limit - unfinished)
    return waiting[:room], waiting[room:]


def tasks_without_exit_code(tasks: dict[int, dict]) -> list[int]:
    """Tasks that ended (not cancelled before they ran) and whose exit code accounting has not
    given yet: slurmdbd lags the controller, so the array is not final until they have one."""
    return sorted(
        index for index, values in tasks.items()
        if values["state"] in TERMINAL_STATES and values["state"] != JobState.CANCELLED and values.get("exit_code") is None
    )  # fmt: skip


def ended_tasks(job_ids: list) -> dict:
    """{job id: {index: values}} of the tasks recorded as ended, for the live array jobs of a sync
    cycle (one query)."""
    out: dict = {}
    rows = JobArrayTask.objects.filter(job_id__in=job_ids, state__in=TERMINAL_STATES).values_list(
        "job_id", "index", "state", "exit_code", "exit_signal"
    )
    for job_id, index, state, exit_code, exit_signal in rows:
        out.setdefault(job_id, {})[index] = {"state": state, "exit_code": exit_code, "exit_signal": exit_signal}
    return out


def array_tasks_record(tasks_by_job: dict) -> int:
    """Store the tasks' states: one bulk upsert for every array job of the cycle. Returns rows written."""
    rows = [
        JobArrayTask(job_id=job_id, index=index, **values)
        for job_id, tasks in tasks_by_job.items()
        for index, values in tasks.items()
    ]
    if not rows:
        return 0
    JobArrayTask.objects.bulk_create(
        rows, batch_size=1000, update_conflicts=True, unique_fields=["job", "index"],
        update_fields=["state", "slurm_job_id", "started_at", "ended_at", "exit_code", "exit_signal"],
    )  # fmt: skip
    return len(rows)


def array_task_counts(job: Job) -> dict[str, int]:
    """Tasks per state (tasks not seen by a sync yet count as PENDING)."""
    counts: dict[str, int] = {}
    seen = 0
    for state in job.array_task_rows.values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
        seen += 1
    if job.array_tasks > seen:
        counts[JobState.PENDING] = counts.get(JobState.PENDING, 0) + job.array_tasks - seen
    return counts


ARRAY_TABLE_MAX_TASKS = 1000  # the job page lists at most this many tasks (the API has them all)


@dataclasses.dataclass(frozen=True)
class ArrayTaskRow:
    """One task of an array job as the job's page shows it (a task no sync has seen yet: PENDING)."""

    index: int
    state: str
    slurm_id: str  # Slurm's own name for it: "<array id>_<index>" ("" before the array has an id)
    exit_code: int | None  # None while it runs, and for a cancelled task (Slurm's 0 there means nothing)
    exit_signal: int | None  # the same for the signal that ended it (0: none)
    started_at: Any
    ended_at: Any
    usage: Any = None  # accounting.selectors.TaskUsage by the task's own Slurm id (None: none recorded)

    @property
    def elapsed_seconds(self) -> int | None:
        from django.utils import timezone

        if self.started_at is None:
            return None
        return max(int(((self.ended_at or timezone.now()) - self.started_at).total_seconds()), 0)

    @property
    def has_output(self) -> bool:
        return self.started_at is not None or self.state not in (JobState.PENDING, JobState.CANCELLED)


def array_has_task(job: Job, index: int) -> bool:
    """``index`` is one of the array's tasks (no query)."""
    return index in _indexes(job.array)


def array_task_table(
    job: Job, *, limit: int = ARRAY_TABLE_MAX_TASKS, usage=None
) -> tuple[list[ArrayTaskRow], dict[str, int]]:
    """(every task of the array in index order, at most ``limit``; tasks per state) from one query:
    the job page's task table and its counts, from the same rows so they never disagree. ``usage``:
    the job's accounting.selectors.JobUsage (jobs.selectors.jobs_with_usage), each task's own share."""
    per_task = usage.tasks if usage is not None else {}
    indexes = _indexes(job.array) if job.array else []
    seen = {t.index: t for t in job.array_task_rows.all()}
    counts: dict[str, int] = {}
    rows = []
    for index in indexes or sorted(seen):
        task = seen.get(index)
        state = task.state if task is not None else JobState.PENDING
        counts[state] = counts.get(state, 0) + 1
        if len(rows) < limit:
            ended = task is not None and state != JobState.CANCELLED
            rows.append(ArrayTaskRow(
                index=index, state=state, slurm_id=f"{job.slurm_job_id}_{index}" if job.slurm_job_id else "",
                exit_code=task.exit_code if ended else None, exit_signal=task.exit_signal if ended else None,
                started_at=task.started_at if task else None, ended_at=task.ended_at if task else None,
                usage=per_task.get(task.slurm_job_id) if task is not None and task.slurm_job_id else None,
            ))  # fmt: skip
    return rows, counts
