"""Job states and template scopes, and the rules that say which state change is allowed.

The portal's job states mirror Slurm's base states, plus ACCEPTED (stored, not yet in Slurm) and
SUBMIT_FAILED (Slurm refused it, or it could not be sent). Terminal states are never left, and a
live job never goes back (PENDING after RUNNING is ignored) except through REQUEUED."""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    ACCEPTED = "ACCEPTED", "Accepted"  # stored by the portal, relay to Slurm pending
    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"
    SUSPENDED = "SUSPENDED", "Suspended"
    COMPLETING = "COMPLETING", "Completing"
    REQUEUED = "REQUEUED", "Requeued"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    TIMEOUT = "TIMEOUT", "Timeout"
    OUT_OF_MEMORY = "OUT_OF_MEMORY", "Out of memory"
    NODE_FAIL = "NODE_FAIL", "Node failure"
    PREEMPTED = "PREEMPTED", "Preempted"
    BOOT_FAIL = "BOOT_FAIL", "Boot failure"
    DEADLINE = "DEADLINE", "Deadline"
    SUBMIT_FAILED = "SUBMIT_FAILED", "Submit failed"


TERMINAL_STATES: frozenset[str] = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.OUT_OF_MEMORY,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.SUBMIT_FAILED,
    }
)
LIVE_STATES: frozenset[str] = frozenset(set(JobState.values) - TERMINAL_STATES)
# Live states in which the job is known to Slurm (has a Slurm id) — what the sync follows.
IN_SLURM_STATES: frozenset[str] = LIVE_STATES - {JobState.ACCEPTED}

# Progress rank: a live job only moves to an equal-or-higher rank (RUNNING <-> SUSPENDED share one).
_RANK = {
    JobState.ACCEPTED: 0,
    JobState.PENDING: 1,
    JobState.REQUEUED: 1,
    JobState.RUNNING: 2,
    JobState.SUSPENDED: 2,
    JobState.COMPLETING: 3,
}

# Slurm base states (squeue %T / sacct State, upper case) that are not portal states by name.
_SLURM_ALIASES = {
    "CONFIGURING": JobState.RUNNING,  # allocated, nodes booting
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.COMPLETING,
    "STOPPED": JobState.SUSPENDED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SPECIAL_EXIT": JobState.FAILED,
    "REVOKED": JobState.CANCELLED,
    "OOM": JobState.OUT_OF_MEMORY,
    "CA": JobState.CANCELLED,
}


def state_from_slurm(slurm_state: str) -> str | None:
    """The portal state for a Slurm state string ("CANCELLED by 0" → CANCELLED); None if unknown."""
    base = (slurm_state or "").strip().split(" ")[0].rstrip("+").upper()
    if base in _SLURM_ALIASES:
        return _SLURM_ALIASES[base]
    return _SLURM_NAMED.get(base)


# The states Slurm itself names (JobState.values builds its list anew at each use: once per job of
# every sync cycle, 6 % of the worker's time with 1500 jobs in the queue)
_SLURM_NAMED = {v.value: v.value for v in JobState if v not in (JobState.ACCEPTED, JobState.SUBMIT_FAILED)}


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def transition_allowed(current: str, new: str) -> bool:
    """True when a job in ``current`` may move to ``new`` (a change, not a repeat).

    Terminal states are never left. A live job moves forward (or sideways between RUNNING and
    SUSPENDED); going back to PENDING is allowed only through REQUEUED (Slurm reports REQUEUED,
    then PENDING again)."""
    if current == new or current in TERMINAL_STATES:
        return False
    if new in TERMINAL_STATES:
        return True
    if new == JobState.REQUEUED:
        return current in (JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)
    if current == JobState.REQUEUED:
        return True  # the requeued job starts over: PENDING, RUNNING, ...
    return _RANK[new] >= _RANK[current]


class TemplateScope(models.TextChoices):
    PERSONAL = "personal", "Personal"
    TEAM = "team", "Team"
    SITE = "site", "Site"


class OutputStream(models.TextChoices):
    STDOUT = "stdout", "Standard output"
    STDERR = "stderr", "Standard error"


# The file suffix JOB_OUTPUT_PATTERN uses for each stream ({stream} = out / err).
STREAM_SUFFIX = {OutputStream.STDOUT: "out", OutputStream.STDERR: "err"}
