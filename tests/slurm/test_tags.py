"""portal.slurm.tags: the one format of the portal's tag in a job's Slurm comment, written by the
relay (Job.slurm_tag) and read back by the sync and the usage ingestion."""

from __future__ import annotations

import uuid

from portal.slurm.tags import slurm_tag, tagged_job_id


def test_a_tag_names_its_job_back():
    job_id = uuid.uuid4()
    assert slurm_tag(job_id) == f"gpuportal:{job_id}"
    assert tagged_job_id(slurm_tag(job_id)) == job_id
    assert tagged_job_id(f"nightly run {slurm_tag(job_id)} (retry)") == job_id  # anywhere in the comment


def test_a_comment_without_a_tag_or_with_a_broken_one_names_no_job():
    assert tagged_job_id("") is None and tagged_job_id(None) is None
    assert tagged_job_id("gpuportal:not-a-uuid") is None
    assert tagged_job_id("gpuportal:" + "-" * 36) is None  # 36 characters of the pattern, not a uuid
