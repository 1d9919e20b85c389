"""Job dependencies (issue 38) against the real clusters, for every ``slurm_target`` (cli on 22.05
and 25.11, pyslurm on 25.11): a child submitted with its parent waits in the portal until the
parent has a Slurm id, then reaches Slurm with ``--dependency=afterok:<the parent's id>`` (Slurm's
own ``scontrol show job`` is the oracle), waits there with reason ``Dependency`` and runs after its
parent; a child whose parent fails is cancelled by the portal with the reason in its history."""

from __future__ import annotations

import re
from pathlib import Path
import subprocess

import pytest
from django.conf import settings

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_relay_drain_run, job_submit, jobs_sync
from portal.slurm.cli import _clean_env
from tests.support import slurm_cancel_tagged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def scontrol_job(slurm_id: int) -> str:
    exe = str(Path(settings.SLURM_BIN_DIR) / "scontrol") if settings.SLURM_BIN_DIR else "scontrol"
    done = subprocess.run([exe, "show", "job", str(slurm_id)], capture_output=True, text=True,
                          env=_clean_env(settings.SLURM_CONF), timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _submit(cluster, name: str, script: str, **fields) -> Job:
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, name=name, script=script, partition="debug", gpus=1,
                        time_limit_minutes=2, **fields)  # fmt: skip
    return job


def _sync_until(predicate, *, timeout=90.0):
    def step():
        jobs_sync()
        return predicate()

    return wait_for(step, timeout=timeout, interval=0.5)


def test_a_child_reaches_slurm_after_its_parent_with_afterok_on_its_id_and_runs_after_it(slurm_target, cluster):
    parent = _submit(cluster, "dep-parent", "#!/bin/bash\nsleep 6\n")
    child = _submit(cluster, "dep-child", "#!/bin/bash\n#SBATCH --dependency=singleton\necho child ran\n",
                    depends_on=[parent.pk])  # fmt: skip
    try:
        result = job_relay_drain_run(limit=10)
        # the child was not claimed in the parent's round: it waited for the parent's Slurm id
        assert result["submitted"] == 2 and result["rounds"] == 2, result
        parent.refresh_from_db()
        child.refresh_from_db()
        shown = scontrol_job(child.slurm_job_id)
        # Slurm's own word: afterok on the parent's id; the script's singleton was replaced by the field
        assert re.search(rf"Dependency=afterok:{parent.slurm_job_id}(\(unfulfilled\))?\b", shown), shown
        _sync_until(lambda: Job.objects.get(pk=child.pk).state_reason == "Dependency")
        _sync_until(lambda: set(Job.objects.filter(pk__in=[parent.pk, child.pk]).values_list("state", flat=True)) == {JobState.COMPLETED})
        parent.refresh_from_db()
        child.refresh_from_db()
        assert child.started_at >= parent.ended_at
    finally:
        slurm_cancel_tagged([parent, child])


def test_a_child_whose_parent_fails_in_slurm_is_cancelled_by_the_portal_saying_why(
    slurm_target, cluster, django_capture_on_commit_callbacks
):
    parent = _submit(cluster, "dep-fails", "#!/bin/bash\nsleep 2\nexit 3\n")
    child = _submit(cluster, "dep-never", "#!/bin/bash\necho never\n", depends_on=[parent.pk])
    try:
        job_relay_drain_run(limit=10)
        child.refresh_from_db()
        assert child.slurm_job_id is not None

        def cancelled() -> bool:
            with django_capture_on_commit_callbacks(execute=True):  # the cancel relay runs (eager) on commit
                jobs_sync()
            return Job.objects.get(pk=child.pk).state == JobState.CANCELLED

        wait_for(cancelled, timeout=120, interval=1.0)
        assert Job.objects.get(pk=parent.pk).state == JobState.FAILED
        reasons = list(child.events.values_list("reason", flat=True))
        assert f"Cancelled by the portal: job {parent.pk}, which it waits for, did not complete successfully; it can never start." in reasons
        # Slurm's own record says who cancelled it and why, as for the idle-GPU policy's cancel
        assert f"AdminComment=gpuportal: cancelled, job {parent.pk}, which it waits for" in scontrol_job(child.slurm_job_id)
    finally:
        slurm_cancel_tagged([parent, child])
