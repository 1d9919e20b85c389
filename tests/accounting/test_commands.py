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


def _this_hour() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)


def _stub_sreport(use_gateway, answer, *, rolled_up_to=None):
    """The command's gateway answers account_gpu_minutes with ``answer`` and has rolled up to
    ``rolled_up_to`` (the comparison logic alone; the real sreport is in test_reconcile_slurm)."""
    gateway = FakeGateway()
    gateway.account_gpu_minutes = answer
    gateway.rolled_up_to = rolled_up_to
    use_gateway(gateway)
    return gateway


def test_reconcile_no_differences(january, use_gateway):
    seen = {}

    def fake(start, end):
        seen["range"] = (start, end)
        return {"vision": 240, "nlp": 60}

    _stub_sreport(use_gateway, fake, rolled_up_to=_this_hour())
    out = StringIO()
    call_command("reconcile_usage", "--month", "2026-01", stdout=out)
    assert "no differences" in out.getvalue() and "STALE" not in out.getvalue()
    assert seen["range"] == (at(2026, 1, 1), at(2026, 2, 1))


def test_reconcile_differences_exit_1(january, use_gateway):
    _stub_sreport(use_gateway, lambda start, end: {"vision": 200, "ghost": 5}, rolled_up_to=_this_hour())
    out = StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command("reconcile_usage", "--month", "2026-01", stdout=out)
    assert exc.value.code == 1
    text = out.getvalue()
    assert "DIFFERENCE gpuportal vision" in text and "DIFFERENCE gpuportal nlp" in text
    assert "DIFFERENCE gpuportal ghost" in text


def test_reconcile_cuts_at_the_clusters_own_rollup(january, use_gateway):
    """The comparison ends where the cluster's slurmdbd has rolled up to (read from it, one sreport
    probe per hour back), not at the clock's last full hour; usage after it is not compared."""
    from accounting.services import usage_reconcile

    gateway = _stub_sreport(use_gateway, lambda start, end: {"vision": 240}, rolled_up_to=at(2026, 1, 5, 1))
    [result] = usage_reconcile(month=dt.date(2026, 1, 1), now=at(2026, 1, 5, 3, 20))
    assert (result.start, result.end, result.rolled_up_to) == (at(2026, 1, 1), at(2026, 1, 5, 1), at(2026, 1, 5, 1))
    assert gateway.calls["usage_rolled_up"] == 3  # 02:00-03:00, 01:00-02:00: no; 00:00-01:00: yes
    assert result.stale.startswith("sreport has not rolled up since 2026-01-05 01:00 UTC")
    # the january fixture's usage (2 h from 2026-01-05 00:00) is cut at 01:00: 2 GPUs x 1 h
    assert result.portal == {"vision": Decimal(7200)} and result.differences == [("vision", Decimal(120), Decimal(240))]


def test_reconcile_names_a_stale_rollup_and_does_not_fail_on_it(world, use_gateway):
    """This month, with slurmdbd's roll-up 3 h behind: said as stale, the hours after it not compared,
    and not a difference (exit 0)."""
    behind = _this_hour() - dt.timedelta(hours=3)
    usage_records_upsert(records=[acct(start=behind + dt.timedelta(minutes=30), hours=2)])  # after the roll-up
    _stub_sreport(use_gateway, lambda start, end: {}, rolled_up_to=behind)
    out = StringIO()
    call_command("reconcile_usage", "--month", f"{behind:%Y-%m}", stdout=out)  # no SystemExit
    text = out.getvalue()
    assert f"STALE ROLL-UP: sreport has not rolled up since {behind:%Y-%m-%d %H:%M} UTC on cluster gpuportal" in text
    assert "DIFFERENCE" not in text and "no differences" in text


def test_reconcile_of_a_month_rolled_up_whole_is_not_stale(january, use_gateway):
    """January is over and rolled up: a roll-up that is late today does not concern it."""
    from accounting.services import usage_reconcile

    _stub_sreport(use_gateway, lambda start, end: {"vision": 240, "nlp": 60}, rolled_up_to=_this_hour() - dt.timedelta(hours=5))
    [result] = usage_reconcile(month=dt.date(2026, 1, 1))
    assert result.end == at(2026, 2, 1) and result.stale == "" and result.differences == []


def test_reconcile_waits_for_the_reroll_after_a_runaway_fix(january, use_gateway):
    """Slurm's runaway fix sets slurmdbd's roll-up back; until its next roll-up sreport still counts the
    fixed runaway as running (seen after make test's runaway tests): the portal, which ran the fix,
    compares nothing and says why; once the roll-up reaches the end of the fix's hour, it compares."""
    from accounting.selectors.rollup import RUNAWAY_FIX_KIND
    from accounting.services import usage_reconcile
    from portal.models import SyncStatus
    from portal.services import sync_record_success

    sync_record_success(SyncStatus.kind_for(RUNAWAY_FIX_KIND, "gpuportal"), data={"jobs": 1}, at=at(2026, 1, 5, 3, 20))
    gateway = _stub_sreport(use_gateway, lambda start, end: {"vision": 400, "nlp": 60}, rolled_up_to=at(2026, 1, 5, 3))
    [result] = usage_reconcile(month=dt.date(2026, 1, 1), now=at(2026, 1, 5, 3, 30))
    assert (result.start, result.end, result.differences) == (at(2026, 1, 1), at(2026, 1, 1), [])
    assert result.stale.startswith("Slurm's runaway jobs were fixed at 2026-01-05 03:20 UTC on cluster gpuportal")
    assert "04:00 UTC" in result.stale and gateway.calls.get("account_gpu_minutes", 0) == 0

    gateway.rolled_up_to = at(2026, 1, 5, 4)  # the roll-up after the fix's hour: sreport is right again
    [result] = usage_reconcile(month=dt.date(2026, 1, 1), now=at(2026, 1, 5, 4, 10))
    assert (result.end, result.stale) == (at(2026, 1, 5, 4), "")
    assert ("vision", Decimal(240), Decimal(400)) in result.differences


def test_reconcile_nothing_rolled_up(january, use_gateway, settings):
    settings.ACCOUNTING_ROLLUP_SEARCH_HOURS = 5
    gateway = _stub_sreport(use_gateway, lambda start, end: pytest.fail("sreport asked with nothing rolled up"))
    out = StringIO()
    call_command("reconcile_usage", "--month", "2026-01", stdout=out)
    assert "no rolled-up hour to compare yet" in out.getvalue()
    assert "STALE ROLL-UP: sreport has not rolled up any hour of the last 5 h" in out.getvalue()
    assert gateway.calls["usage_rolled_up"] == 5


def test_reconcile_unknown_cluster():
    with pytest.raises(CommandError, match="--cluster 'nosuch': not a configured cluster"):
        call_command("reconcile_usage", "--month", "2026-01", "--cluster", "nosuch")


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
