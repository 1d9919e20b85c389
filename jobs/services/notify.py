"""Job-end e-mails to the submitters who opted in."""

from __future__ import annotations

from django.conf import settings

from jobs.choices import TERMINAL_STATES
from jobs.models import Job


def job_end_notify_send(*, job_ids: list[str]) -> int:
    """Email the submitters who opted in (Profile.notify_job_end) that their jobs ended. Two queries
    and one SMTP connection for the whole batch; returns the number of emails sent."""
    from django.core.mail import send_mass_mail

    jobs = list(
        Job.objects.filter(pk__in=job_ids, state__in=TERMINAL_STATES, submitter__profile__notify_job_end=True)
        .exclude(submitter__email="")
        .select_related("submitter", "team")
        .only("id", "name", "state", "state_reason", "exit_code", "slurm_job_id", "started_at", "ended_at",
              "estimated_gpu_hours", "submitter__email", "submitter__username", "team__name")
    )  # fmt: skip
    messages = []
    for job in jobs:
        elapsed = ""
        if job.started_at and job.ended_at:
            elapsed = f"Ran for {job.ended_at - job.started_at}.\n"
        body = (
            f"Your job {job.name} (team {job.team.name}, Slurm job {job.slurm_job_id}) ended: {job.state}"
            + (f" with exit code {job.exit_code}" if job.exit_code is not None else "")
            + ".\n"
            + (f"Reason: {job.state_reason}\n" if job.state_reason else "")
            + elapsed
            + f"\nDetails and output: /jobs/{job.pk}/\n"
            + "You get this email because job-end emails are on in your profile (/account/profile/).\n"
        )
        messages.append((f"[gpuportal] {job.name}: {job.state}", body, settings.DEFAULT_FROM_EMAIL, [job.submitter.email]))
    return send_mass_mail(messages, fail_silently=False) if messages else 0
