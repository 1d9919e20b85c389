"""The tag the portal puts in a job's Slurm comment, ``gpuportal:<the job's uuid>``: the one place
that knows its format. Slurm keeps the comment in the queue and in accounting, so a job is found
again after a crash between sbatch and the database write (jobs' relay and sync), and a usage
record names the portal's job it belongs to (accounting's ingestion). Whether a Slurm record found
by id is a given portal job's (ids are reused after Slurm loses its state): record_is_job, here."""

from __future__ import annotations

import datetime as dt
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


# Slurm's clock and the portal's may disagree by this much (one host, or hosts kept in step by NTP)
CLOCK_SLACK = dt.timedelta(seconds=5)


def record_is_job(record, *, job_id, sent_after: dt.datetime, id_known_at: dt.datetime | None) -> bool:
    """Whether a Slurm record — a queue entry or an accounting record, anything with ``comment`` and
    ``submit_time`` — is portal job ``job_id``'s: the one rule of the jobs' sync and the usage
    ingestion, which find a job's record by its Slurm id.

    A Slurm id alone does not name a job: Slurm hands out ids again from 1 when its state is lost
    (a controller reset, a state directory wiped; /work/shared/SLURM-NOTES.md), so the job that
    holds an id now may be anyone's. A record with a comment is the job's when the comment is its
    tag. A record without one (sacct leaves a running job's Comment empty until it ends) is the
    job's when Slurm took it while the portal was submitting it: at or after ``sent_after`` (the
    job stored, before any sbatch) and at or before ``id_known_at`` (the portal recorded the id
    Slurm answered; None: not known yet, no upper bound), give or take CLOCK_SLACK: a job that
    reuses the id was submitted after the portal learnt it. A record without a submit time (the
    Kubernetes backend's word that a job it was asked about is gone) has nothing to tell it apart
    by and is taken, as its id is the one asked about."""
    comment = record.comment or ""
    if comment:
        return tagged_job_id(comment) == uuid.UUID(str(job_id))
    submitted = record.submit_time
    if submitted is None:
        return True
    return sent_after - CLOCK_SLACK <= submitted and (id_known_at is None or submitted <= id_known_at + CLOCK_SLACK)
