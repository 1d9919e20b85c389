"""ingest_usage, reconcile_usage (the gateway's sreport answer stubbed; the real one is in test_reconcile_slurm), seed, task."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounting.models import Rate, UsageRecord
from accounting.services import usage_records_upsert
from portal.slurm.cli import sreport_argv
from portal.slurm.parsing import parse_account_minutes
from tests.accounting.helpers import acct, at
from tests.fakes import FakeGateway

pytestmark = pytest.mark.django_db


def test_ingest_usage_command(world, use_gateway, settings):
    gateway = use_gateway(FakeGateway([acct(hours=2), acct(user="carol", account="nlp")]))
    settings.ACCOUNTING_INGEST_WINDOW_DAYS = 400
    out = StringIO()
    call_command("ingest_usage", "--since", "2026-01-01", stdout=out)
    assert "2 written" in out.getvalue() and UsageRecord.objects.count() == 2
    assert gateway.accounting_windows[0][0] == dt.datetime(2026, 1, 1, tzinfo=dt.UTC) and len(gateway.accounting_windows) == 1
    with pytest.raises(CommandError, match="--since"):
        call_command("ingest_usage", "--since", "January")


def test_usage_ingest_task_runs_the_service(world, use_gateway):
    from accounting.tasks import usage_ingest_task

    gateway = use_gateway(FakeGateway([acct()]))
    result = usage_ingest_task.delay().get()
    assert result["written"] == 1 and len(gateway.accounting_windows) >= 1




def test_parse_account_minutes():
    rows = "gpuportal|root|||gres/gpu|999\ngpuportal|vision|||gres/gpu|180\ngpuportal|vision|alice|Alice|gres/gpu|120\n"
    assert parse_account_minutes(rows) == {"vision": 180}


def test_sreport_argv_is_a_list_with_utc_times():
    shanghai = dt.timezone(dt.timedelta(hours=8))
    argv = sreport_argv(dt.datetime(2026, 1, 1, tzinfo=shanghai), dt.datetime(2026, 2, 1, tzinfo=shanghai), cluster="c1")
    assert argv[1:7] == ["-n", "-P", "cluster", "AccountUtilizationByUser", "Start=2025-12-31T16:00:00", "End=2026-01-31T16:00:00"]
    assert "-T" in argv and "gres/gpu" in argv and "Minutes" in argv and argv[-1] == "Clusters=c1"


@pytest.fixture
def january(world, settings):
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    usage_records_upsert(records=[acct(start=at(2026, 1, 5), hours=2, gpus=2), acct(account="nlp", user="carol", hours=1)])


def _stub_sreport(use_gateway, answer):
    """The command's gateway answers account_gpu_minutes with ``answer`` (the comparison logic alone)."""
    gateway = FakeGateway()
    gateway.account_gpu_minutes = answer
    use_gateway(gateway)


def test_reconcile_no_differences(january, use_gateway):
    seen = {}

    def fake(start, end):
        seen["range"] = (start, end)
        return {"vision": 240, "nlp": 60}

    _stub_sreport(use_gateway, fake)
    out = StringIO()
    call_command("reconcile_usage", "--month", "2026-01", stdout=out)
    assert "no differences" in out.getvalue()
    assert seen["range"] == (at(2026, 1, 1), at(2026, 2, 1))


def test_reconcile_differences_exit_1(january, use_gateway):
    _stub_sreport(use_gateway, lambda start, end: {"vision": 200, "ghost": 5})
    out = StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command("reconcile_usage", "--month", "2026-01", stdout=out)
    assert exc.value.code == 1
    text = out.getvalue()
    assert "DIFFERENCE vision" in text and "DIFFERENCE nlp" in text and "DIFFERENCE ghost" in text


def test_reconcile_compares_finished_hours_only(january):
    from accounting.management.commands.reconcile_usage import comparable_range

    now = at(2026, 1, 20, 14, 37)
    assert comparable_range(dt.date(2026, 1, 1), now) == (at(2026, 1, 1), at(2026, 1, 20, 14))
    assert comparable_range(dt.date(2025, 12, 1), now) == (at(2025, 12, 1), at(2026, 1, 1))


def test_reconcile_bad_month():
    with pytest.raises(CommandError):
        call_command("reconcile_usage", "--month", "2026-1x")


def test_demo_seed_is_idempotent(db):
    from accounting.demo import seed

    seed(stdout=StringIO())
    seed(stdout=StringIO())
    assert sorted(Rate.objects.values_list("gpu_type", "price_per_gpu_hour", "effective_from")) == [
        ("a100", Decimal(8), dt.date(2026, 1, 1)),
        ("h100", Decimal(16), dt.date(2026, 1, 1)),
    ]
