"""Demo data for accounting (``python manage.py seed_demo``): GPU prices. Idempotent."""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal

from django.conf import settings

from accounting.models import Rate
from accounting.services import rate_create

DEMO_RATES = (
    ("a100", "", Decimal("8"), dt.date(2026, 1, 1), "demo price"),
    ("h100", "", Decimal("16"), dt.date(2026, 1, 1), "demo price"),
)


def seed(stdout=None) -> None:
    out = stdout or sys.stdout
    for gpu_type, partition, price, since, note in DEMO_RATES:
        if Rate.objects.filter(gpu_type=gpu_type, partition=partition, effective_from=since).exists():
            out.write(f"rate {gpu_type} from {since}: exists\n")
            continue
        rate_create(gpu_type=gpu_type, partition=partition, price_per_gpu_hour=price, effective_from=since,
                    currency=settings.DEFAULT_CURRENCY, note=note)  # fmt: skip
        out.write(f"rate {gpu_type} from {since}: {price} {settings.DEFAULT_CURRENCY}/GPU-h\n")
    seed_quotas(out)


# (team, gpu_type, GPU-hours, max GPUs at once) for this month and the next; requested by the team's
# manager and approved by the demo admin, so the demo's jobs pass the budget check (blocked policy)
DEMO_QUOTAS = (
    ("vision", "", Decimal("2000"), None),
    ("vision", "a100", Decimal("1200"), None),
    ("nlp", "", Decimal("1500"), 8),
)


def seed_quotas(out) -> None:
    from django.contrib.auth import get_user_model

    from accounting.calendar import current_month, next_month
    from accounting.models import Quota, QuotaState
    from accounting.services import quota_approve, quota_request
    from portal.models import Membership, Role, Team

    admin = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    this_month, next_start = current_month()
    for slug, gpu_type, hours, cap in DEMO_QUOTAS:
        team = Team.objects.filter(slug=slug).first()
        manager = Membership.objects.filter(team=team, role=Role.MANAGER).select_related("user").first() if team else None
        if team is None or manager is None or admin is None:
            out.write(f"quota {slug}: team, manager or admin missing, skipped\n")
            continue
        for start in (this_month, next_start):
            label = f"quota {slug} {gpu_type or 'any'} {start:%Y-%m}"
            if Quota.objects.filter(team=team, gpu_type=gpu_type, period_start=start, state=QuotaState.APPROVED).exists():
                out.write(f"{label}: exists\n")
                continue
            quota = quota_request(team=team, user=manager.user, gpu_hours=hours, gpu_type=gpu_type, max_gpus=cap,
                                  period_start=start, period_end=next_month(start), justification="demo quota")  # fmt: skip
            quota_approve(quota=quota, user=admin, comment="demo")
            out.write(f"{label}: {hours} GPU-h approved\n")
