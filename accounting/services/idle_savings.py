"""What the idle-GPU policy saved, in accounting's terms (issue 40 item 3): one IdleCancelSaving per job
the policy cancelled, handed over by the jobs app (jobs.services.cancel.job_idle_cancel) in the
cancel's transaction; the reports and the dashboard read them (accounting.selectors.idle_savings)."""

from __future__ import annotations

import datetime as dt
import uuid

from accounting.models import IdleCancelSaving


def idle_saving_record(*, job_uuid: uuid.UUID, team, cluster: str, gpu_type: str, gpus: int, gpu_seconds: int,
                       idle_since: dt.datetime, at: dt.datetime) -> IdleCancelSaving:  # fmt: skip
    """Record the GPU-seconds a policy cancel saved (whole, never negative); a second record for the
    same job keeps the first (the cancel is decided once)."""
    saving, _ = IdleCancelSaving.objects.get_or_create(
        portal_job_uuid=job_uuid,
        defaults={"team": team, "cluster": cluster, "gpu_type": gpu_type, "gpus": gpus,
                  "gpu_seconds": max(0, int(gpu_seconds)), "idle_since": idle_since, "cancelled_at": at},
    )  # fmt: skip
    return saving
