"""PDF invoice benchmark: how long WeasyPrint takes to render the HTML invoice as a PDF, and how big
the file is, for invoices of 10, 100 and 1 000 lines (team 视觉组, names in several scripts). Needs
no database: the invoice's figures are made up in memory. Prints figures; no thresholds.

    .venv/bin/python bench/bench_invoice_pdf.py [--runs 5] [--lines 10,100,1000]"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")

NAMES = ["Łódź-resnet50-finetune", "视觉组-检测模型-训练", "bert-large-pretrain-ablation-17", "Ünïcødé-sweep"]


def invoice_data(lines: int) -> dict:
    from portal.models import Team

    team = Team(slug="vision", name="视觉组", slurm_account="vision")
    start = dt.datetime(2026, 1, 1, 8, tzinfo=dt.timezone.utc)
    rows = []
    for i in range(lines):
        begin = start + dt.timedelta(minutes=37 * i)
        rows.append({
            "job_id": 100000 + i, "name": NAMES[i % len(NAMES)], "user": f"user{i % 40:03d}", "partition": "gpu",
            "state": "COMPLETED", "gpu_type": "a100", "gpus": 1 + i % 4, "start": begin, "end": begin + dt.timedelta(hours=2),
            "gpu_hours": Decimal("2.00") * (1 + i % 4), "price": Decimal("8.00"), "cost": Decimal("16.00") * (1 + i % 4),
            "provisional": False, "portal_job_uuid": None,
        })  # fmt: skip
    total = sum((r["cost"] for r in rows), Decimal(0))
    hours = sum((r["gpu_hours"] for r in rows), Decimal(0))
    return {
        "team": team, "month": dt.date(2026, 1, 1), "period_end": dt.date(2026, 1, 31), "lines": rows,
        "summary": [{"gpu_type": "a100", "price": Decimal("8.00"), "gpu_hours": hours, "cost": total}],
        "gpu_hours": hours, "usage_cost": total, "bookings": [], "bookings_cost": Decimal(0),
        "booking_charge_mode": "reserved", "total": total, "provisional": False, "currency": "CNY",
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", default="10,100,1000")
    args = parser.parse_args()
    import django

    django.setup()
    from accounting.invoices import invoice_pdf

    started = time.perf_counter()
    invoice_pdf(invoice_data(1))  # loads WeasyPrint, Pango and the fonts once
    print(f"first PDF of the process (WeasyPrint import, font loading): {time.perf_counter() - started:.2f} s")
    for lines in (int(n) for n in args.lines.split(",")):
        data = invoice_data(lines)
        times, size = [], 0
        for _ in range(args.runs):
            t0 = time.perf_counter()
            size = len(invoice_pdf(data))
            times.append(time.perf_counter() - t0)
        print(f"invoice of {lines:>5} lines: median {statistics.median(times):.2f} s over {args.runs} runs, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
