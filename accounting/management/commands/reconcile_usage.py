"""python manage.py reconcile_usage --month YYYY-MM [--cluster NAME ...]: the portal's GPU-hours per
Slurm account against each cluster's own ``sreport cluster AccountUtilizationByUser -T gres/gpu``.
Exit status 1 when they differ.

sreport reads slurmdbd's hourly roll-up, so it knows rolled-up hours only: each cluster is compared
over the month up to the last hour its slurmdbd has rolled up, read from that cluster
(accounting.services.usage_reconcile). A roll-up that is late is said as such ("sreport has not rolled
up since …"), and is not a difference; the hours after it are not compared."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from accounting.calendar import billing_midnight, next_month
from accounting.services import kubernetes_usage_reconcile, usage_reconcile
from portal.slurm import SlurmError, configured_clusters


class Command(BaseCommand):
    help = "Compare the portal's GPU usage per account for a month with each cluster's sreport; exit 1 on differences."

    def add_arguments(self, parser):
        parser.add_argument("--month", required=True, help="YYYY-MM (billing time zone)")
        parser.add_argument("--cluster", action="append", default=None,
                            help="compare this cluster only (repeatable; default: every configured cluster)")  # fmt: skip
        parser.add_argument(
            "--tolerance-minutes", type=Decimal, default=Decimal("1"),
            help="sreport prints whole minutes: differences up to this are rounding (default 1).",
        )  # fmt: skip

    def handle(self, *args, month: str, cluster: list[str] | None, tolerance_minutes: Decimal, **options):
        try:
            first = dt.datetime.strptime(month, "%Y-%m").date()
        except ValueError:
            raise CommandError(f"--month {month!r}: expected YYYY-MM.") from None
        known = {config.name for config in configured_clusters()}
        for name in cluster or ():
            if name not in known:
                raise CommandError(f"--cluster {name!r}: not a configured cluster ({', '.join(sorted(known))}).")
        try:
            results = usage_reconcile(month=first, clusters=cluster, tolerance=tolerance_minutes)
        except SlurmError as exc:
            raise CommandError(f"sreport: {exc.message}") from exc
        found = False
        for result in results:
            if result.end <= result.start:
                self.stdout.write(f"{month} {result.cluster}: no rolled-up hour to compare yet.")
            else:
                self.stdout.write(
                    f"{month} {result.cluster}: compared {result.start:%Y-%m-%d %H:%M} → {result.end:%Y-%m-%d %H:%M} "
                    f"({result.start.tzinfo}); {len(result.accounts)} account(s)"
                )
            for account in result.accounts:
                portal_minutes = Decimal(result.portal.get(account, 0)) / 60
                self.stdout.write(
                    f"  {account:<20} portal {portal_minutes:>12.2f} GPU-min   sreport {result.sreport.get(account, 0):>10} GPU-min"
                )
            if result.stale:
                after = "; the hours after it are not compared" if result.end > result.start else ""
                self.stdout.write(f"  STALE ROLL-UP: {result.stale}{after}")
            for account, portal_minutes, sreport_minutes in result.differences:
                found = True
                self.stdout.write(
                    f"DIFFERENCE {result.cluster} {account}: portal {portal_minutes:.2f} GPU-min, "
                    f"sreport {sreport_minutes} GPU-min ({portal_minutes - sreport_minutes:+.2f})"
                )
        # a Kubernetes cluster has no sreport: its ended Jobs against the API's own records (issue 41)
        kubernetes = [c.name for c in configured_clusters() if c.is_kubernetes and (not cluster or c.name in cluster)]
        begin, end = billing_midnight(first), billing_midnight(next_month(first))
        for name in kubernetes:
            try:
                lines = kubernetes_usage_reconcile(cluster=name, since=begin, until=end)
            except SlurmError as exc:
                raise CommandError(f"{name}: {exc.message}") from exc
            self.stdout.write(f"{month} {name}: the ended Jobs the Kubernetes API holds against their usage records")
            for line in lines:
                found = True
                self.stdout.write(f"DIFFERENCE {line}")
        if found:
            raise SystemExit(1)
        self.stdout.write("no differences")
