"""python manage.py ingest_usage [--since DATE]: what the usage-ingest beat task does, on demand."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounting.selectors import billing_midnight
from accounting.services import usage_ingest
from portal.slurm import SlurmError


class Command(BaseCommand):
    help = "Read job accounting from Slurm (sacct, one call per window) and record GPU usage and cost."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="YYYY-MM-DD (billing time zone) or ISO datetime; default: the high-water mark.")

    def handle(self, *args, since=None, **options):
        start = None
        if since:
            try:
                if "T" in since or " " in since:
                    start = dt.datetime.fromisoformat(since)
                    if timezone.is_naive(start):
                        start = timezone.make_aware(start)
                else:
                    start = billing_midnight(dt.date.fromisoformat(since))
            except ValueError:
                raise CommandError(f"--since {since!r}: expected YYYY-MM-DD or an ISO datetime.") from None
        try:
            result = usage_ingest(since=start)
        except SlurmError as exc:
            raise CommandError(f"Slurm: {exc.message}") from exc
        self.stdout.write(
            f"{result.window_start:%Y-%m-%d %H:%M} → {result.window_end:%Y-%m-%d %H:%M} UTC in {len(result.windows)} "
            f"window(s): {result.read} allocations read, {result.started} started, {result.written} written, "
            f"{result.slices} slices, {result.seconds:.2f} s"
        )
