"""Budget alerts: a BudgetAlert per quota and threshold (80 %, 100 % of the budget consumed),
recorded after each usage ingest and delivered once by e-mail to the team's managers and by webhook.
Each channel is claimed before it sends and has its sweeper: ``budget_alert_sweep`` (e-mails not
sent) and ``budget_alert_webhook_sweep`` (webhooks owed after the e-mail went)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.request
from decimal import Decimal

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from accounting.models import BudgetAlert
from accounting.selectors.budgets import budget_rows, quotas_effective
from accounting.services.budget import QUOTA_PAGE
from portal import money
from portal.models import Team
from portal.outbox import after_commit, publish
from portal.roles import team_manager_emails
from portal.services import audit_record

logger = logging.getLogger(__name__)

QUOTA_ALERT_THRESHOLDS = (80, 100)


def budget_alerts_check(*, team: Team | None = None, at: dt.datetime | None = None) -> list:
    """Record a BudgetAlert for each quota in force whose consumption (used + booked: what is really
    spent, not what unfinished jobs hold) reached 80 % / 100 % of its budget, once per (quota,
    threshold) — the unique constraint decides between concurrent checks — and deliver it (email to
    the team's managers, webhook) after commit. Called after every usage ingest. Returns new alerts."""
    quotas = list(quotas_effective(team=team, at=at).values())
    if not quotas:
        return []
    existing = set(BudgetAlert.objects.filter(quota__in=quotas).values_list("quota_id", "threshold"))
    created = []
    for row in budget_rows(quotas, at=at, with_held=False):
        budget = Decimal(row["budget"])
        if budget <= 0:
            continue
        for threshold in QUOTA_ALERT_THRESHOLDS:
            if row["consumed"] * 100 < budget * threshold or (row["quota"].pk, threshold) in existing:
                continue
            try:
                with transaction.atomic():
                    alert = BudgetAlert.objects.create(
                        quota=row["quota"], threshold=threshold, consumed_gpu_hours=money.display(row["consumed"]),
                        budget_gpu_hours=budget,
                    )  # fmt: skip
                    audit_record(actor=None, action="quota.alert", target=row["quota"], team=row["team"],
                                 data={"threshold": threshold, "consumed": str(alert.consumed_gpu_hours)})  # fmt: skip
            except IntegrityError:
                continue  # another check recorded it first
            created.append(alert)
            after_commit("accounting.tasks.budget_alert_deliver_task", alert.pk)
    return created


def budget_alert_payload(alert) -> dict:
    quota = alert.quota
    return {
        "event": "budget.threshold",
        "team": quota.team.slug,
        "gpu_type": quota.gpu_type,
        "period": quota.period_label,
        "period_start": quota.period_start.isoformat(),
        "period_end": quota.period_end.isoformat(),
        "threshold_percent": alert.threshold,
        "budget_gpu_hours": str(alert.budget_gpu_hours),
        "consumed_gpu_hours": str(alert.consumed_gpu_hours),
        "quota_id": quota.pk,
        "at": alert.created_at.isoformat(),
    }


ALERT_SWEEP_AFTER = dt.timedelta(minutes=5)
ALERT_SWEEP_WITHIN = dt.timedelta(days=7)


def budget_alert_sweep(*, now: dt.datetime | None = None) -> list[int]:
    """The sweeper of budget_alert_deliver_task: alerts of the last week not e-mailed five minutes
    after they were recorded are enqueued again (budget_alert_email claims each once)."""
    now = now or timezone.now()
    ids = list(
        BudgetAlert.objects.filter(
            emailed_at__isnull=True, created_at__lt=now - ALERT_SWEEP_AFTER, created_at__gte=now - ALERT_SWEEP_WITHIN
        ).values_list("pk", flat=True)[:1000]
    )
    for alert_id in ids:
        publish("accounting.tasks.budget_alert_deliver_task", alert_id)
    return ids


def budget_alert_email(*, alert_id: int) -> bool:
    """Email the team's managers once (claimed by a conditional update). Returns True when sent."""
    if BudgetAlert.objects.filter(pk=alert_id, emailed_at__isnull=True).update(emailed_at=timezone.now()) != 1:
        return False
    alert = BudgetAlert.objects.select_related("quota__team").get(pk=alert_id)
    quota, team = alert.quota, alert.quota.team
    recipients = team_manager_emails(team)
    if not recipients:
        return False
    kind = f"{quota.gpu_type} " if quota.gpu_type else ""
    subject = f"[gpuportal] {team.slug} reached {alert.threshold}% of its {kind}GPU budget for {quota.period_label}"
    body = (
        f"Team {team.name} has consumed {alert.consumed_gpu_hours} of its {alert.budget_gpu_hours} {kind}GPU-hours "
        f"for {quota.period_label} ({alert.threshold}% threshold).\n\n"
        f"Budget page: {reverse('accounting:budget')}?team={team.slug}\nRequest more: {QUOTA_PAGE}\n"
    )
    try:
        send_mail(subject, body, None, recipients)
    except Exception:
        BudgetAlert.objects.filter(pk=alert_id).update(emailed_at=None)  # let a retry send it
        raise
    return True


# A webhook POST claimed longer ago than this is a dead worker's (the task's hard time limit is 60 s):
# the sweep and the retry may claim it again.
WEBHOOK_LEASE = dt.timedelta(minutes=5)
# POSTs of one alert at the most, whoever makes them (the task's first try and its 6 retries; a sweep
# that re-enqueues an alert whose task was lost spends what that task left).
WEBHOOK_ATTEMPTS = 7


def _webhook_owed(now: dt.datetime) -> Q:
    """Alerts whose webhook is owed and free to claim: not delivered, attempts left, no live claim."""
    return Q(webhook_delivered_at__isnull=True, webhook_attempts__lt=WEBHOOK_ATTEMPTS) & (
        Q(webhook_claimed_at__isnull=True) | Q(webhook_claimed_at__lt=now - WEBHOOK_LEASE)
    )


def webhook_post(*, url: str, payload: dict) -> None:
    """POST ``payload`` as JSON to a team's alert webhook (Team.alert_webhook_url, an http(s) URLField):
    the one way the portal calls it (budget alerts, idle-GPU alerts). Raises on any failure."""
    data = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json",
                                                                          "User-Agent": "gpuportal"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as response:
        response.read(1024)


def budget_alert_webhook(*, alert_id: int) -> bool:
    """POST the alert as JSON to the team's alert_webhook_url (if any), once: claimed first by a
    conditional update (``webhook_claimed_at``, one of WEBHOOK_ATTEMPTS), so the sweep's repeat and
    the task never both send. Raises on failure (the claim is handed back, the error recorded; the
    task retries with backoff). Returns True when this call delivered it."""
    alert = BudgetAlert.objects.select_related("quota__team").get(pk=alert_id)
    url = alert.quota.team.alert_webhook_url
    now = timezone.now()
    if not url or not BudgetAlert.objects.filter(_webhook_owed(now), pk=alert_id).update(
        webhook_claimed_at=now, webhook_attempts=F("webhook_attempts") + 1
    ):
        return False
    mine = BudgetAlert.objects.filter(pk=alert_id, webhook_claimed_at=now)
    try:
        webhook_post(url=url, payload=budget_alert_payload(alert))
    except Exception as exc:
        mine.update(webhook_claimed_at=None, webhook_error=str(exc)[:2000])  # let a retry send it
        raise
    mine.update(webhook_delivered_at=timezone.now(), webhook_error="")
    return True


def budget_alert_webhook_sweep(*, now: dt.datetime | None = None) -> list[int]:
    """The sweeper of budget_alert_webhook_task: alerts of the last week e-mailed five minutes ago or
    more (the e-mail's task hands the webhook on; the alert sweep covers alerts not e-mailed) whose
    team has a webhook that is still owed (``_webhook_owed``) are enqueued again."""
    now = now or timezone.now()
    ids = list(
        BudgetAlert.objects.filter(
            _webhook_owed(now), emailed_at__lt=now - ALERT_SWEEP_AFTER, created_at__gte=now - ALERT_SWEEP_WITHIN
        )
        .exclude(quota__team__alert_webhook_url="")
        .values_list("pk", flat=True)[:1000]
    )
    for alert_id in ids:
        publish("accounting.tasks.budget_alert_webhook_task", alert_id)
    return ids
