"""Job-end e-mails to the submitters who opted in, each sent once.

The sync enqueues ``job_end_notify`` with the ids of the jobs it ended (after commit: portal/outbox.py).
Whoever runs for a job — that task, its retry, or the sweeper's repeat — first claims it: in one
short transaction the ended jobs whose notice nobody dealt with yet are locked (SKIP LOCKED: another
claim's rows are its own) and ``Job.end_notified_at`` is set on them, so two runs never both decide
to send (the budget alerts' claim, accounting.services.alerts, for a batch). Only then the opted-in ones are mailed; a mail that fails hands its job back (the
marker cleared) for the retry or the sweeper. A worker that dies between the claim and the send
loses those notices: a lost notice is the lesser harm than a repeated one (the job page shows the end).
``job_end_notify_sweep`` (periodic, portal/project/celery.py) enqueues again the ended jobs whose task was lost."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.utils import timezone

from jobs.choices import TERMINAL_STATES
from jobs.models import Job
from portal.db import any_of
from portal.outbox import publish
from portal.slurm.parsing import exit_signal_text

# The sync's own task has this long to run before the sweeper enqueues the notice again; the sweeper
# looks this far back (older ends are old news), in batches of this many jobs a task.
NOTIFY_SWEEP_AFTER = dt.timedelta(minutes=5)
NOTIFY_SWEEP_WITHIN = dt.timedelta(days=2)
NOTIFY_SWEEP_BATCH = 500


def _claim(job_ids, now: dt.datetime) -> list:
    """The ended jobs among ``job_ids`` whose notice nobody dealt with yet, marked as dealt with now.
    Rows another claim holds are skipped (theirs); after it commits they carry its marker."""
    with transaction.atomic():
        claimed = list(
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk__in=any_of(job_ids, "uuid"), state__in=TERMINAL_STATES, end_notified_at__isnull=True)
            .values_list("pk", flat=True)
        )
        Job.objects.filter(pk__in=any_of(claimed, "uuid")).update(end_notified_at=now)
    return claimed


def _message(job: Job) -> EmailMessage:
    elapsed = ""
    if job.started_at and job.ended_at:
        elapsed = f"Ran for {job.ended_at - job.started_at}.\n"
    body = (
        f"Your job {job.name} (team {job.team.name}, Slurm job {job.slurm_job_id}) ended: {job.state}"
        + (f" with exit code {job.exit_code}" if job.exit_code is not None else "")
        + (f", {exit_signal_text(job.exit_signal)}" if job.exit_signal else "")
        + ".\n"
        + (f"Reason: {job.state_reason}\n" if job.state_reason else "")
        + elapsed
        + f"\nDetails and output: /jobs/{job.pk}/\n"
        + "You get this email because job-end emails are on in your profile (/account/profile/).\n"
    )
    return EmailMessage(f"[gpuportal] {job.name}: {job.state}", body, settings.DEFAULT_FROM_EMAIL, [job.submitter.email])


def job_end_notify_send(*, job_ids: list[str]) -> int:
    """Email the submitters who opted in (Profile.notify_job_end) that their jobs ended, once per job
    (claimed first: see the module docstring). Three queries and one SMTP connection for the whole
    batch; returns the number of emails sent. An SMTP failure clears the marker of the jobs not
    mailed yet and raises (the task retries)."""
    now = timezone.now()
    claimed = _claim(job_ids, now)
    if not claimed:
        return 0
    jobs = list(
        Job.objects.filter(pk__in=any_of(claimed, "uuid"), submitter__profile__notify_job_end=True)
        .exclude(submitter__email="")
        .select_related("submitter", "team")
        .order_by("ended_at", "pk")
        .only("id", "name", "state", "state_reason", "exit_code", "exit_signal", "slurm_job_id", "started_at", "ended_at",
              "estimated_gpu_hours", "submitter__email", "submitter__username", "team__name")
    )  # fmt: skip
    if not jobs:
        return 0
    sent = 0
    try:
        with get_connection(fail_silently=False) as connection:
            for job in jobs:
                sent += connection.send_messages([_message(job)]) or 0
    except Exception:
        Job.objects.filter(pk__in=[job.pk for job in jobs[sent:]], end_notified_at=now).update(end_notified_at=None)
        raise
    return sent


def job_end_notify_sweep(*, now: dt.datetime | None = None) -> list[str]:
    """The sweeper of job_end_notify: jobs that reached Slurm and ended between NOTIFY_SWEEP_WITHIN and
    NOTIFY_SWEEP_AFTER ago whose notice nobody dealt with (the task was lost: the broker was down at
    the sync's commit) are enqueued again, NOTIFY_SWEEP_BATCH a task. The claim makes a repeat send
    nothing twice. Jobs that never reached Slurm (cancelled before, refused) get no notice, as from
    the sync. Returns the ids enqueued."""
    now = now or timezone.now()
    ids = [
        str(pk)
        for pk in Job.objects.filter(
            state__in=TERMINAL_STATES, slurm_job_id__isnull=False, end_notified_at__isnull=True,
            ended_at__lt=now - NOTIFY_SWEEP_AFTER, ended_at__gte=now - NOTIFY_SWEEP_WITHIN,
        ).order_by("ended_at").values_list("pk", flat=True)[: NOTIFY_SWEEP_BATCH * 10]
    ]  # fmt: skip
    for start in range(0, len(ids), NOTIFY_SWEEP_BATCH):
        publish("jobs.tasks.job_end_notify", ids[start : start + NOTIFY_SWEEP_BATCH])
    return ids
