"""The gateway interface every backend implements. Nothing outside ``portal.slurm`` runs a Slurm
command or imports pyslurm: callers use ``portal.slurm.get_gateway()``."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Collection

from . import types as t

# How far back a retried relay looks for a job that already carries its tag.
FIND_BY_COMMENT_DAYS = 7


class SlurmGateway(abc.ABC):
    """One cluster. Every method either returns typed values or raises ``SlurmUnavailable`` /
    ``SlurmRejected``; each method is one round trip to Slurm (never one per job)."""

    name: str = "abstract"

    @abc.abstractmethod
    def version(self) -> str:
        """Slurm's version string, e.g. "22.05.8"."""

    @abc.abstractmethod
    def ping(self) -> bool:
        """True when the controller answers. Raises SlurmUnavailable otherwise."""

    # Jobs
    @abc.abstractmethod
    def submit(self, submission: t.JobSubmission) -> int:
        """Submit a batch job; returns Slurm's job id."""

    @abc.abstractmethod
    def cancel(self, job_id: int) -> t.AccountingRecord | None:
        """Cancel a job. Cancelling a job that already ended is not an error. Returns None, or —
        from a scheduler that keeps no accounting of it (Kubernetes) — what the job ran up to the
        cancel, for the portal to record."""

    def admin_comment_set(self, job_id: int, text: str) -> None:
        """Set the job's AdminComment (what ``scontrol show job`` shows; the portal's reason for a cancel
        of its own, set before the cancel). A job already gone is not an error. Backends that cannot
        say so."""
        raise t.SlurmRejected("This Slurm backend cannot set a job's AdminComment.")

    def cancel_array_task(self, array_job_id: int, index: int) -> None:
        """Cancel one task of an array job (``scancel 123_4``). Backends that cannot say so."""
        raise t.SlurmRejected("This Slurm backend cannot cancel one task of an array job.")

    def array_tasks_start(self, submission: t.JobSubmission, indexes: Collection[int]) -> None:
        """Start these tasks of an array submitted earlier, which the scheduler does not hold back
        itself under the array's ``%N`` limit (Kubernetes: the portal creates each task's Job as
        earlier ones end). Slurm holds them back itself: backends that cannot say so."""
        raise t.SlurmRejected("This scheduler starts an array's tasks itself.")

    @abc.abstractmethod
    def queue(self) -> list[t.QueueEntry]:
        """Every job the controller holds, in one call."""

    @abc.abstractmethod
    def accounting(
        self, start: dt.datetime, end: dt.datetime, *, job_ids: Collection[int] | None = None
    ) -> list[t.AccountingRecord]:
        """Every job allocation (all users) that was eligible/running/ended in [start, end]; one call.
        ``job_ids``: only these jobs (``sacct -j``: the sync asking for the jobs that just ended reads
        them, not every job of the window — 97 ms instead of 670 ms for 1 000 jobs), every record of
        each id (``-D``: an id Slurm gave twice after losing its state has two)."""

    def job_log(self, job_id: int, *, account: str, limit_bytes: int) -> bytes | None:
        """The job's output as its scheduler serves it (Kubernetes: the pod's log through
        ``pods/log``), its first ``limit_bytes``; ``account``: the job's account on the cluster (a
        Kubernetes namespace). None: this scheduler writes output files, read where the job's
        --output names them (Slurm)."""
        return None

    def find_by_comment(self, comment: str) -> int | None:
        """Job id of a job carrying this comment, or None (see find_by_comments)."""
        return self.find_by_comments([comment]).get(comment)

    def find_by_comments(self, comments) -> dict[str, int]:
        """The job id of a job carrying each of these comments, for those Slurm holds: the queue
        first (one call), and only for the comments it misses the accounting of the last
        FIND_BY_COMMENT_DAYS days (one more call) — two calls at most, however many comments. A
        record that never started nor ended is not a job Slurm holds: a pending job is in the queue,
        and one that is not was lost by its controller (a takeover before its state was saved)."""
        wanted = {comment for comment in comments if comment}
        found: dict[str, int] = {}
        if not wanted:
            return found
        for entry in self.queue():
            if entry.comment in wanted and entry.comment not in found:
                found[entry.comment] = entry.array_job_id or entry.job_id  # an array: its id, not one task's
        if wanted - found.keys():
            now = dt.datetime.now(dt.UTC)
            for record in self.accounting(now - dt.timedelta(days=FIND_BY_COMMENT_DAYS), now):
                if record.end_time is None and (record.start_time is None or record.state.split()[0] == "PENDING"):
                    continue  # pending in accounting yet not in the queue: lost by its controller, not ours to adopt
                if record.comment in wanted and record.comment not in found:
                    found[record.comment] = record.array_job_id or record.job_id
        return found

    def runaway_jobs_fix(self) -> list[int]:
        """Slurm's own repair of runaway jobs — records slurmdbd holds as started and not ended whose
        controller does not know the job (one it forgot in a takeover, before its state save): ``sacctmgr -i
        show runawayjobs`` ends each at its start (the latest of start, eligible and submit) as COMPLETED
        and has slurmdbd roll the usage up again, so sacct and sreport stop counting them as running.
        Every runaway of the cluster, whoever's (Slurm's tool has no per-job form). Needs AdminLevel
        Operator (or root / SlurmUser): SlurmRejected without it. Returns the ids it fixed. Backends
        without Slurm accounting cannot say so."""
        raise t.SlurmRejected("This scheduler keeps no Slurm accounting to repair.")

    # Inventory
    @abc.abstractmethod
    def partitions(self) -> list[t.Partition]:
        """Every partition with its limits (``Partition.limits``), in one call."""

    @abc.abstractmethod
    def nodes(self) -> list[t.Node]:
        """Every node with its features (``Node.features``), in one call."""

    @abc.abstractmethod
    def policy(self) -> t.ClusterPolicy:
        """QOS names and the QOS each account may use, MaxArraySize, OverTimeLimit and KillWait: a
        fixed number of calls (not one per node, QOS or account), none of them a second read of
        the nodes or partitions (an inventory sync reads each once)."""

    # Reservations
    @property
    def reservations_support_gpu_counts(self) -> bool:
        """True when reservation_create accepts ``tres={"gres/gpu:TYPE": N}``; False when only whole
        nodes can be reserved (Slurm 22.05). Backends answer from their version quirks."""
        return False

    @abc.abstractmethod
    def reservation_create(self, spec: t.ReservationSpec) -> str:
        """Create a reservation; returns its name."""

    @abc.abstractmethod
    def reservation_delete(self, name: str) -> None:
        """Delete a reservation; deleting one that does not exist is not an error."""

    @abc.abstractmethod
    def reservation_list(self) -> list[t.Reservation]:
        ...

    # Associations
    @abc.abstractmethod
    def associations(self) -> list[t.Association]:
        """Every association of this cluster, in one call."""

    @abc.abstractmethod
    def account_add(self, account: str, *, description: str = "", parent: str = "") -> None:
        """Add an account; an account that already exists counts as success."""

    @abc.abstractmethod
    def account_remove(self, account: str) -> None:
        ...

    @abc.abstractmethod
    def user_add(self, user: str, account: str, *, default: bool = False) -> None:
        """Add a user to an account (with it as default account when asked); existing = success."""

    @abc.abstractmethod
    def user_remove(self, user: str, account: str) -> None:
        """Remove the user's association with the account; a missing one counts as success."""

    @abc.abstractmethod
    def association_limits_set(self, limits: t.AssociationLimits) -> None:
        """Set GrpTRESMins/GrpTRES on the account; keys absent from the dicts are cleared (-1)."""

    @abc.abstractmethod
    def association_limits_get(self, account: str) -> t.AssociationLimits:
        ...

    def association_limits_held(self, limits: t.AssociationLimits) -> t.AssociationLimits:
        """The part of these limits this scheduler can hold (Slurm: all of them; Kubernetes: the GPU
        cap, as the namespace's ResourceQuota): what association_limits_get is compared with."""
        return limits

    @abc.abstractmethod
    def account_usage_reset(self, account: str) -> None:
        """Reset the account's raw usage (period roll-over)."""

    @abc.abstractmethod
    def account_gpu_minutes(self, start: dt.datetime, end: dt.datetime) -> dict[str, int]:
        """GPU-minutes per account that slurmdbd has rolled up in [start, end) (aware datetimes;
        slurmdbd rolls up whole hours, so only finished hours count): what ``sreport cluster
        AccountUtilizationByUser -T gres/gpu`` answers. The reconciliation compares it with the
        portal's usage."""

    @abc.abstractmethod
    def usage_rolled_up(self, start: dt.datetime, end: dt.datetime) -> bool:
        """Whether slurmdbd has rolled up any hour in [start, end) (aware datetimes): ``sreport
        cluster Utilization`` has a row for it. A rolled-up hour has a row even when nothing ran (the
        cluster's capacity is reported); an hour slurmdbd has not rolled up has none. How far
        sreport's figures go (accounting.services.rollup) is read from the cluster this way."""
