"""The closed months' totals (accounting.services.usage_rollup): reports and invoices read them for
whole closed months and give what the slices give, to the cent and below (the exact sums compared),
a late record included; a busy month's invoice lists users × GPU types × rates and gives its jobs
as a CSV; deleting a job's detail leaves a rolled month's invoice and report as they were."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from accounting.invoices import invoice
from accounting.models import Rate, UsageMonth, UsageMonthTotal, UsageRecord, UsageSlice
from accounting.reports import report_page_data
from accounting.selectors import GROUP_BY_CHOICES, cost_report
from accounting.services import usage_records_upsert, usage_rollup
from tests.accounting.helpers import acct, at

pytestmark = pytest.mark.django_db

JANUARY, FEBRUARY = dt.date(2026, 1, 1), dt.date(2026, 2, 1)
CLOSED = at(2026, 3, 10, 12)  # January and February are closed (USAGE_MONTH_CLOSE_DAYS after their end)
RANGES = {  # (start, end) inclusive days: whole months, and a range that cuts January
    "january": (JANUARY, dt.date(2026, 1, 31)),
    "both": (JANUARY, dt.date(2026, 2, 28)),
    "cut": (dt.date(2026, 1, 15), dt.date(2026, 2, 28)),
}


@pytest.fixture
def usage(world, settings):
    """Two teams, three users, two GPU types, a price change on 20 January, a job across the month
    boundary, short jobs of odd seconds (costs of six places), GPU monitoring on some."""
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("9.3333"), effective_from=dt.date(2026, 1, 20))
    Rate.objects.create(gpu_type="h100", price_per_gpu_hour=Decimal("16"), effective_from=dt.date(2025, 1, 1))
    records = [acct(account="vision", user="alice", start=at(2026, 1, 1 + i % 28, i % 24, 7), hours=(i * 137 % 5000 + 13) / 3600,
                    gpus=1 + i % 3, job_id=100 + i) for i in range(60)]  # fmt: skip
    records += [acct(account="vision", user="bob", gpu_type="h100", start=at(2026, 1, 19, 20), hours=9, gpus=2, job_id=300),  # across the price change
                acct(account="nlp", user="carol", start=at(2026, 1, 31, 22, 30), hours=5.25, gpus=4, job_id=301),  # into February
                acct(account="nlp", user="carol", gpu_type="h100", start=at(2026, 2, 14, 3), hours=2 / 3, job_id=302)]  # fmt: skip
    usage_records_upsert(records=records)
    UsageRecord.objects.filter(job_id__in=[100, 101, 102, 300]).update(gpu_busy_fraction=Decimal("0.437211"))
    return world


def _everything(world) -> dict:
    out = {(name, g): cost_report(start=a, end=b, group_by=g) for name, (a, b) in RANGES.items() for g in GROUP_BY_CHOICES}
    out |= {(name, "team", slug): cost_report(start=a, end=b, group_by="user", team=team)
            for name, (a, b) in RANGES.items() for slug, team in (("vision", world.vision), ("nlp", world.nlp))}  # fmt: skip
    out |= {("invoice", team.slug, m): invoice(team=team, month=m) for team in (world.vision, world.nlp) for m in (JANUARY, FEBRUARY)}
    page = report_page_data(start_at=at(2026, 1, 1), end_at=at(2026, 3, 1))
    out["page"] = {k: page[k] for k in ("by_team", "by_user", "by_type", "by_month", "totals", "chart")}
    return out


def _from_slices(world) -> dict:
    """What the reports say with every month read from its slices (the roll-up set aside, rolled back)."""
    with transaction.atomic():
        UsageMonth.objects.update(stale=True)
        figures = _everything(world)
        transaction.set_rollback(True)
    return figures


def _slice_queries(queries) -> list[str]:
    return [q["sql"] for q in queries if UsageSlice._meta.db_table in q["sql"]]


def test_the_months_totals_are_the_sums_of_their_slices_exactly(usage):
    assert usage_rollup(now=CLOSED) == [JANUARY, FEBRUARY]
    for month in (JANUARY, FEBRUARY):
        slices = UsageSlice.objects.filter(period=month).aggregate(s=Sum("gpu_seconds"), c=Sum("cost"), r=Sum("requested_gpu_seconds"))
        totals = UsageMonthTotal.objects.filter(period=month).aggregate(s=Sum("gpu_seconds"), c=Sum("cost"), r=Sum("requested_gpu_seconds"))
        assert totals == slices and slices["c"] != slices["c"].quantize(Decimal("0.01"))  # six places, none lost
        assert UsageMonth.objects.get(period=month).slices == UsageSlice.objects.filter(period=month).count()


def test_reports_and_invoices_read_the_totals_and_say_what_the_slices_say_a_late_record_included(usage):
    before = _everything(usage)
    assert usage_rollup(now=CLOSED) == [JANUARY, FEBRUARY]
    with CaptureQueriesContext(connection) as queries:
        rolled = _everything(usage)
    assert rolled == before
    # whole closed months come from the totals; only the range that cuts January reads slices
    whole = [q for q in _slice_queries(queries.captured_queries) if "2026-01-15" not in q]
    assert whole and all('ORDER BY "accounting_usageslice"."slice_start"' in q for q in whole)  # the invoices' per-job lines alone

    # a late record of January, ingested in March: January is re-opened, read from its slices until rolled again
    usage_records_upsert(records=[acct(account="vision", user="dave", start=at(2026, 1, 30, 1), hours=3.5, gpus=8, job_id=999)])
    assert UsageMonth.objects.get(period=JANUARY).stale and not UsageMonth.objects.get(period=FEBRUARY).stale
    late = _from_slices(usage)
    assert late != before  # the late record changed January (and the range totals)
    assert _everything(usage) == late  # January from slices, February from its totals
    assert usage_rollup(now=CLOSED) == [JANUARY]
    month = UsageMonth.objects.get(period=JANUARY)
    assert not month.stale and month.revised_at == CLOSED
    assert _everything(usage) == late


def test_a_job_running_across_a_month_end_leaves_the_closed_month_rolled_while_it_runs(usage):
    """Ingestion re-reads a running job every cycle and rebuilds its slices: the month it started in
    is re-opened only when its slices there changed, not on every ingestion (issue 39)."""
    usage_rollup(now=CLOSED)
    running = acct(account="nlp", user="carol", start=at(2026, 1, 31, 23, 30), hours=None, job_id=777)
    usage_records_upsert(records=[running])  # a new record reaching back into both closed months
    assert set(UsageMonth.objects.filter(stale=True).values_list("period", flat=True)) == {JANUARY, FEBRUARY}
    assert usage_rollup(now=CLOSED) == [JANUARY, FEBRUARY]

    usage_records_upsert(records=[running])  # the same again: nothing changed anywhere
    assert not UsageMonth.objects.filter(stale=True).exists()
    later = dataclasses.replace(running, elapsed_seconds=2 * 3600)  # an hour later: only February grew
    usage_records_upsert(records=[later])
    assert list(UsageMonth.objects.filter(stale=True).values_list("period", flat=True)) == [FEBRUARY]
    assert usage_rollup(now=CLOSED) == [FEBRUARY]
    assert _everything(usage) == _from_slices(usage)

    fixed = dataclasses.replace(later, start_time=at(2026, 1, 31, 23))  # a correction that reaches January
    usage_records_upsert(records=[fixed])
    assert set(UsageMonth.objects.filter(stale=True).values_list("period", flat=True)) == {JANUARY, FEBRUARY}


def test_a_report_over_closed_months_reads_no_slice(usage):
    usage_rollup(now=CLOSED)
    with CaptureQueriesContext(connection) as queries:
        rows = cost_report(start=JANUARY, end=dt.date(2026, 2, 28), group_by="user")
        bill = invoice(team=usage.vision, month=JANUARY)
    assert rows and bill["usage_cost"] > 0
    reads = _slice_queries(queries.captured_queries)
    assert len(reads) == 1 and "ORDER BY" in reads[0]  # the invoice's per-job lines (61 jobs) only


def test_a_month_is_rolled_once_closed_and_a_record_of_another_month_leaves_it_alone(usage):
    assert usage_rollup(now=at(2026, 2, 2, 12)) == []  # January is not closed before the 4th of February
    assert usage_rollup(now=at(2026, 2, 4, 0)) == [JANUARY]
    usage_records_upsert(records=[acct(account="vision", user="alice", start=at(2026, 2, 3, 1), hours=1, job_id=998)])
    assert UsageMonth.objects.get(period=FEBRUARY).rolled_at is None  # February: still read from its slices
    assert not UsageMonth.objects.get(period=JANUARY).stale


def test_a_busy_months_invoice_lists_users_gpu_types_and_rates_and_its_jobs_as_csv(usage, settings, client_for):
    settings.INVOICE_JOB_LINES_MAX = 10
    usage_rollup(now=CLOSED)
    bill = invoice(team=usage.vision, month=JANUARY)
    assert bill["lines"] == [] and not bill["jobs_listed"]
    assert {(r["user"], r["gpu_type"], r["price"]) for r in bill["by_user"]} == {
        ("alice", "a100", Decimal("8.0000")), ("alice", "a100", Decimal("9.3333")), ("bob", "h100", Decimal("16.0000"))}
    assert sum(r["jobs"] for r in bill["by_user"]) == bill["jobs"] == UsageSlice.objects.filter(team=usage.vision, period=JANUARY).count()
    exact = UsageSlice.objects.filter(team=usage.vision, period=JANUARY).aggregate(c=Sum("cost"))["c"]
    assert bill["usage_cost"] == exact.quantize(Decimal("0.01"))
    client = client_for("finance")
    html = client.get("/accounting/invoices/vision/2026-01/").content.decode()
    assert "/accounting/invoices/vision/2026-01-jobs.csv" in html and "By user, GPU type and rate" in html
    response = client.get("/accounting/invoices/vision/2026-01-jobs.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))
    assert len(rows) == bill["jobs"] and {r["user"] for r in rows} == {"alice", "bob"}
    assert sum(int(r["gpu_seconds"]) for r in rows) == UsageSlice.objects.filter(team=usage.vision, period=JANUARY).aggregate(s=Sum("gpu_seconds"))["s"]
    assert client_for("member").get("/accounting/invoices/vision/2026-01-jobs.csv").status_code == 403
    assert client_for("outsider").get("/accounting/invoices/vision/2026-01-jobs.csv").status_code == 404


def test_every_change_of_the_months_state_moves_its_snapshot(usage):
    """Reports keep which months are rolled in each process (portal.snapshots USAGE_MONTHS): the roll-up,
    a late record's re-opening and any update of the rows move its version, so no process reads a
    re-opened month from its old totals."""
    from portal.snapshots import USAGE_MONTHS, snapshot_version

    def version():
        return snapshot_version(USAGE_MONTHS)

    before = version()
    usage_rollup(now=CLOSED)
    rolled = version()
    assert rolled != before
    usage_records_upsert(records=[acct(account="vision", user="dave", start=at(2026, 1, 30, 1), hours=1, job_id=997)])
    assert version() != rolled
    moved = version()
    UsageMonth.objects.filter(period=FEBRUARY).update(stale=True)
    assert version() != moved
