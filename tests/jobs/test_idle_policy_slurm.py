"""The teams' idle-GPU policy end to end against the real parts (issue 40 item 3): two real jobs on the
local 22.05 cluster, one loading its GPUs through the emulated dcgm-exporter (scripts/gpu-exporter's
documented GPUPORTAL_GPU_UTIL), one leaving them idle; the local Prometheus; the portal's GPU sync
cycle with the team's policy at seconds-long delays (the admin's bounds lowered by settings). The idle
one is warned, then cancelled through the relay: ``scontrol show job`` shows the portal's reason in its
AdminComment, its history says "idle GPUs", the GPU-seconds it would still have held are recorded.
The busy one runs on, neither warned nor cancelled."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core import mail

from accounting.models import IdleCancelSaving
from jobs.choices import TERMINAL_STATES, JobState
from jobs.models import Job, JobEvent, JobGpuIdleAlert
from jobs.services import jobs_sync
from jobs.services.cancel import IDLE_CANCEL_REASON
from portal.models import TeamIdlePolicy
from tests.jobs.test_gpu_usage_prometheus import IDLE, LOAD_FIRST_GPU, _run, _sync_until, real_prometheus  # noqa: F401 (fixture)
from tests.support import slurm_cancel_tagged, slurm_command, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

LOAD_EVERY_GPU = (
    "#!/bin/bash\n"
    "# load every GPU of the job at 90 % (one process bound to each)\n"
    "for gpu in ${CUDA_VISIBLE_DEVICES//,/ }; do CUDA_VISIBLE_DEVICES=$gpu GPUPORTAL_GPU_UTIL=90 sleep 300 & done\n"
    "wait\n"
)


def test_an_idle_job_is_warned_then_cancelled_with_the_reason_in_slurm_and_a_busy_one_runs_on(
    cluster, real_prometheus, settings, django_capture_on_commit_callbacks  # noqa: F811
):
    settings.GPU_IDLE_POLICY_MIN_WARN_MINUTES = 0.05  # the admin's bounds, lowered for seconds-long delays
    settings.GPU_IDLE_POLICY_MIN_CANCEL_MINUTES = 0.05
    settings.GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT = 10.0
    TeamIdlePolicy.objects.create(team=cluster.vision, enabled=True, threshold_percent=Decimal(10),
                                  warn_minutes=Decimal("0.1"), cancel_minutes=Decimal("0.1"))  # 6 s, then 6 s  # fmt: skip
    cluster.alice.email = "alice@example.org"
    cluster.alice.save()
    busy = _run(cluster, LOAD_EVERY_GPU, "idle-policy-busy")
    idle = _run(cluster, IDLE, "idle-policy-idle")
    try:
        with django_capture_on_commit_callbacks(execute=True):  # on exit: the warnings' deliveries, the cancel's relay
            _sync_until(lambda: Job.objects.get(pk=idle.pk).cancel_requested_at is not None, timeout=120)
        idle.refresh_from_db()
        assert idle.cancel_sent_at is not None and idle.cancel_reason.startswith(IDLE_CANCEL_REASON)
        # what Slurm holds: the portal's reason in the job's AdminComment, the job cancelled
        shown = slurm_command("scontrol", "show", "job", str(idle.slurm_job_id)).stdout
        assert f"AdminComment={idle.cancel_reason}" in shown, shown
        wait_for(lambda: (jobs_sync(), Job.objects.get(pk=idle.pk).state in TERMINAL_STATES)[1], timeout=60, what="the idle job ended")
        busy_now = Job.objects.get(pk=busy.pk)
        assert busy_now.state == JobState.RUNNING and busy_now.cancel_requested_at is None
        assert not JobGpuIdleAlert.objects.filter(job=busy).exists()
    finally:
        slurm_cancel_tagged([busy, idle])
    idle.refresh_from_db()
    assert idle.state == JobState.CANCELLED and idle.state_reason == idle.cancel_reason
    reasons = list(JobEvent.objects.filter(job=idle).values_list("state", "reason"))
    assert any(r.startswith("Warned: all 2 GPUs under 10 %") for _, r in reasons)
    assert any(r.startswith("Cancel requested: idle GPUs") for _, r in reasons)
    assert (JobState.CANCELLED, idle.cancel_reason) in reasons
    warning = JobGpuIdleAlert.objects.get(job=idle)
    assert warning.cancel_at is not None and warning.cancel_at <= idle.cancel_requested_at
    mine = [m for m in mail.outbox if str(idle.pk) in m.body]
    assert len(mine) == 1 and "cancelled at" in mine[0].subject and mine[0].to == ["alice@example.org"]
    # what the cancel saved: its 2 GPUs × (its start + its 5-minute limit − the moment the portal cancelled it)
    saving = IdleCancelSaving.objects.get(portal_job_uuid=idle.pk)
    limit_end = idle.started_at + dt.timedelta(minutes=idle.time_limit_minutes)
    assert saving.cancelled_at == idle.cancel_requested_at
    assert saving.gpu_seconds == 2 * int((limit_end - saving.cancelled_at).total_seconds()) > 0
