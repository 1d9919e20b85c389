"""python manage.py ingest_usage [--since DATE] [--cluster NAME]: what the usage-ingest beat tasks do
(one per cluster), on demand: every configured cluster, or the one named."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounting.selectors import billing_midnight
from accounting.services import usage_ingest
from portal.management.clusters import cluster_names, for_each_cluster


class Command(BaseCommand):
    help = "Read job accounting from Slurm (sacct, one call per window) and record GPU usage and cost."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="YYYY-MM-DD (billing time zone) or ISO datetime; default: the high-water mark.")
        parser.add_argument("--cluster", default="", help="Only this cluster (a name of GPUPORTAL_CLUSTERS); default: every one.")

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
        names = cluster_names(options.get("cluster") or "")

        def ingest(name: str) -> None:
            self._report(name if len(names) > 1 else "", usage_ingest(cluster=name, since=start))

        failed = for_each_cluster(self, names, ingest)
        if failed:
            raise CommandError(f"Slurm: {', '.join(failed)} not read" + (" (the others were)" if len(failed) < len(names) else ""))

    def _report(self, name: str, result) -> None:
        self.stdout.write(
            (f"{name}: " if name else "")
            + f"{result.window_start:%Y-%m-%d %H:%M} → {result.window_end:%Y-%m-%d %H:%M} UTC in {len(result.windows)} "
            f"window(s): {result.read} allocations read, {result.started} started, {result.written} written, "
            f"{result.slices} slices, {result.seconds:.2f} s"
        )
