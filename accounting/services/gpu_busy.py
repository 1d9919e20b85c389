"""What the GPUs of a job did, in accounting's terms: UsageRecord.gpu_busy_fraction, the share of its
GPU-time its GPUs computed. The GPU monitoring (jobs.services.gpu_usage) hands it over each cycle
for the jobs it saw; reports turn it into busy GPU-hours and the cost of idle ones."""

from __future__ import annotations

import uuid
from decimal import Decimal

from accounting.models import UsageRecord
from accounting.services.usage_rollup import months_between, usage_months_reopen
from portal import money


def usage_busy_record(*, fractions: dict[tuple[uuid.UUID, int], Decimal]) -> int:
    """Set gpu_busy_fraction (clamped to 0..1) on the usage records of (portal job, Slurm job id) —
    an array task is its own record. Records not ingested yet are left for the next call. One read,
    one bulk update; returns the records changed."""
    if not fractions:
        return 0
    jobs = {job for job, _ in fractions}
    records = list(
        UsageRecord.objects.filter(portal_job_uuid__in=jobs, job_id__in={sid for _, sid in fractions}).only(
            "id", "portal_job_uuid", "job_id", "gpu_busy_fraction", "start_time", "known_until"
        )
    )
    changed = []
    for record in records:
        value = fractions.get((record.portal_job_uuid, record.job_id))
        if value is None:
            continue
        value = money.stored(min(max(Decimal(value), Decimal(0)), Decimal(1)))
        if record.gpu_busy_fraction != value:
            record.gpu_busy_fraction = value
            changed.append(record)
    UsageRecord.objects.bulk_update(changed, ["gpu_busy_fraction"], batch_size=1000)
    # the busy and idle figures of a closed month's totals change with it (no statement unless a
    # record reaches into a month before the current one)
    usage_months_reopen({m for r in changed for m in months_between(r.start_time, r.known_until)})
    return len(changed)
