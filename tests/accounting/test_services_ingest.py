"""usage_records_upsert / usage_ingest: idempotence, month split, rates, bulk queries."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest

from accounting.models import Rate, UsageRecord, UsageSlice
from accounting.services import rate_create, usage_ingest, usage_records_upsert
from portal.models import SyncStatus
from tests.accounting.helpers import acct, at, never_started
from tests.factories import JobFactory
from tests.fakes import FakeGateway

pytestmark = pytest.mark.django_db


@pytest.fixture
def rates(world):
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    Rate.objects.create(gpu_type="h100", price_per_gpu_hour=Decimal("16"), effective_from=dt.date(2025, 1, 1))


def _snapshot():
    records = sorted(UsageRecord.objects.values_list(
        "cluster", "job_id", "submit_time", "end_time", "state", "gpu_seconds", "gpu_hours", "requested_gpu_hours",
        "team_id", "user_id", "provisional", "known_until",
    ))  # fmt: skip
    slices = sorted(UsageSlice.objects.values_list("record__job_id", "period", "slice_start", "slice_end", "gpu_seconds", "cost"))
    return records, slices


def test_ingest_twice_changes_nothing(rates, world):
    records = [acct(hours=2, gpus=2), acct(user="carol", account="nlp", gpu_type="h100"), never_started()]
    first = usage_records_upsert(records=records)
    before = _snapshot()
    ids = set(UsageSlice.objects.values_list("pk", flat=True))
    second = usage_records_upsert(records=records)
    assert first.written == 2 and second.written == 0
    assert _snapshot() == before
    assert set(UsageSlice.objects.values_list("pk", flat=True)) == ids  # slices not even rewritten
    assert UsageRecord.objects.count() == 2  # the never-started job is not recorded


def test_record_fields_team_user_and_portal_job(rates, world):
    job_uuid = uuid.uuid4()
    record = acct(hours=1.5, gpus=2, comment=f"gpuportal:{job_uuid}", time_limit_minutes=180, num_nodes=2)
    usage_records_upsert(records=[record, acct(account="unknown", user="nobody")])
    row = UsageRecord.objects.get(job_id=record.job_id)
    assert row.team == world.vision and row.user == world.alice
    assert row.portal_job_uuid == job_uuid
    assert row.gpu_seconds == 2 * 1.5 * 3600 and row.gpu_hours == Decimal("3")
    assert row.requested_gpu_hours == Decimal(2 * 180 / 60)
    assert row.num_nodes == 2 and not row.provisional
    other = UsageRecord.objects.get(account="unknown")
    assert other.team is None and other.user is None


def test_unix_username_resolves_portal_user(rates, world):
    world.alice.profile.unix_username = "al"
    world.alice.profile.save()
    record = acct(user="al")
    usage_records_upsert(records=[record])
    assert UsageRecord.objects.get(job_id=record.job_id).user == world.alice


def test_running_job_is_provisional_then_final(rates, world):
    running = acct(hours=None, job_id=77)
    usage_records_upsert(records=[running])
    row = UsageRecord.objects.get(job_id=77)
    assert row.provisional and row.end_time is None and row.gpu_seconds == 3600
    assert UsageSlice.objects.get(record=row).provisional
    done = acct(hours=3, job_id=77)
    usage_records_upsert(records=[done])
    row.refresh_from_db()
    assert not row.provisional and row.gpu_seconds == 3 * 3600 and row.state == "COMPLETED"
    assert UsageRecord.objects.count() == 1
    assert sum(UsageSlice.objects.filter(record=row).values_list("gpu_seconds", flat=True)) == 3 * 3600


def test_a_running_reading_written_after_the_final_record_does_not_undercut_it(rates, world):
    """A reading taken while the job ran (1 h so far), written after the final record (the portal's
    Kubernetes cancel records what ran up to the Job's deletion, 3 h) — an ingestion racing the
    cancel: the final charge stays."""
    done = acct(hours=3, job_id=78, state="CANCELLED")
    usage_records_upsert(records=[done])
    assert usage_records_upsert(records=[acct(hours=None, job_id=78)]).written == 0
    row = UsageRecord.objects.get(job_id=78)
    assert (row.provisional, row.state, row.gpu_seconds, row.end_time) == (False, "CANCELLED", 3 * 3600, done.end_time)
    assert sum(UsageSlice.objects.filter(record=row).values_list("gpu_seconds", flat=True)) == 3 * 3600


def test_month_boundary_split(rates, world, settings):
    settings.TIME_ZONE = "UTC"
    start = at(2026, 1, 31, 22)
    record = acct(start=start, hours=5, gpus=2, time_limit_minutes=600)  # 2 h in January, 3 h in February
    usage_records_upsert(records=[record])
    slices = list(UsageSlice.objects.order_by("slice_start"))
    assert [(s.period, s.gpu_seconds) for s in slices] == [
        (dt.date(2026, 1, 1), 2 * 2 * 3600),
        (dt.date(2026, 2, 1), 2 * 3 * 3600),
    ]
    assert slices[0].slice_end == slices[1].slice_start == at(2026, 2, 1)
    requested_total = 2 * 600 * 60
    assert sum(s.requested_gpu_seconds for s in slices) == requested_total
    # the requested window's January hours (2 × 2 h), the rest — 3 h used and 5 h unused — in February,
    # where the job ended: January's share does not move while the job runs on
    assert slices[0].requested_gpu_seconds == 2 * 2 * 3600
    assert [s.cost for s in slices] == [Decimal(2 * 2 * 8), Decimal(2 * 3 * 8)]


def test_month_boundary_in_billing_time_zone(rates, world, settings):
    settings.TIME_ZONE = "Asia/Shanghai"  # UTC+8: February starts at 2026-01-31 16:00 UTC
    usage_records_upsert(records=[acct(start=at(2026, 1, 31, 15), hours=2)])
    assert list(UsageSlice.objects.order_by("slice_start").values_list("period", "gpu_seconds")) == [
        (dt.date(2026, 1, 1), 3600),
        (dt.date(2026, 2, 1), 3600),
    ]


def test_cost_uses_rate_in_force_and_splits_at_rate_change(world, settings):
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2026, 1, 1))
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), effective_from=dt.date(2026, 1, 15))
    Rate.objects.create(gpu_type="a100", partition="debug", price_per_gpu_hour=Decimal("2"), effective_from=dt.date(2026, 1, 1))
    before = acct(start=at(2026, 1, 10, 0), hours=1)
    spanning = acct(start=at(2026, 1, 14, 23), hours=3, gpus=2)  # 1 h at 8, 2 h at 10
    debug = acct(start=at(2026, 1, 20), hours=1, partition="debug")  # partition-specific wins
    usage_records_upsert(records=[before, spanning, debug])

    def cost(record):
        return sorted(UsageSlice.objects.filter(record__job_id=record.job_id).values_list("cost", flat=True))

    assert cost(before) == [Decimal(8)]
    assert cost(spanning) == sorted([Decimal(2 * 1 * 8), Decimal(2 * 2 * 10)])
    assert cost(debug) == [Decimal(2)]


def test_rate_added_later_reprices_usage(world, settings, django_capture_on_commit_callbacks):
    usage_records_upsert(records=[acct(start=at(2026, 2, 3), hours=2, gpu_type="h100")])
    assert UsageSlice.objects.get().rate is None and UsageSlice.objects.get().cost == 0
    with django_capture_on_commit_callbacks(execute=True):
        rate_create(gpu_type="h100", price_per_gpu_hour=Decimal("16"), effective_from=dt.date(2026, 1, 1))
    piece = UsageSlice.objects.get()
    assert piece.cost == Decimal(2 * 16) and piece.price_per_gpu_hour == Decimal(16)


def test_no_rate_means_unpriced(world):
    usage_records_upsert(records=[acct(gpu_type="l40")])
    piece = UsageSlice.objects.get()
    assert piece.rate is None and piece.cost == 0 and piece.gpu_seconds == 3600


def test_cpu_only_job_has_record_but_no_slices(rates, world):
    usage_records_upsert(records=[acct(gpus=0)])
    assert UsageRecord.objects.get().gpu_seconds == 0
    assert not UsageSlice.objects.exists()


def test_query_count_does_not_grow_with_records(rates, world, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("SQLite caps statements at 999 parameters, so Django cuts bulk inserts into ~40-row batches")

    few = [acct(start=at(2026, 1, 31, 23), hours=2) for _ in range(10)]
    with CaptureQueriesContext(connection) as ten:
        usage_records_upsert(records=few)
    many = [acct(start=at(2026, 1, 31, 23), hours=2, user=u) for _ in range(100) for u in ("alice", "carol")]
    with django_assert_max_num_queries(len(ten.captured_queries)):
        usage_records_upsert(records=many)
    assert UsageRecord.objects.count() == 210


@pytest.fixture
def one_job_gateway(use_gateway):
    """The ingestion's gateway: the fake, with one finished one-hour job."""
    return use_gateway(FakeGateway([acct(hours=1)]))


def test_first_ingest_backfills_in_windows(rates, world, one_job_gateway, settings):
    settings.ACCOUNTING_INGEST_BACKFILL_DAYS = 35
    settings.ACCOUNTING_INGEST_WINDOW_DAYS = 7
    gateway = one_job_gateway
    now = at(2026, 1, 20, 12)
    usage_ingest(now=now)
    assert gateway.accounting_windows[0][0] == now - dt.timedelta(days=35) and gateway.accounting_windows[-1][1] == now
    assert len(gateway.accounting_windows) == 5  # one call per 7-day window
    assert all(a[1] == b[0] for a, b in zip(gateway.accounting_windows, gateway.accounting_windows[1:]))
    assert UsageRecord.objects.count() == 1


def test_usage_ingest_windows_and_high_water_mark(rates, world, one_job_gateway, settings):
    settings.ACCOUNTING_INGEST_OVERLAP_SECONDS, settings.ACCOUNTING_INGEST_BACKFILL_DAYS = 600, 1
    now = at(2026, 1, 20, 12)
    result = usage_ingest(now=now)
    windows = one_job_gateway.accounting_windows
    assert len(windows) == 1 and windows[0][1] == now
    status = SyncStatus.objects.get(kind="usage")
    assert status.data["high_water_mark"] == now.isoformat() and status.last_success_at is not None
    later = now + dt.timedelta(minutes=1)
    usage_ingest(now=later)
    assert windows[1] == (now - dt.timedelta(seconds=600), later)  # one call, with the overlap
    assert result.written == 1 and UsageRecord.objects.count() == 1


def test_usage_ingest_rereads_from_oldest_provisional(rates, world, use_gateway, settings):
    settings.ACCOUNTING_INGEST_BACKFILL_DAYS = 1
    settings.ACCOUNTING_INGEST_OVERLAP_SECONDS = 600
    gateway = use_gateway(FakeGateway([acct(hours=None, job_id=5)]))
    t0 = at(2026, 1, 20, 12)
    usage_ingest(now=t0)
    gateway.records = []  # slurmdbd late: the job is not in the next windows
    t1 = t0 + dt.timedelta(hours=2)
    usage_ingest(now=t1)
    t2 = t1 + dt.timedelta(minutes=1)
    usage_ingest(now=t2)
    assert gateway.accounting_windows[2][0] == t0 - dt.timedelta(minutes=10)  # still re-reading the running job


def test_usage_ingest_records_failure(world, use_gateway):
    from portal.slurm import SlurmUnavailable

    class Down:
        def accounting(self, start, end):
            raise SlurmUnavailable("slurmdbd down")

    use_gateway(Down())
    with pytest.raises(SlurmUnavailable):
        usage_ingest(now=at(2026, 1, 20))
    status = SyncStatus.objects.get(kind="usage")
    assert status.failing_since is not None and "slurmdbd down" in status.last_error


def test_usage_links_to_portal_job_by_comment_tag(rates, world):
    from accounting.invoices import invoice

    job = JobFactory(team=world.vision, submitter=world.alice, name="train")
    usage_records_upsert(records=[acct(comment=job.slurm_tag), acct(comment="gpuportal:not-a-uuid")])
    tagged = UsageRecord.objects.get(portal_job_uuid__isnull=False)
    assert tagged.portal_job_uuid == job.pk
    # the invoice links the line to the job's page by the uuid alone (accounting reads no jobs row)
    lines = invoice(team=world.vision, month=dt.date(2026, 1, 1))["lines"]
    assert sorted(str(line["portal_job_uuid"]) for line in lines) == sorted([str(job.pk), "None"])
