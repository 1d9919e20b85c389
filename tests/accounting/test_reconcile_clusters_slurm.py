"""``reconcile_usage`` with both local clusters served at once (issue 33 item 6): each cluster
against its own sreport (tests/accounting/test_reconcile_slurm.py: one cluster at a time)."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from accounting.selectors import billing_date, month_start
from accounting.services import usage_ingest, usage_reconcile
from tests.jobs.test_clusters_jobs import both_clusters  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def test_reconcile_usage_compares_each_of_both_real_clusters_with_its_own_sreport(both_clusters, world):
    """Issue 33 item 6: with the 22.05 and the 25.11 cluster served at once (the same team accounts on
    both), the portal holds both clusters' usage of the month, and ``reconcile_usage`` (no --cluster)
    compares each cluster's usage alone with that cluster's sreport: 0 differences on either — the
    sum over every cluster against one sreport was a false "+1.90"."""
    old, new = both_clusters
    now = timezone.now()
    month = month_start(billing_date(now))
    for name in (old, new):
        usage_ingest(cluster=name, since=dt.datetime.combine(month, dt.time(), tzinfo=dt.UTC))
    results = usage_reconcile(month=month, now=now)
    assert [r.cluster for r in results] == [old, new]
    print(f"\n[reconcile per cluster, {month:%Y-%m}]")
    for result in results:
        print(f"  {result.cluster}: {result.start:%m-%d %H:%M} → {result.end:%m-%d %H:%M} UTC, "
              f"{len(result.accounts)} accounts, {len(result.differences)} differences{'; ' + result.stale if result.stale else ''}")  # fmt: skip
        for account in result.accounts:
            print(f"    {account:<12} portal {Decimal(result.portal.get(account, 0)) / 60:>10.2f} GPU-min  "
                  f"sreport {result.sreport.get(account, 0):>6} GPU-min")  # fmt: skip
        assert result.differences == [], result
    shared = set(results[0].portal) & set(results[1].portal)  # accounts both clusters charged: what the old sum got wrong
    print(f"  accounts with usage on both clusters in the compared hours: {sorted(shared)}")
    out = io.StringIO()
    call_command("reconcile_usage", "--month", f"{month:%Y-%m}", stdout=out)  # exit 1 (SystemExit) on a difference
    assert "DIFFERENCE" not in out.getvalue() and out.getvalue().rstrip().endswith("no differences")
    idle = [f"{r.cluster}: {r.stale or 'no rolled-up hour yet'}" for r in results if r.end <= r.start]
    if idle:  # a cluster started this hour has nothing sreport can answer for yet (scripts/cluster status)
        pytest.skip(f"not compared (nothing rolled up this month): {'; '.join(idle)}")
