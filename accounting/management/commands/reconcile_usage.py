"""python manage.py reconcile_usage --month YYYY-MM: the portal's GPU-hours per Slurm account against
``sreport cluster AccountUtilizationByUser -T gres/gpu``. Exit status 1 when they differ.

sreport reads slurmdbd's hourly roll-up, so it knows finished hours only: the comparison covers the
month up to the start of the current hour (or the whole month once it is over) — the portal's slices
are cut to exactly that range. Jobs of the current hour are reported as not comparable yet."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounting.selectors import account_gpu_seconds, billing_midnight, next_month
from portal.slurm import SlurmError, get_gateway


def comparable_range(month: dt.date, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    start = billing_midnight(month)
    end = billing_midnight(next_month(month))
    rolled_up = now.replace(minute=0, second=0, microsecond=0)
    return start, min(end, rolled_up)


def differences(portal_seconds: dict[str, Decimal], sreport_minutes: dict[str, int], *, tolerance: Decimal) -> list[tuple]:
    rows = []
    for account in sorted(set(portal_seconds) | set(sreport_minutes)):
        mine = Decimal(portal_seconds.get(account, 0)) / 60
        theirs = Decimal(sreport_minutes.get(account, 0))
        if abs(mine - theirs) > tolerance:
            rows.append((account, mine, theirs))
    return rows


class Command(BaseCommand):
    help = "Compare the portal's GPU usage per account for a month with sreport; exit 1 on differences."

    def add_arguments(self, parser):
        parser.add_argument("--month", required=True, help="YYYY-MM (billing time zone)")
        parser.add_argument(
            "--tolerance-minutes", type=Decimal, default=Decimal("1"),
            help="sreport prints whole minutes: differences up to this are rounding (default 1).",
        )  # fmt: skip

    def handle(self, *args, month: str, tolerance_minutes: Decimal, **options):
        try:
            first = dt.datetime.strptime(month, "%Y-%m").date()
        except ValueError:
            raise CommandError(f"--month {month!r}: expected YYYY-MM.") from None
        start, end = comparable_range(first, timezone.now())
        if end <= start:
            self.stdout.write(f"{month}: no finished hour yet; nothing to compare.")
            return
        try:
            theirs = get_gateway().account_gpu_minutes(start, end)
        except SlurmError as exc:
            raise CommandError(f"sreport: {exc.message}") from exc
        mine = account_gpu_seconds(start_at=start, end_at=end)
        diffs = differences(mine, theirs, tolerance=tolerance_minutes)
        self.stdout.write(f"{month}: compared {start:%Y-%m-%d %H:%M} → {end:%Y-%m-%d %H:%M} ({start.tzinfo}); "
                          f"{len(set(mine) | set(theirs))} account(s)")  # fmt: skip
        for account in sorted(set(mine) | set(theirs)):
            self.stdout.write(
                f"  {account:<20} portal {Decimal(mine.get(account, 0)) / 60:>12.2f} GPU-min   sreport {theirs.get(account, 0):>10} GPU-min"
            )
        if end < billing_midnight(next_month(first)):
            self.stdout.write(f"  (hours from {end:%Y-%m-%d %H:%M} on are not rolled up by slurmdbd yet)")
        if diffs:
            for account, portal_minutes, sreport_minutes in diffs:
                self.stdout.write(
                    f"DIFFERENCE {account}: portal {portal_minutes:.2f} GPU-min, sreport {sreport_minutes} GPU-min "
                    f"({portal_minutes - sreport_minutes:+.2f})"
                )
            raise SystemExit(1)
        self.stdout.write("no differences")
