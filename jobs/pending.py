"""Why a pending job waits, and when and in what place it should start (issue 40).

- ``PENDING_REASONS``: the one table from Slurm's pending reason codes (squeue %r, pyslurm's
  ``state_reason``) to a sentence and what the user can change. Pages, API and CLI read it through
  ``reason_explained``; a code missing from it is shown as Slurm gives it.
- ``queue_outlook``: from the one queue read of a sync cycle (jobs.services.sync), each pending
  job's expected start (the backfill scheduler's, what ``squeue --start`` prints; None: no estimate
  yet) and its place among the pending jobs of its partition wanting the same GPU type, in Slurm's
  priority order.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass

from jobs.choices import JobState, state_from_slurm


@dataclass(frozen=True)
class PendingReason:
    code: str  # Slurm's code ("AssocGrpGRES")
    text: str  # what it means, in words
    advice: str  # what the user can change ("" when nothing: waiting is all there is)


_CAP = "Ask for fewer GPUs, or wait: it starts once the team's running jobs free enough of the cap."
# code -> (sentence, what the user can change). Codes as Slurm 22.05 and 25.11 print them
# (src/common/slurm_protocol_defs.c, job_state_reason_string).
PENDING_REASONS: dict[str, tuple[str, str]] = {
    "Priority": (
        "Jobs with a higher priority are ahead of it for the GPUs it asks for.",
        "Wait, or ask for fewer GPUs, another GPU type or a shorter time limit: the scheduler can fit "
        "a small, short job into a gap before the jobs ahead start (backfill).",
    ),
    "Resources": (
        "It is next in line, but the GPUs (or CPUs, memory, nodes) it asks for are busy with running jobs.",
        "Wait for running jobs to end, or ask for fewer GPUs or another GPU type.",
    ),
    "None": ("The scheduler has not looked at it yet.", ""),
    "AssocGrpGRES": (
        "The team's GPU cap (its Slurm account's GrpTRES) is reached by its running jobs.",
        _CAP,
    ),
    "AssocGrpGRESMinutes": (
        "The team's GPU-minutes budget in Slurm (GrpTRESMins) is used up.",
        "Ask the team's manager to raise the quota; the job starts when the budget allows it.",
    ),
    "AssocGrpGRESRunMinutes": (
        "The GPU-minutes the team's running jobs may still use (GrpTRESRunMins) are at their limit.",
        "Ask for a shorter time limit or fewer GPUs, or wait for the team's running jobs to end.",
    ),
    "AssocMaxGRESPerJob": (
        "It asks for more GPUs than the team's account allows in one job (MaxTRES).",
        "Ask for fewer GPUs: it will never start as it is. Cancel it and submit again.",
    ),
    "AssocGrpJobsLimit": (
        "The team has as many jobs running as its account allows (GrpJobs).",
        "Wait for the team's running jobs to end.",
    ),
    "AssocMaxJobsLimit": (
        "You have as many jobs running as your association allows (MaxJobs).",
        "Wait for your running jobs to end.",
    ),
    "AssocGrpCpuLimit": ("The team's CPU cap (GrpTRES cpu) is reached by its running jobs.", "Ask for fewer CPUs, or wait."),
    "AssocGrpMemLimit": ("The team's memory cap (GrpTRES mem) is reached by its running jobs.", "Ask for less memory, or wait."),
    "AssocMaxWallDurationPerJobLimit": (
        "Its time limit is longer than the team's account allows (MaxWall).",
        "Ask for a shorter time limit: it will never start as it is. Cancel it and submit again.",
    ),
    "QOSGrpGRES": (
        "The GPU cap of its QOS (shared by every job of that QOS) is reached.",
        "Ask for fewer GPUs or another QOS, or wait for jobs of that QOS to end.",
    ),
    "QOSMaxGRESPerUser": (
        "You already run as many GPUs as its QOS allows one user (MaxTRESPerUser).",
        "Wait for your running jobs to end, ask for fewer GPUs, or use another QOS.",
    ),
    "QOSMaxGRESPerAccount": (
        "The team already runs as many GPUs as its QOS allows one account (MaxTRESPerAccount).",
        "Wait for the team's running jobs to end, ask for fewer GPUs, or use another QOS.",
    ),
    "QOSMaxGRESPerJob": (
        "It asks for more GPUs than its QOS allows in one job (MaxTRESPerJob).",
        "Ask for fewer GPUs or use another QOS: it will never start as it is. Cancel it and submit again.",
    ),
    "QOSGrpGRESMinutes": (
        "The GPU-minutes budget of its QOS (GrpTRESMins) is used up.",
        "Use another QOS, or ask an administrator.",
    ),
    "QOSMaxWallDurationPerJobLimit": (
        "Its time limit is longer than its QOS allows (MaxWall).",
        "Ask for a shorter time limit or use another QOS: it will never start as it is.",
    ),
    "QOSJobLimit": ("Its QOS has as many jobs running as it allows.", "Wait, or use another QOS."),
    "QOSMaxJobsPerUserLimit": ("You have as many jobs running as its QOS allows one user.", "Wait for your running jobs to end."),
    "QOSGrpCpuLimit": ("The CPU cap of its QOS is reached.", "Ask for fewer CPUs or another QOS, or wait."),
    "InvalidQOS": ("Its QOS does not exist or the team's account may not use it.", "Cancel it and submit with a QOS the team may use."),
    "InvalidAccount": ("The team's Slurm account is not valid for this cluster or partition.", "Ask an administrator."),
    "Reservation": (
        "It runs in a reservation (a booking) that has not started yet, or whose nodes are busy.",
        "Wait for the booking to start, or cancel it and submit without the booking.",
    ),
    "ReqNodeNotAvail": (
        "A node it needs is unavailable (down, drained, reserved for someone else) or does not exist.",
        "Cancel it and submit without naming that node (--nodelist) or with a constraint other nodes meet; "
        "a reservation for maintenance ends by itself.",
    ),
    "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions": (
        "The nodes it needs are down, drained or held for jobs of a higher-priority partition.",
        "Wait, or cancel it and submit to another partition.",
    ),
    "BeginTime": (
        "It was asked not to start before a given time (--begin).",
        "Wait for that time, or cancel it and submit without --begin.",
    ),
    "Dependency": (
        "It waits for the jobs it depends on (--dependency) to reach the state it asked for.",
        "Wait for them; cancelling it is the only other choice.",
    ),
    "DependencyNeverSatisfied": (
        "A job it depends on ended in a way the dependency does not accept: it will never start.",
        "Cancel it (and submit again without that dependency).",
    ),
    "JobHeldUser": ("It is held (you, or a --hold at submission).", "Release it (scontrol release), or cancel it."),
    "JobHeldAdmin": ("An administrator holds it.", "Ask an administrator why; only they can release it."),
    "PartitionDown": ("Its partition is down: no job of it starts.", "Wait until it is up again, or submit to another partition."),
    "PartitionInactive": ("Its partition is inactive.", "Submit to another partition."),
    "PartitionNodeLimit": ("It asks for more nodes than its partition allows.", "Ask for fewer nodes: it will never start as it is."),
    "PartitionTimeLimit": (
        "Its time limit is longer than its partition allows.",
        "Ask for a shorter time limit: it will never start as it is. Cancel it and submit again.",
    ),
    "BadConstraints": (
        "No node meets its request (constraint, GPU type or count per node).",
        "Cancel it and submit with a request the partition's nodes can meet.",
    ),
    "JobArrayTaskLimit": ("The array runs as many tasks at once as its %N limit allows.", "Wait for its running tasks to end."),
    "Licenses": ("The licences it asks for are in use.", "Wait for them to be free."),
    "NodeDown": ("A node it was to run on is down.", "Wait: Slurm requeues it on another node."),
    "BurstBufferResources": ("Burst buffer space is not available.", "Wait."),
    "Prolog": ("Its prolog is running.", ""),
    "launch failed requeued held": (
        "Its launch failed and Slurm held it.",
        "Ask an administrator; release (scontrol release) or cancel it.",
    ),
}

# A reason as squeue prints it may carry details after the code: "ReqNodeNotAvail, UnavailableNodes:gpu9"
_CODE_RE = re.compile(r"^[^,(]+")


def reason_code(reason: str) -> str:
    """Slurm's reason code from the reason as stored ("ReqNodeNotAvail, UnavailableNodes:x" ->
    "ReqNodeNotAvail"); "" for none."""
    reason = (reason or "").strip()
    if reason in PENDING_REASONS:
        return reason
    match = _CODE_RE.match(reason)
    return match.group(0).strip() if match else ""


def reason_explained(reason: str) -> PendingReason | None:
    """The table's sentence and advice for a stored reason; None when the code is not in the table
    (the page, API and CLI then show Slurm's own words only)."""
    code = reason_code(reason)
    row = PENDING_REASONS.get(code)
    return PendingReason(code=code, text=row[0], advice=row[1]) if row else None


@dataclass(frozen=True)
class Outlook:
    """A pending job's expected start (None: Slurm has no estimate yet) and its place (1 = next)
    among the pending jobs of its partition wanting the same GPU type, in priority order."""

    expected_start: dt.datetime | None
    position: int | None


def queue_outlook(queue) -> dict[int, Outlook]:
    """Each pending job's outlook, by Slurm job id (an array's: the array's id, from the row of its
    pending tasks), from one queue read (``QueueEntry`` values). Order within a partition and GPU
    type: Slurm's (priority highest first; the older job, lower id, first on equal priority). A job
    that may run in several partitions ("a,b") counts in each and is placed in its first one."""
    pending = [e for e in queue if state_from_slurm(e.state) == JobState.PENDING]
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for entry in pending:
        for partition in entry.partition.split(","):
            groups[(partition, entry.gpu_type)].append(entry)
    places: dict[tuple[str, str, int], int] = {}
    for (partition, gpu_type), entries in groups.items():
        entries.sort(key=lambda e: (-(e.priority or 0), e.job_id))
        for place, entry in enumerate(entries, start=1):
            places[(partition, gpu_type, entry.job_id)] = place
    out: dict[int, Outlook] = {}
    for entry in pending:
        key = entry.array_job_id if entry.array_job_id is not None else entry.job_id
        if key in out and entry.array_job_id is not None and out[key].position is not None:
            continue  # an array: its first pending row speaks for it
        first = entry.partition.split(",")[0]
        out[key] = Outlook(expected_start=entry.start_time, position=places.get((first, entry.gpu_type, entry.job_id)))
    return out


def estimate_moved(previous: dt.datetime | None, current: dt.datetime | None, *, threshold_minutes: int) -> bool:
    """True when an estimate moved by more than the threshold (a first estimate is no move)."""
    if previous is None or current is None:
        return False
    return abs((current - previous).total_seconds()) > threshold_minutes * 60
