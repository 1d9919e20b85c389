"""Idle-GPU alerts: a running job whose GPUs have all stayed under GPU_IDLE_THRESHOLD_PERCENT for
GPU_IDLE_ALERT_MINUTES is told once (JobGpuIdleAlert, one per job: its primary key decides between
concurrent checks): its submitter by e-mail, the team by its alert webhook (the budget alerts' URL,
Team.alert_webhook_url), each channel claimed by a conditional update before it sends. The idle run
must cover the whole window, so a job never alerts in its first GPU_IDLE_ALERT_MINUTES."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, Q
from django.urls import reverse
from django.utils import timezone

from accounting.services import webhook_post
from jobs.choices import JobState
from jobs.gpu_report import job_cost_so_far
from jobs.models import Job, JobGpuIdleAlert, JobGpuUsage
from portal.outbox import after_commit, publish


def gpu_idle_alerts_check(*, now: dt.datetime | None = None) -> list[JobGpuIdleAlert]:
    """Record an alert for every running job without one whose every GPU row's recorded idle run
    covers GPU_IDLE_ALERT_MINUTES up to its last sample (one grouped query: what the rows say, not the
    clock, so the sweeper may run it whenever), and deliver each after commit. Returns the new ones."""
    now = now or timezone.now()
    window = dt.timedelta(minutes=settings.GPU_IDLE_ALERT_MINUTES)
    rows = (
        JobGpuUsage.objects.filter(final=False, job__state=JobState.RUNNING, job__gpu_idle_alert__isnull=True)
        .values("job_id")
        .annotate(gpus=Count("id"), busy=Count("id", filter=Q(idle_since__isnull=True) | Q(idle_since__gt=F("last_at") - window)),
                  idle_since=Max("idle_since"))  # fmt: skip
        .filter(busy=0)
    )
    created = []
    for row in rows:
        job = Job.objects.get(pk=row["job_id"])
        cost, currency = job_cost_so_far(job, gpus=row["gpus"], now=now)
        try:
            with transaction.atomic():
                alert = JobGpuIdleAlert.objects.create(job=job, created_at=now, idle_since=row["idle_since"],
                                                       gpus=row["gpus"], cost_so_far=cost, currency=currency)  # fmt: skip
        except IntegrityError:
            continue  # another check recorded it first
        created.append(alert)
        after_commit("jobs.tasks.job_gpu_idle_alert_deliver", str(job.pk))
    return created


# a delivery not done this long after the alert was recorded has lost its task (the broker was down)
DELIVERY_SWEEP_AFTER = dt.timedelta(minutes=5)
# alerts older than this are not delivered any more (the job they describe is long over)
DELIVERY_SWEEP_WITHIN = dt.timedelta(days=1)


def gpu_idle_alerts_sweep(*, now: dt.datetime | None = None) -> dict:
    """The idle alerts' sweeper (periodic: portal/project/celery.py, gpu-idle-alert-sweep), for when
    the GPU sync that raises them died after recording its rows, or the delivery's task was lost:
    raises the alerts the recorded rows call for (``gpu_idle_alerts_check``) and enqueues again the
    deliveries owed (an e-mail to a submitter with an address, a webhook of a team with a URL) of
    alerts recorded DELIVERY_SWEEP_AFTER ago or more. The claims make a repeat send nothing twice.
    Returns figures: raised, redelivered."""
    now = now or timezone.now()
    raised = gpu_idle_alerts_check(now=now)
    owed = JobGpuIdleAlert.objects.filter(
        Q(emailed_at__isnull=True) & ~Q(job__submitter__email="")
        | Q(webhook_delivered_at__isnull=True) & ~Q(job__team__alert_webhook_url=""),
        created_at__lte=now - DELIVERY_SWEEP_AFTER, created_at__gte=now - DELIVERY_SWEEP_WITHIN,
    ).values_list("pk", flat=True)[:1000]  # fmt: skip
    ids = [str(pk) for pk in owed]
    for job_id in ids:
        publish("jobs.tasks.job_gpu_idle_alert_deliver", job_id)
    return {"raised": len(raised), "redelivered": len(ids)}


def _message(alert: JobGpuIdleAlert) -> tuple[str, str]:
    job = alert.job
    minutes = int((alert.created_at - alert.idle_since).total_seconds() // 60)
    cost = f"{alert.cost_so_far} {alert.currency}" if alert.cost_so_far is not None else "unknown (no rate)"
    subject = f"[gpuportal] {job.name}: its {alert.gpus} GPU{'s' if alert.gpus != 1 else ''} have been idle for {minutes} min"
    body = (
        f"Your job {job.name} (team {job.team.name}, Slurm job {job.slurm_job_id}) is running, but all of its "
        f"{alert.gpus} GPU(s) have stayed under {settings.GPU_IDLE_THRESHOLD_PERCENT:g} % utilisation since "
        f"{alert.idle_since:%Y-%m-%d %H:%M} UTC ({minutes} min).\n"
        f"Cost of the allocation so far: {cost}. Your team pays for these GPU-hours whether they compute or not.\n\n"
        f"Job page (GPU utilisation, cancel): /jobs/{job.pk}/\n"
        "You get this email once per job.\n"
    )
    return subject, body


def gpu_idle_alert_payload(alert: JobGpuIdleAlert) -> dict:
    job = alert.job
    return {
        "event": "job.gpus_idle", "team": job.team.slug, "job_id": str(job.pk), "slurm_job_id": job.slurm_job_id,
        "job_name": job.name, "submitter": job.submitter.username, "gpus": alert.gpus,
        "idle_since": alert.idle_since.isoformat(), "threshold_percent": settings.GPU_IDLE_THRESHOLD_PERCENT,
        "cost_so_far": str(alert.cost_so_far) if alert.cost_so_far is not None else None,
        "currency": alert.currency, "link": reverse("jobs:detail", args=[job.pk]), "at": alert.created_at.isoformat(),
    }  # fmt: skip


def gpu_idle_alert_deliver(*, job_id: str) -> dict:
    """E-mail the submitter and POST the team's webhook, each once (claimed by a conditional update;
    a failure hands the claim back and raises, the task retries). Returns what was sent."""
    sent = {"email": False, "webhook": False}
    alert = JobGpuIdleAlert.objects.select_related("job__team", "job__submitter").get(pk=job_id)
    now = timezone.now()
    if alert.job.submitter.email and JobGpuIdleAlert.objects.filter(pk=job_id, emailed_at__isnull=True).update(emailed_at=now):
        subject, body = _message(alert)
        try:
            send_mail(subject, body, None, [alert.job.submitter.email])
        except Exception:
            JobGpuIdleAlert.objects.filter(pk=job_id).update(emailed_at=None)
            raise
        sent["email"] = True
    url = alert.job.team.alert_webhook_url
    if url and JobGpuIdleAlert.objects.filter(pk=job_id, webhook_delivered_at__isnull=True).update(webhook_delivered_at=now):
        try:
            webhook_post(url=url, payload=gpu_idle_alert_payload(alert))
        except Exception as exc:
            JobGpuIdleAlert.objects.filter(pk=job_id).update(webhook_delivered_at=None, webhook_error=str(exc)[:2000])
            raise
        sent["webhook"] = True
    return sent
