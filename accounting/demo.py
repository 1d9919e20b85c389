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
