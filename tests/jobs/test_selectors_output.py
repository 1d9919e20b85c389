"""job_output: offsets, caps, messages instead of errors, and the file-safety checks."""

from __future__ import annotations

import os

import pytest

from jobs.choices import JobState
from jobs.models import Job
from jobs.selectors import OUTPUT_MAX_LENGTH, job_output
from tests.support import output_patterns

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(world, tmp_path):
    return Job.objects.create(
        team=world.vision, submitter=world.alice, name="o", script="#!/bin/bash\n", partition="gpu", gpus=1,
        time_limit_minutes=5, workdir=str(tmp_path), state=JobState.RUNNING, slurm_job_id=321,
        unix_uid=os.getuid(), estimated_gpu_hours=1, **output_patterns(str(tmp_path)),
    )  # fmt: skip


def test_output_reads_from_an_offset_and_reports_the_next_one(job, tmp_path):
    (tmp_path / "slurm-321.out").write_text("hello world\n")
    first = job_output(job=job, offset=0, length=5)
    assert (first.data, first.offset, first.next_offset, first.size, first.eof) == ("hello", 0, 5, 12, False)
    rest = job_output(job=job, offset=first.next_offset)
    assert (rest.data, rest.next_offset, rest.eof, rest.final) == (" world\n", 12, True, False)
    assert job_output(job=job, offset=100).data == ""


def test_stderr_is_in_the_out_file_as_under_sbatch_and_in_its_own_with_a_stream_pattern(job, tmp_path, settings):
    (tmp_path / "slurm-321.out").write_text("both")
    assert job_output(job=job, stream="stderr").data == "both"  # sbatch's default: one file
    settings.JOB_OUTPUT_PATTERN = "{workdir}/gpuportal-{slurm_job_id}.{stream}"
    (tmp_path / "gpuportal-321.err").write_text("oops")
    assert job_output(job=job, stream="stderr").data == "both"  # where it was submitted to write, not today's setting
    Job.objects.filter(pk=job.pk).update(**output_patterns(str(tmp_path)))  # a job submitted under the new setting
    job.refresh_from_db()
    assert job_output(job=job, stream="stderr").data == "oops"


def test_length_is_capped(job, tmp_path):
    (tmp_path / "slurm-321.out").write_bytes(b"a" * (OUTPUT_MAX_LENGTH + 10))
    chunk = job_output(job=job, length=10 * OUTPUT_MAX_LENGTH)
    assert len(chunk.data) == OUTPUT_MAX_LENGTH and not chunk.eof


def test_a_character_cut_by_the_chunk_end_is_left_for_the_next_read(job, tmp_path):
    (tmp_path / "slurm-321.out").write_text("ab€c")  # € is 3 bytes
    first = job_output(job=job, length=3)
    assert first.data == "ab" and first.next_offset == 2
    assert job_output(job=job, offset=2).data == "€c"


def test_missing_file_gives_a_message_not_an_error(job):
    chunk = job_output(job=job)
    assert chunk.data == "" and "No output file slurm-321.out" in chunk.message
    assert chunk.message.endswith("(not written yet, or removed).")


def test_no_output_file_because_slurm_could_not_open_it_says_so(job):
    """sacct's 0:53: slurmd's ESLURMD_IO_ERROR, the job ended before its script ran (what real Slurm
    gives: tests/jobs/test_integration_slurm.py)."""
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, exit_code=0, exit_signal=53)
    job.refresh_from_db()
    chunk = job_output(job=job)
    assert chunk.data == "" and chunk.message.startswith("No output file slurm-321.out in ")
    assert ": signal 53: Slurm could not open the job's output or error file" in chunk.message
    Job.objects.filter(pk=job.pk).update(exit_signal=9)  # a signal the job got: no such explanation
    job.refresh_from_db()
    assert job_output(job=job).message.endswith("(not written yet, or removed).")


def test_job_not_yet_in_slurm_gives_a_message(job):
    Job.objects.filter(pk=job.pk).update(slurm_job_id=None, state=JobState.ACCEPTED)
    job.refresh_from_db()
    assert "not reached Slurm yet" in job_output(job=job).message


def test_a_symlinked_output_file_is_not_followed(job, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    (tmp_path / "slurm-321.out").symlink_to(secret)
    chunk = job_output(job=job)
    assert chunk.data == "" and "cannot be read" in chunk.message


def test_a_file_of_another_user_is_not_shown(job, tmp_path):
    (tmp_path / "slurm-321.out").write_text("someone else's")
    Job.objects.filter(pk=job.pk).update(unix_uid=os.getuid() + 12345)
    job.refresh_from_db()
    chunk = job_output(job=job)
    assert chunk.data == "" and "does not belong" in chunk.message
