"""Idle-GPU alerts: a running job whose GPUs have all stayed under GPU_IDLE_THRESHOLD_PERCENT for
GPU_IDLE_ALERT_MINUTES is told once (JobGpuIdleAlert, one per job: its primary key decides between
concurrent checks): its submitter by e-mail, the team by its alert webhook (the budget alerts' URL,
Team.alert_webhook_url), each channel claimed by a conditional update before it sends. The idle run
must cover the whole window, so a job never alerts in its first GPU_IDLE_ALERT_MINUTES.

A team's idle-GPU policy (portal.models.TeamIdlePolicy, issue 40 item 3) changes that for its jobs not
submitted exempt: its threshold decides which samples are idle (jobs.services.gpu_usage folds them
with it), the alert comes after its ``warn`` delay and is a warning with a deadline (``cancel_at``),
re-armed by a new idle run, and a job still idle at the deadline is cancelled through the relay
(jobs.services.cancel.job_idle_cancel)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Min, Q
from django.urls import reverse
from django.utils import timezone

from accounting.services import webhook_post
from jobs.choices import JobState
from jobs.gpu_report import job_cost_so_far
from jobs.models import Job, JobEvent, JobGpuIdleAlert, JobGpuUsage
from portal.idle_policy import IdlePolicy
from portal.outbox import after_commit, publish


def job_idle_policies(job_ids) -> dict:
    """{job pk: IdlePolicy} for the jobs of ``job_ids`` under their team's idle-GPU policy (enabled, the
    job not exempt), as it applies now (clamped into the admin's bounds). One query."""
    rows = Job.objects.filter(pk__in=list(job_ids), idle_exempt=False, team__idle_policy__enabled=True).values_list(
        "pk", "team__idle_policy__threshold_percent", "team__idle_policy__warn_minutes", "team__idle_policy__cancel_minutes"
    )
    return {pk: IdlePolicy.effective(threshold_percent=t, warn_minutes=w, cancel_minutes=c) for pk, t, w, c in rows}


_POLICY = "job__team__idle_policy__"


def _idle_jobs():
    """Every running job whose GPU rows all end in an idle run, with how long the shortest has lasted
    (``idle_for``), since when all idle (``all_idle_since``), its team's policy and its alert: the jobs
    without an alert, and those under a policy (warned ones too: their cancel is due). One grouped query."""
    under_policy = Q(job__idle_exempt=False, **{f"{_POLICY}enabled": True})
    return (
        JobGpuUsage.objects.filter(final=False, job__state=JobState.RUNNING)
        .filter(Q(job__gpu_idle_alert__isnull=True) | under_policy)
        .values("job_id", "job__idle_exempt", f"{_POLICY}enabled", f"{_POLICY}threshold_percent", f"{_POLICY}warn_minutes",
                f"{_POLICY}cancel_minutes", "job__gpu_idle_alert__created_at", "job__gpu_idle_alert__cancel_at")
        .annotate(gpus=Count("id"), not_idle=Count("id", filter=Q(idle_since__isnull=True)),
                  idle_for=Min(ExpressionWrapper(F("last_at") - F("idle_since"), output_field=DurationField())),
                  all_idle_since=Max("idle_since"))
        .filter(not_idle=0)
        .order_by()
    )  # fmt: skip


def _policy_of(row) -> IdlePolicy | None:
    if not row[f"{_POLICY}enabled"] or row["job__idle_exempt"]:
        return None
    return IdlePolicy.effective(threshold_percent=row[f"{_POLICY}threshold_percent"], warn_minutes=row[f"{_POLICY}warn_minutes"],
                                cancel_minutes=row[f"{_POLICY}cancel_minutes"])  # fmt: skip


def gpu_idle_alerts_check(*, now: dt.datetime | None = None) -> list[JobGpuIdleAlert]:
    """The idle GPUs' alerts and the teams' idle-GPU policies, from what the rows say (not the clock,
    so the sweeper may run it whenever; one grouped query, ``_idle_jobs``):

    - a job without an alert whose every GPU has idled GPU_IDLE_ALERT_MINUTES (under a policy: its
      ``warn`` delay) is alerted once; under a policy the alert is the warning and carries when the
      job is cancelled (``cancel_at`` = now + the policy's ``cancel`` delay);
    - a warned job (policy) whose GPUs got busy and idled again since, or alerted before its team's
      policy applied, is warned again (the alert re-armed, delivered anew);
    - a warned job whose GPUs stayed idle since the warning is cancelled at ``cancel_at``
      (jobs.services.cancel.job_idle_cancel).

    Deliveries go after commit. Returns the alerts raised or re-armed."""
    from jobs.services.cancel import job_idle_cancel

    now = now or timezone.now()
    raised = []
    for row in _idle_jobs():
        policy = _policy_of(row)
        window = policy.warn if policy else dt.timedelta(minutes=settings.GPU_IDLE_ALERT_MINUTES)
        if row["idle_for"] < window:
            continue
        warned_at, cancel_at = row["job__gpu_idle_alert__created_at"], row["job__gpu_idle_alert__cancel_at"]
        if warned_at is None or (policy and (cancel_at is None or row["all_idle_since"] > warned_at)):
            alert = _alert_raise(row, policy=policy, now=now, replaces=warned_at)
            if alert is not None:
                raised.append(alert)
        elif policy and cancel_at <= now:
            job_idle_cancel(job_id=row["job_id"], gpus=row["gpus"], idle_since=row["all_idle_since"],
                            threshold_percent=policy.threshold_percent, now=now)  # fmt: skip
    return raised


def _alert_raise(row, *, policy: IdlePolicy | None, now: dt.datetime, replaces: dt.datetime | None) -> JobGpuIdleAlert | None:
    """Record the alert of ``row``'s job (``replaces``: the time of the alert it re-arms, which must be
    unchanged: the conditional update decides between concurrent checks; None: a new one, which the
    primary key decides), its history event under a policy, and its delivery after commit."""
    job = Job.objects.get(pk=row["job_id"])
    cost, currency = job_cost_so_far(job, gpus=row["gpus"], now=now)
    values = {"created_at": now, "idle_since": row["all_idle_since"], "gpus": row["gpus"], "cost_so_far": cost, "currency": currency,
              "threshold_percent": policy.threshold_percent if policy else None,
              "cancel_at": now + policy.cancel if policy else None}  # fmt: skip
    try:
        with transaction.atomic():
            if replaces is None:
                JobGpuIdleAlert.objects.create(job=job, **values)
            elif not JobGpuIdleAlert.objects.filter(pk=job.pk, created_at=replaces).update(
                **values, emailed_at=None, webhook_delivered_at=None, webhook_error=""
            ):
                return None  # another check re-armed it first
            if policy:
                JobEvent.objects.create(job=job, state=job.state, at=now, reason=(
                    f"Warned: all {row['gpus']} GPUs under {policy.threshold_percent:g} % since {row['all_idle_since']:%Y-%m-%d %H:%M} UTC; "
                    f"the team's idle-GPU policy cancels it at {values['cancel_at']:%Y-%m-%d %H:%M:%S} UTC unless a GPU gets busy"))  # fmt: skip
    except IntegrityError:
        return None  # another check recorded it first
    after_commit("jobs.tasks.job_gpu_idle_alert_deliver", str(job.pk))
    return JobGpuIdleAlert.objects.get(pk=job.pk)


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


def _threshold(alert: JobGpuIdleAlert) -> float:
    return alert.threshold_percent if alert.threshold_percent is not None else settings.GPU_IDLE_THRESHOLD_PERCENT


def _message(alert: JobGpuIdleAlert) -> tuple[str, str]:
    job = alert.job
    minutes = int((alert.created_at - alert.idle_since).total_seconds() // 60)
    cost = f"{alert.cost_so_far} {alert.currency}" if alert.cost_so_far is not None else "unknown (no rate)"
    subject = f"[gpuportal] {job.name}: its {alert.gpus} GPU{'s' if alert.gpus != 1 else ''} have been idle for {minutes} min"
    if alert.cancel_at is not None:
        subject += f" — cancelled at {alert.cancel_at:%H:%M} UTC unless they get busy"
    body = (
        f"Your job {job.name} (team {job.team.name}, Slurm job {job.slurm_job_id}) is running, but all of its "
        f"{alert.gpus} GPU(s) have stayed under {_threshold(alert):g} % utilisation since "
        f"{alert.idle_since:%Y-%m-%d %H:%M} UTC ({minutes} min).\n"
        f"Cost of the allocation so far: {cost}. Your team pays for these GPU-hours whether they compute or not.\n"
    )
    if alert.cancel_at is not None:
        body += (
            f"Your team's idle-GPU policy cancels the job at {alert.cancel_at:%Y-%m-%d %H:%M:%S} UTC unless one of its GPUs "
            f"goes above {_threshold(alert):g} % before then (a job submitted as exempt from the policy is never cancelled).\n"
        )
    body += (
        f"\nJob page (GPU utilisation, cancel): /jobs/{job.pk}/\n"
        + ("You get this email once per idle spell.\n" if alert.cancel_at is not None else "You get this email once per job.\n")
    )
    return subject, body


def gpu_idle_alert_payload(alert: JobGpuIdleAlert) -> dict:
    job = alert.job
    return {
        "event": "job.gpus_idle", "team": job.team.slug, "job_id": str(job.pk), "slurm_job_id": job.slurm_job_id,
        "job_name": job.name, "submitter": job.submitter.username, "gpus": alert.gpus,
        "idle_since": alert.idle_since.isoformat(), "threshold_percent": _threshold(alert),
        "cancel_at": alert.cancel_at.isoformat() if alert.cancel_at else None,
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
