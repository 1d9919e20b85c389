"""portal.slurm.tags.record_is_job: the one rule by which the jobs' sync and the usage ingestion tell
whether a Slurm record found by a job's Slurm id is that job's, when Slurm hands ids out again after
losing its state (SLURM-NOTES: wiping the controller's state restarts job ids at 1)."""

from __future__ import annotations

import datetime as dt
import uuid
from types import SimpleNamespace

import pytest

from portal.slurm.tags import CLOCK_SLACK, record_is_job, slurm_tag

JOB = uuid.uuid4()
SENT = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)  # the portal stored the job, then ran sbatch
KNOWN = SENT + dt.timedelta(seconds=2)  # the portal recorded the id Slurm answered


def record(comment: str = "", submitted: dt.datetime | None = SENT + dt.timedelta(seconds=1)):
    return SimpleNamespace(comment=comment, submit_time=submitted)


def is_job(rec, *, known=KNOWN) -> bool:
    return record_is_job(rec, job_id=JOB, sent_after=SENT, id_known_at=known)


def test_a_record_with_the_jobs_tag_is_the_jobs_whenever_slurm_took_it():
    assert is_job(record(slurm_tag(JOB), submitted=SENT + dt.timedelta(days=3)))


@pytest.mark.parametrize("comment", [slurm_tag(uuid.UUID(int=7)), "someone's own comment"], ids=["another job's tag", "own comment"])
def test_a_record_with_another_comment_is_not_the_jobs(comment):
    assert not is_job(record(comment))


def test_an_untagged_record_slurm_took_while_the_portal_sent_the_job_is_the_jobs():
    """sacct leaves a running job's Comment empty: the submit time decides."""
    assert is_job(record())
    assert is_job(record(submitted=SENT - CLOCK_SLACK))  # the clocks disagree a little
    assert is_job(record(submitted=KNOWN + CLOCK_SLACK))


def test_an_untagged_record_of_a_job_that_reused_the_id_after_a_state_loss_is_not_the_jobs():
    """The controller lost its state after the portal learnt the id; Slurm gave the id again, later."""
    assert not is_job(record(submitted=KNOWN + CLOCK_SLACK + dt.timedelta(seconds=1)))
    assert not is_job(record(submitted=KNOWN + dt.timedelta(hours=5)))


def test_an_untagged_record_from_before_the_job_existed_is_not_the_jobs():
    """The id belonged to an older job (of before a reset) that Slurm's accounting still lists."""
    assert not is_job(record(submitted=SENT - CLOCK_SLACK - dt.timedelta(seconds=1)), known=None)
    assert not is_job(record(submitted=SENT - dt.timedelta(days=2)))


def test_without_a_known_id_time_only_the_lower_bound_applies():
    assert is_job(record(submitted=SENT + dt.timedelta(hours=1)), known=None)


def test_an_untagged_record_without_a_submit_time_is_taken():
    """The Kubernetes backend's record of a job it was asked about and no longer has: nothing to tell it by."""
    assert is_job(record(submitted=None))
