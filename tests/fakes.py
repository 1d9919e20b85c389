"""A small in-memory stand-in for the Slurm gateway, for unit tests of the relay, cancel and sync
logic (integration tests use the real cluster)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from portal.slurm import AccountingRecord, QueueEntry, SlurmUnavailable


def queue_entry(job_id: int, state: str, comment: str, *, reason: str = "None", start=None, end=None) -> QueueEntry:
    return QueueEntry(
        job_id=job_id, name="j", user="alice", account="vision", partition="gpu", state=state, reason=reason,
        comment=comment, nodes="", num_nodes=1, submit_time=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        start_time=start, end_time=end, time_limit_minutes=30, tres_per_node="gres:gpu:a100:1",
    )  # fmt: skip


def accounting_record(job_id: int, state: str, comment: str, *, exit_code: int | None = 0, end=None) -> AccountingRecord:
    t = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return AccountingRecord(
        job_id=job_id, name="j", user="alice", account="vision", partition="gpu", state=state, exit_code=exit_code,
        submit_time=t, start_time=t, end_time=end or t + dt.timedelta(minutes=1), elapsed_seconds=60,
        time_limit_minutes=30, num_nodes=1, nodes="a100-01", alloc_tres={"gres/gpu": 1}, req_tres={"gres/gpu": 1},
        comment=comment,
    )  # fmt: skip


class FakeGateway:
    """Holds a queue and accounting records; counts calls; can be made unavailable."""

    def __init__(self):
        self.queue_entries: list[QueueEntry] = []
        self.records: list[AccountingRecord] = []
        self.submitted = []
        self.cancelled: list[int] = []
        self.calls: Counter[str] = Counter()
        self.unavailable = False
        self.next_id = 1000

    def _call(self, name):
        self.calls[name] += 1
        if self.unavailable:
            raise SlurmUnavailable("controller down (fake)")

    def submit(self, spec):
        self._call("submit")
        self.next_id += 1
        self.submitted.append(spec)
        self.queue_entries.append(queue_entry(self.next_id, "PENDING", spec.comment))
        return self.next_id

    def cancel(self, job_id):
        self._call("cancel")
        self.cancelled.append(job_id)

    def queue(self):
        self._call("queue")
        return list(self.queue_entries)

    def accounting(self, start, end, *, job_ids=None):
        self._call("accounting")
        self.accounting_job_ids = job_ids
        return [r for r in self.records if job_ids is None or r.job_id in job_ids]

    def find_by_comment(self, comment):
        self._call("find_by_comment")
        for item in [*self.queue_entries, *self.records]:
            if item.comment == comment:
                return item.job_id
        return None
