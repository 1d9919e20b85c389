"""The tag the portal puts in a job's Slurm comment, ``gpuportal:<the job's uuid>``: the one place
that knows its format. Slurm keeps the comment in the queue and in accounting, so a job is found
again after a crash between sbatch and the database write (jobs' relay and sync), and a usage
record names the portal's job it belongs to (accounting's ingestion)."""

from __future__ import annotations

import re
import uuid

SLURM_TAG_PREFIX = "gpuportal:"
_TAG = re.compile(re.escape(SLURM_TAG_PREFIX) + r"([0-9a-fA-F-]{36})")


def slurm_tag(job_id) -> str:
    """The comment a portal job carries in Slurm."""
    return f"{SLURM_TAG_PREFIX}{job_id}"


def tagged_job_id(comment: str) -> uuid.UUID | None:
    """The portal job a Slurm comment names, or None (no tag, or not a uuid)."""
    match = _TAG.search(comment or "")
    if not match:
        return None
    try:
        return uuid.UUID(match.group(1))
    except ValueError:
        return None
