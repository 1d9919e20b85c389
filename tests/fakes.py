"""The fake Slurm gateway: one in-memory SlurmGateway for the unit tests of the relay, cancel, sync,
ingestion, limits and association logic (integration tests use the real cluster). It runs the gateway
contract tests that need no controller (tests/slurm/test_gateway_contract.py, marked ``fake``):
nothing about Slurm is proven on it. Install it with the ``use_gateway`` fixture."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from portal.slurm import (
    AccountingRecord,
    Association,
    AssociationLimits,
    Node,
    Partition,
    QueueEntry,
    Reservation,
    SlurmGateway,
    SlurmRejected,
    SlurmUnavailable,
)
from portal.slurm.types import ClusterPolicy

CLUSTER = "fake"


def queue_entry(job_id: int, state: str, comment: str, *, reason: str = "None", start=None, end=None, priority=None,
                partition: str = "gpu", tres_per_node: str = "gres:gpu:a100:1", submitted=None) -> QueueEntry:  # fmt: skip
    """A queue entry; ``submitted``: Slurm's submit time (default now: the job was just sent)."""
    return QueueEntry(
        job_id=job_id, name="j", user="alice", account="vision", partition=partition, state=state, reason=reason,
        comment=comment, nodes="", num_nodes=1, submit_time=submitted or dt.datetime.now(dt.UTC),
        start_time=start, end_time=end, time_limit_minutes=30, tres_per_node=tres_per_node, priority=priority,
    )  # fmt: skip


def accounting_record(job_id: int, state: str, comment: str, *, exit_code: int | None = 0, end=None,
                      submitted=None) -> AccountingRecord:  # fmt: skip
    """An accounting record; ``submitted``: Slurm's submit time (default now: the job was just sent)."""
    t = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return AccountingRecord(
        job_id=job_id, name="j", user="alice", account="vision", partition="gpu", state=state, exit_code=exit_code,
        submit_time=submitted or dt.datetime.now(dt.UTC), start_time=t, end_time=end or t + dt.timedelta(minutes=1), elapsed_seconds=60,
        time_limit_minutes=30, num_nodes=1, nodes="a100-01", alloc_tres={"gres/gpu": 1}, req_tres={"gres/gpu": 1},
        comment=comment,
    )  # fmt: skip


