"""manage.py gpu_samples_compact: turn the legacy raw GPU points (JobGpuSample, one row per GPU and
minute before issue 39) into one JobGpuSummary per ended job, then delete them, in batches: safe on a
live database (short statements, no table lock, no rewrite); stop it and run it again at will."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from jobs.services import gpu_samples_compact_batch


class Command(BaseCommand):
    help = "Compact the legacy GPU sample rows into one summary per ended job, then delete them (batches, live-safe)."

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=int, default=200, help="jobs summarised per batch (default 200)")
        parser.add_argument("--rows", type=int, default=10_000, help="sample rows deleted per batch (default 10 000)")
        parser.add_argument("--pause", type=float, default=0.0, help="seconds between batches (spare a busy database)")

    def handle(self, *args, jobs: int, rows: int, pause: float, **options):
        totals = {"summaries": 0, "deleted": 0}
        while True:
            done = gpu_samples_compact_batch(jobs=max(1, jobs), rows=max(1, rows))
            if not done["summaries"] and not done["deleted"]:
                break
            totals = {k: totals[k] + done[k] for k in totals}
            if pause:
                time.sleep(pause)
        self.stdout.write(f"{totals['summaries']} job summaries written, {totals['deleted']} sample rows deleted")
