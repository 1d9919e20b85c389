"""The sweepers of the jobs app: re-enqueue relays and cancels that got stuck (``jobs_sweep``), and
release the budget holds of jobs whose final usage will not come (``budget_holds_sweep``). The
job-end e-mails' sweeper is notify's (jobs.services.job_end_notify_sweep)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from accounting.models import BudgetHold
from accounting.services import budget_holds_release
from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState
from jobs.models import Job, JobArrayTask
from jobs.services.relay import _lease_free
from portal.outbox import publish


def jobs_sweep() -> dict:
    """Re-enqueue work that got stuck: relays of jobs ACCEPTED for longer than
    JOB_ACCEPTED_SWEEP_SECONDS (the relay's claim and find-by-tag make a repeat harmless), and
    cancels requested but not yet passed on to Slurm — a job's, and an array task's cancelled alone
    (still live that long after: its relay is sent again, harmless). Three queries, then ONE relay
    drain (it claims every waiting job, these among them; published even while a drain's coalescing
    flag is up: its holder may be dead), one cancel relay per job and one per task."""
    now = timezone.now()
    cutoff = now - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS)
    relay_ids = list(
        Job.objects.filter(_lease_free(), state=JobState.ACCEPTED, created_at__lt=cutoff, cancel_requested_at__isnull=True)
        .values_list("pk", flat=True)[:1000]
    )
    cancel_ids = list(
        Job.objects.filter(state__in=LIVE_STATES, cancel_requested_at__lt=cutoff)
        .filter(Q(cancel_sent_at__isnull=True) | Q(cancel_sent_at__lt=cutoff))
        .values_list("pk", flat=True)[:1000]
    )
    task_cancels = list(
        JobArrayTask.objects.filter(cancel_requested_at__lt=cutoff, job__state__in=LIVE_STATES)
        .exclude(state__in=sorted(TERMINAL_STATES))  # the partial index jobarraytask_cancel_owed's own words
        .values_list("job_id", "index")[:1000]
    )
    if relay_ids:
        publish("jobs.tasks.job_relay_drain")
    for job_id in cancel_ids:
        publish("jobs.tasks.job_cancel_relay", str(job_id))
    for job_id, index in task_cancels:
        publish("jobs.tasks.job_array_task_cancel_relay", str(job_id), index)
    return {"relays": len(relay_ids), "cancels": len(cancel_ids), "task_cancels": len(task_cancels)}


HOLD_SWEEP_BATCH = 1000


def budget_holds_sweep(*, now: dt.datetime | None = None) -> dict[str, int]:
    """Release the budget holds whose final usage will not come, BUDGET_HOLD_RELEASE_AFTER_HOURS on
    (the setting says why 24 h), so that they stop blocking their team's budget:

    - ``ended``: the job ended that long ago (``ended_at``) and the usage ingestion never saw its
      final record (slurmdbd lost it; the job ran on a cluster whose accounting is not read);
    - ``gone``: the hold was placed that long ago and its job row no longer exists (deleted, purged);
    - ``unfollowed``: the hold was placed that long ago and its job is live on a cluster no longer
      configured (Cluster.active false: nothing syncs it or ingests its usage).

    Each kind goes through budget_holds_release (the running totals move under their locks, in
    one transaction with the holds) with its reason: an audit event per hold and a log line. Usage
    that arrives later is still charged (used comes from the slices), never twice. Idempotent: a
    released hold is left alone. At most HOLD_SWEEP_BATCH holds of each kind a run (the next run
    takes the rest). Returns how many holds of each kind were released."""
    now = now or timezone.now()
    hours = settings.BUDGET_HOLD_RELEASE_AFTER_HOURS
    cutoff = now - dt.timedelta(hours=hours)
    open_holds = BudgetHold.objects.filter(released_at__isnull=True)
    old_holds = open_holds.filter(created_at__lt=cutoff)
    kinds = {
        "ended": Job.objects.filter(pk__in=open_holds.values("job_uuid"), state__in=TERMINAL_STATES)
        .filter(Q(ended_at__lt=cutoff) | Q(ended_at__isnull=True, created_at__lt=cutoff))
        .values_list("pk", flat=True),
        "gone": old_holds.filter(~Exists(Job.objects.filter(pk=OuterRef("job_uuid")))).values_list("job_uuid", flat=True),
        "unfollowed": Job.objects.filter(pk__in=old_holds.values("job_uuid"), state__in=LIVE_STATES, cluster__active=False)
        .values_list("pk", flat=True),
    }
    reasons = {
        "ended": f"the job ended over {hours} h ago and its final usage never came",
        "gone": f"the job no longer exists (hold placed over {hours} h ago)",
        "unfollowed": f"the job's cluster is no longer configured (hold placed over {hours} h ago)",
    }
    return {
        kind: budget_holds_release(job_uuids=list(ids[:HOLD_SWEEP_BATCH]), at=now, reason=reasons[kind])
        for kind, ids in kinds.items()
    }