class FakeGateway(SlurmGateway):
    """Holds a queue, accounting records, reservations, associations and limits in memory; counts
    calls (``calls``) and records accounting windows (``accounting_windows``); ``unavailable = True``
    makes every call raise SlurmUnavailable."""

    name = "fake"

    def __init__(self, records: list[AccountingRecord] | None = None):
        self.queue_entries: list[QueueEntry] = []
        self.records: list[AccountingRecord] = list(records or [])
        self.submitted = []
        self.cancelled: list[int] = []
        self.admin_comments: dict[int, str] = {}
        self.calls: Counter[str] = Counter()
        self.accounting_windows: list[tuple[dt.datetime, dt.datetime]] = []
        self.accounting_job_ids = None
        self.unavailable = False
        self.next_id = 1000
        self.partition_list: list[Partition] = []
        self.node_list: list[Node] = []
        self.reservations: dict[str, Reservation] = {}
        self.association_rows: list[Association] = []
        self.limits: dict[str, AssociationLimits] = {}
        self.resets: list[str] = []
        self.gpu_minutes: dict[str, int] = {}
        self.rolled_up_to: dt.datetime | None = None  # slurmdbd's hourly roll-up: hours before it are rolled up

    @classmethod
    def like_local_cluster(cls) -> FakeGateway:
        """Shaped like the local emulated clusters: partitions gpu (default, 60 min / 72 h) and debug
        (10 min / 1 h) on a100-01, a100-02 (4 x a100) and h100-01 (4 x h100)."""
        gateway = cls()
        names = ("a100-01", "a100-02", "h100-01")
        gateway.partition_list = [
            Partition(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320, nodes=names),
            Partition(name="debug", is_default=False, state="UP", default_time_minutes=10, max_time_minutes=60, nodes=names),
        ]
        gateway.node_list = [
            Node(name=name, state="IDLE", partitions=("gpu", "debug"), gpu_type=name.split("-")[0], gpus_total=4,
                 gpus_allocated=0, cpus_total=32, cpus_allocated=0, memory_mb=256000)  # fmt: skip
            for name in names
        ]
        return gateway

    def _known_account(self, account: str) -> None:
        if not any(a.account == account for a in self.association_rows):
            raise SlurmRejected(f"sacctmgr: no association for account {account} (fake)")

    def _call(self, name):
        self.calls[name] += 1
        if self.unavailable:
            raise SlurmUnavailable("controller down (fake)")

    def version(self):
        self._call("version")
        return "22.05.8"

    def ping(self):
        self._call("ping")
        return True

    def submit(self, submission):
        self._call("submit")
        self.next_id += 1
        self.submitted.append(submission)
        self.queue_entries.append(queue_entry(self.next_id, "PENDING", dict(submission.command_line).get("comment", "")))
        return self.next_id

    def cancel(self, job_id):
        self._call("cancel")
        self.cancelled.append(job_id)

    def admin_comment_set(self, job_id, text):
        self._call("admin_comment_set")
        self.admin_comments[job_id] = text

    def queue(self):
        self._call("queue")
        return list(self.queue_entries)

    def accounting(self, start, end, *, job_ids=None):
        self._call("accounting")
        self.accounting_windows.append((start, end))
        self.accounting_job_ids = job_ids
        return [r for r in self.records if job_ids is None or r.job_id in job_ids or r.array_job_id in job_ids]  # sacct -j ARRAY: its tasks

    def find_by_comment(self, comment):
        self._call("find_by_comment")
        return self._find(comment)

    def find_by_comments(self, comments):
        self._call("find_by_comments")
        return {comment: job_id for comment in set(comments) if (job_id := self._find(comment)) is not None}

    def _find(self, comment):
        for item in [*self.queue_entries, *self.records]:
            if item.comment == comment:
                return item.job_id
        return None

    def runaway_jobs_fix(self):
        """As sacctmgr: every record started, not ended and not in the queue ends at its start, COMPLETED."""
        import dataclasses

        self._call("runaway_jobs_fix")
        queued = {e.job_id for e in self.queue_entries}
        fixed = []
        for i, r in enumerate(self.records):
            if r.start_time is not None and r.end_time is None and r.job_id not in queued:
                self.records[i] = dataclasses.replace(r, state="COMPLETED", end_time=max(r.start_time, r.submit_time), elapsed_seconds=0)
                fixed.append(r.job_id)
        return fixed

    def partitions(self):
        self._call("partitions")
        return list(self.partition_list)

    def nodes(self):
        self._call("nodes")
        return list(self.node_list)

    def policy(self):
        self._call("policy")
        return ClusterPolicy(qos=("normal",), account_qos={}, max_array_size=1001)

    def reservation_create(self, spec):
        self._call("reservation_create")
        if spec.name in self.reservations:
            raise SlurmRejected(f"reservation {spec.name} exists (fake)")
        self.reservations[spec.name] = Reservation(
            name=spec.name, start=spec.start, end=spec.end, accounts=tuple(spec.accounts), nodes=",".join(spec.nodes),
            tres=",".join(f"{k}={v}" for k, v in spec.tres.items()), state="INACTIVE",
        )  # fmt: skip
        return spec.name

    def reservation_delete(self, name):
        self._call("reservation_delete")
        self.reservations.pop(name, None)

    def reservation_list(self):
        self._call("reservation_list")
        return list(self.reservations.values())

    def associations(self):
        self._call("associations")
        return list(self.association_rows)

    def account_add(self, account, *, description="", parent=""):
        self._call("account_add")
        if not any(a.account == account and not a.user for a in self.association_rows):
            self.association_rows.append(Association(cluster=CLUSTER, account=account, user="", parent=parent or "root"))

    def account_remove(self, account):
        self._call("account_remove")
        self.association_rows = [a for a in self.association_rows if a.account != account]

    def user_add(self, user, account, *, default=False):
        self._call("user_add")
        if not any(a.account == account and a.user == user for a in self.association_rows):
            self.association_rows.append(Association(cluster=CLUSTER, account=account, user=user, is_default=default))

    def user_remove(self, user, account):
        self._call("user_remove")
        self.association_rows = [a for a in self.association_rows if not (a.account == account and a.user == user)]

    def association_limits_set(self, limits):
        self._call("association_limits_set")
        self._known_account(limits.account)
        self.limits[limits.account] = limits

    def association_limits_get(self, account):
        self._call("association_limits_get")
        self._known_account(account)
        return self.limits.get(account, AssociationLimits(account=account))

    def account_usage_reset(self, account):
        self._call("account_usage_reset")
        self.resets.append(account)

    def account_gpu_minutes(self, start, end):
        self._call("account_gpu_minutes")
        return dict(self.gpu_minutes)

    def usage_rolled_up(self, start, end):
        self._call("usage_rolled_up")
        return self.rolled_up_to is not None and start < self.rolled_up_to and start < end
