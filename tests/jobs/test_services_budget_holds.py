"""Budget holds and running totals (accounting's own rows): placed in the transaction that stores
the job, released when a job ends without running, converted to used by the ingestion; the totals
always equal the sum of the open holds and of the ingested usage; the check's query count."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import sys
import uuid
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounting.models import BudgetHold, BudgetTotal, Quota, UsageRecord
from accounting.selectors.budgets import budget_total_figures, team_budget
from accounting.services import HoldRequest, budget_holds_place, budget_holds_release, usage_records_upsert
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel, job_relay_run, job_submit, jobs_sync
from portal import money
from portal.exceptions import Conflict
from portal.slurm import SlurmRejected
from tests.accounting.helpers import acct
from tests.factories import QuotaFactory
from tests.fakes import FakeGateway, accounting_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake(use_gateway, settings):
    settings.SLURM_SUBMIT_AS_USER = False
    return use_gateway(FakeGateway())


def submit(world, *, gpus=2, minutes=60, gpu_type="a100"):
    job, _ = job_submit(user=world.alice, team=world.vision, name="h", script="true", partition="gpu",
                        gpu_type=gpu_type, gpus=gpus, time_limit_minutes=minutes)  # fmt: skip
    return job


def any_type_total(world) -> BudgetTotal:
    return BudgetTotal.objects.get(team=world.vision, gpu_type="")


def assert_totals_consistent(team) -> None:
    """Every running total equals what its rows say: the open holds' GPU-hours (its type, placed
    before its period ends) and the usage slices of its period."""
    for total in BudgetTotal.objects.filter(team=team):
        holds = BudgetHold.objects.filter(team=team, released_at__isnull=True, created_at__lt=total.ends_at)
        if total.gpu_type:
            holds = [h for h in holds if total.gpu_type in h.gpu_types]
        assert total.held_gpu_hours == sum((h.held_gpu_hours for h in holds), Decimal(0)), total
        used, _ = budget_total_figures(team=team, gpu_type=total.gpu_type, period_start=total.period_start,
                                       period_end=total.period_end, held=False)  # fmt: skip
        assert total.used_gpu_seconds == used * 3600, total  # exact: moved by each ingestion, never drifting
        assert total.used_gpu_hours == money.stored(used), total
    for hold in BudgetHold.objects.filter(team=team, released_at__isnull=True):
        ingested = sum(UsageRecord.objects.filter(portal_job_uuid=hold.job_uuid).values_list("gpu_hours", flat=True), Decimal(0))
        assert hold.held_gpu_hours == max(hold.estimated_gpu_hours - ingested, Decimal(0)), hold


# ---------------------------------------------------------------- placed with the job, or not at all


def test_the_hold_is_placed_with_the_job_and_counted_in_the_total(world, inventory, relays):
    job = submit(world, gpus=2, minutes=90)  # 3 GPU-h
    hold = BudgetHold.objects.get(pk=job.pk)
    assert (hold.team_id, hold.gpu_type, hold.estimated_gpu_hours, hold.held_gpu_hours) == (world.vision.pk, "a100", 3, 3)
    assert hold.estimated_cost == job.estimated_cost and hold.released_at is None
    assert any_type_total(world).held_gpu_hours == 3
    assert team_budget(team=world.vision)[0]["held"] == Decimal("3.00")


def test_a_failing_job_insert_leaves_no_hold(world, inventory, relays, monkeypatch):
    submit(world)  # builds the team's total
    module = sys.modules[job_submit.__module__]
    real = module._job_row

    def broken(*args, **kwargs):
        job = real(*args, **kwargs)
        job.gpus = 0  # violates job_resources_positive: the INSERT fails after the hold was placed
        return job

    monkeypatch.setattr(module, "_job_row", broken)
    with pytest.raises(IntegrityError):
        submit(world)
    assert Job.objects.count() == BudgetHold.objects.count() == 1
    assert any_type_total(world).held_gpu_hours == 2


def test_an_over_budget_job_leaves_no_hold_and_the_total_unchanged(world, inventory, relays):
    Quota.objects.filter(team=world.vision).update(gpu_hours=3)
    submit(world)  # 2 GPU-h
    with pytest.raises(Conflict) as exc:
        submit(world)
    assert "needs 2.0 GPU-h; 1.0 of 3.0 GPU-h left" in exc.value.message
    assert "held by unfinished jobs 2.0" in exc.value.message
    assert BudgetHold.objects.count() == 1 and any_type_total(world).held_gpu_hours == 2


def test_a_quota_approved_later_counts_the_holds_placed_before_it(world, inventory, relays, settings):
    """No quota, unlimited policy: the hold is placed (no total to add it to). A quota approved later
    gets its total built at the next submission from the open holds — the earlier job's included."""
    from accounting import services

    settings.QUOTA_NO_QUOTA_POLICY = "unlimited"
    Quota.objects.filter(team=world.vision).delete()
    first = submit(world)  # 2 GPU-h, held with no quota in force
    assert BudgetHold.objects.get(pk=first.pk).held_gpu_hours == 2 and not BudgetTotal.objects.exists()
    quota = services.quota_request(team=world.vision, user=world.bob, gpu_hours=5, justification="x")
    services.quota_approve(quota=quota, user=world.admin)
    submit(world)
    assert any_type_total(world).held_gpu_hours == 4
    with pytest.raises(Conflict) as exc:
        submit(world)  # 4 held of 5: 2 more do not fit
    assert "held by unfinished jobs 4.0" in exc.value.message


# ---------------------------------------------------------------- released when the job never runs


def test_cancel_before_slurm_releases_the_hold(world, inventory, relays):
    job = submit(world)
    job_cancel(user=world.alice, job=job)
    hold = BudgetHold.objects.get(pk=job.pk)
    assert hold.released_at is not None and hold.held_gpu_hours == 0
    assert any_type_total(world).held_gpu_hours == 0
    assert budget_holds_release(job_uuids=[job.pk]) == 0  # released once


def test_a_submission_slurm_rejects_releases_the_hold(world, inventory, relays, fake, monkeypatch):
    job = submit(world)

    def reject(spec):
        raise SlurmRejected("sbatch: error: Invalid account or account/partition combination specified")

    monkeypatch.setattr(fake, "submit", reject)
    assert job_relay_run(job.pk) == "submit-failed"
    assert BudgetHold.objects.get(pk=job.pk).released_at is not None
    assert any_type_total(world).held_gpu_hours == 0


def test_sync_releases_a_job_that_ended_without_starting_and_keeps_one_that_ran(world, inventory, relays, fake):
    never, ran = submit(world), submit(world, gpus=1)
    Job.objects.filter(pk=never.pk).update(state=JobState.PENDING, slurm_job_id=501, submitted_at=timezone.now())
    Job.objects.filter(pk=ran.pk).update(state=JobState.RUNNING, slurm_job_id=502, submitted_at=timezone.now())
    fake.records = [
        dataclasses.replace(accounting_record(501, "CANCELLED", never.slurm_tag), start_time=None),
        accounting_record(502, "COMPLETED", ran.slurm_tag),
    ]
    jobs_sync()
    assert Job.objects.get(pk=never.pk).state == JobState.CANCELLED
    assert BudgetHold.objects.get(pk=never.pk).released_at is not None
    assert BudgetHold.objects.get(pk=ran.pk).released_at is None  # its usage is not ingested yet
    assert any_type_total(world).held_gpu_hours == 1


# ---------------------------------------------------------------- converted by the ingestion


def test_ingestion_moves_usage_from_held_to_used_and_a_final_record_releases(world, inventory, relays):
    job = submit(world, gpus=2, minutes=240)  # 8 GPU-h
    start = timezone.now() - dt.timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=start)
    usage_records_upsert(records=[acct(start=start, hours=None, gpus=2, job_id=77, comment=job.slurm_tag)])
    total = any_type_total(world)
    assert (total.held_gpu_hours, total.used_gpu_hours) == (Decimal(6), Decimal(2))  # 2 GPU-h ran so far
    usage_records_upsert(records=[acct(start=start, hours=1.5, gpus=2, job_id=77, comment=job.slurm_tag)])
    total.refresh_from_db()
    assert (total.held_gpu_hours, total.used_gpu_hours) == (Decimal(0), Decimal(3))
    assert BudgetHold.objects.get(pk=job.pk).released_at is not None
    assert not Job.objects.filter(pk=job.pk, state=JobState.COMPLETED).exists()  # nothing written to the job
    assert_totals_consistent(world.vision)


def _totals_of(world, periods):
    from accounting.calendar import billing_midnight

    now = timezone.now()
    BudgetTotal.objects.bulk_create([
        BudgetTotal(team=team, gpu_type=gpu_type, period_start=start, period_end=end, ends_at=billing_midnight(end),
                    updated_at=now)
        for team in (world.vision, world.nlp) for gpu_type in ("", "a100", "h100") for start, end in periods
    ])  # fmt: skip


def _assert_every_total_is_its_slices() -> dict:
    figures = {}
    for total in BudgetTotal.objects.select_related("team"):
        used, _ = budget_total_figures(team=total.team, gpu_type=total.gpu_type, period_start=total.period_start,
                                       period_end=total.period_end, held=False)  # fmt: skip
        assert (total.used_gpu_seconds, total.used_gpu_hours) == (used * 3600, money.stored(used)), total
        figures[(total.team.slug, total.gpu_type, total.period_end.month)] = total.used_gpu_hours
    return figures


def test_an_ingestion_moves_the_totals_by_what_it_changed_never_summing_the_period(world):
    """A day's usage of two teams, each with totals of three keys ("", a100, h100) in two periods,
    over usage already ingested: every total's used figure is what the period's slices say
    (budget_total_figures), and the ingestion read only the slices of the records it wrote or
    replaced — one aggregate per period for what they count now, one for what the replaced readings
    counted — never the period's other usage (a month of a year's site: 0.9 s; bench/results.md)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    periods = [(dt.date(2026, 1, 1), dt.date(2026, 2, 1)), (dt.date(2026, 1, 1), dt.date(2026, 4, 1))]
    _totals_of(world, periods)
    earlier = [acct(account="vision", hours=5, gpus=1, gpu_type="a100", start=dt.datetime(2026, 1, 3, tzinfo=dt.UTC)),
               acct(account="nlp", user="carol", hours=1, gpus=2, gpu_type="a100", start=dt.datetime(2026, 3, 3, tzinfo=dt.UTC))]  # fmt: skip
    running = acct(account="vision", hours=None, gpus=2, gpu_type="h100", start=dt.datetime(2026, 1, 20, tzinfo=dt.UTC))
    usage_records_upsert(records=[*earlier, running])
    assert _assert_every_total_is_its_slices()[("vision", "", 2)] == 7  # 5 + 2 × 1 h so far

    ended = dataclasses.replace(running, state="COMPLETED", end_time=running.start_time + dt.timedelta(hours=3),
                                elapsed_seconds=3 * 3600)  # fmt: skip
    records = [ended, acct(account="vision", hours=2, gpus=2, gpu_type="a100"), acct(account="vision", hours=1, gpus=1, gpu_type="h100"),
               acct(account="nlp", user="carol", hours=3, gpus=4, gpu_type="h100")]  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        usage_records_upsert(records=[*earlier, *records])
    sums = [q["sql"] for q in queries.captured_queries if "SUM(" in q["sql"] and '"accounting_usageslice"' in q["sql"]]
    assert len(sums) == 2 * len(periods), [sql[:120] for sql in sums]  # after (4 records), before (the 1 replaced)
    assert all('"accounting_usageslice"."record_id" IN (SELECT unnest(' in sql for sql in sums), [sql[-300:] for sql in sums]
    figures = _assert_every_total_is_its_slices()
    assert figures[("vision", "", 2)] == 5 + 6 + 4 + 1 and figures[("vision", "a100", 2)] == 9
    assert figures[("vision", "h100", 4)] == 6 + 1 and figures[("nlp", "", 4)] == 2 + 12 and figures[("nlp", "a100", 2)] == 0


def test_a_total_built_after_the_ingestion_first_read_the_totals_gets_its_used_figure_from_the_slices(world, monkeypatch):
    """A placement can build a team's total while an ingestion runs (between its first read of the
    totals and its writes): that total gets its used figure from the slices under its lock, with the
    ingestion's own records in it — not a move computed without it."""
    from accounting.calendar import billing_midnight
    from accounting.services import budget as budget_module

    periods = [(dt.date(2026, 1, 1), dt.date(2026, 2, 1))]
    real = budget_module.budget_used_change

    def and_a_placement_builds_one(**kwargs):
        change = real(**kwargs)
        BudgetTotal.objects.create(team=world.vision, gpu_type="a100", period_start=periods[0][0], period_end=periods[0][1],
                                   ends_at=billing_midnight(periods[0][1]), updated_at=timezone.now())  # fmt: skip
        return change

    _totals_of(world, periods)
    BudgetTotal.objects.filter(team=world.vision, gpu_type="a100").delete()
    usage_records_upsert(records=[acct(account="vision", hours=1, gpus=1, gpu_type="a100")])
    from accounting.services import ingestion

    monkeypatch.setattr(ingestion, "budget_used_change", and_a_placement_builds_one)
    usage_records_upsert(records=[acct(account="vision", hours=2, gpus=2, gpu_type="a100")])
    assert _assert_every_total_is_its_slices()[("vision", "a100", 2)] == 5


def test_the_totals_check_corrects_a_stale_used_figure_from_the_slices_and_leaves_the_others(world):
    from accounting.services import budget_totals_check

    periods = [(dt.date(2026, 1, 1), dt.date(2026, 2, 1))]
    _totals_of(world, periods)
    usage_records_upsert(records=[acct(account="vision", hours=2, gpus=2, gpu_type="a100")])
    stale = BudgetTotal.objects.get(team=world.vision, gpu_type="")
    BudgetTotal.objects.filter(pk=stale.pk).update(used_gpu_seconds=3600, used_gpu_hours=1)
    at = dt.datetime(2026, 1, 20, tzinfo=dt.UTC)
    assert budget_totals_check(at=at) == [(stale.pk, Decimal(3 * 3600))]
    assert _assert_every_total_is_its_slices()[("vision", "", 2)] == 4
    assert budget_totals_check(at=at) == []  # nothing left to correct
    assert budget_totals_check(at=dt.datetime(2026, 2, 2, tzinfo=dt.UTC)) == []  # a period over is left as it is


def test_a_booked_job_names_its_booking_and_holds_nothing_when_bookings_carry_the_charge(world, settings):
    from tests.factories import BookingFactory

    booking = BookingFactory(team=world.vision)
    estimate = SimpleNamespace(gpu_hours=Decimal(4), gpu_type="a100", gpu_type_assumed=False, cost=None)
    job_uuid = uuid.uuid4()
    budget_holds_place(team=world.vision, holds=[HoldRequest(job_uuid, estimate, booking.pk)])
    hold = BudgetHold.objects.get(pk=job_uuid)
    assert (hold.booking_id, hold.estimated_gpu_hours, hold.held_gpu_hours) == (booking.pk, 4, 0)
    assert not BudgetTotal.objects.filter(team=world.vision, held_gpu_hours__gt=0).exists()


# ---------------------------------------------------------------- the totals stay right


@pytest.mark.parametrize("seed", [1, 2])
def test_totals_equal_open_holds_and_usage_after_a_random_mix_of_operations(world, inventory, relays, seed):
    rnd = random.Random(seed)
    Quota.objects.filter(team=world.vision).update(gpu_hours=24)
    world_quota = Quota.objects.get(team=world.vision, gpu_type="")
    QuotaFactory(team=world.vision, gpu_type="a100", gpu_hours=10, period_start=world_quota.period_start,
                 period_end=world_quota.period_end)  # fmt: skip
    slurm_ids = iter(range(5000, 6000))
    running: dict = {}  # job pk -> (slurm id, start)
    outcomes = {"submitted": 0, "refused": 0, "cancelled": 0, "provisional": 0, "final": 0, "other": 0}
    for _ in range(40):
        accepted = list(Job.objects.filter(state=JobState.ACCEPTED).values_list("pk", flat=True))
        op = rnd.choice(["submit", "submit", "cancel", "start", "final", "other"])
        if op == "submit":
            try:
                submit(world, gpus=rnd.randint(1, 4), minutes=rnd.choice([30, 60, 120]), gpu_type=rnd.choice(["a100", "h100", ""]))
                outcomes["submitted"] += 1
            except Conflict:
                outcomes["refused"] += 1
        elif op == "cancel" and accepted:
            job_cancel(user=world.alice, job=Job.objects.get(pk=rnd.choice(accepted)))
            outcomes["cancelled"] += 1
        elif op == "start" and accepted:
            job = Job.objects.get(pk=rnd.choice(accepted))
            start = timezone.now() - dt.timedelta(minutes=rnd.randint(5, 50))
            Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=start)
            running[job.pk] = (next(slurm_ids), start)
            usage_records_upsert(records=[acct(start=start, hours=None, gpus=job.gpus, gpu_type=job.gpu_type or "h100",
                                               job_id=running[job.pk][0], comment=job.slurm_tag)])  # fmt: skip
            outcomes["provisional"] += 1
        elif op == "final" and running:
            pk = rnd.choice(sorted(running))
            job, (slurm_id, start) = Job.objects.get(pk=pk), running.pop(pk)
            usage_records_upsert(records=[acct(start=start, hours=rnd.choice([0.25, 0.5, 3.0]), gpus=job.gpus,
                                               gpu_type=job.gpu_type or "h100", job_id=slurm_id, comment=job.slurm_tag)])  # fmt: skip
            Job.objects.filter(pk=pk).update(state=JobState.COMPLETED, ended_at=timezone.now())
            outcomes["final"] += 1
        elif op == "other":  # a job sbatch'ed outside the portal: usage without a hold
            usage_records_upsert(records=[acct(start=timezone.now() - dt.timedelta(hours=2), hours=0.5, gpus=1)])
            outcomes["other"] += 1
        assert_totals_consistent(world.vision)
    assert outcomes["submitted"] and outcomes["refused"], outcomes  # the mix reached both sides of the budget
    rows = {row["gpu_type"]: row for row in team_budget(team=world.vision)}
    for kind, row in rows.items():
        assert row["used"] + row["held"] + row["remaining"] == row["budget"], kind


# ---------------------------------------------------------------- what the check costs


def _estimate(gpu_hours=1, gpu_type="a100"):
    return SimpleNamespace(gpu_hours=Decimal(gpu_hours), gpu_type=gpu_type, gpu_type_assumed=False, cost=Decimal(3))


@pytest.mark.parametrize("jobs", [1, 50])
def test_the_budget_check_costs_three_queries_whatever_the_jobs_and_usage(world, django_assert_num_queries, jobs):
    """One statement (team lock, holds inserted, totals locked and added to), then under that lock the
    quotas in force and the booked hours (BOOKING_CHARGE_MODE=reserved), both from the database (a
    quota or booking approved while the placement waited for the lock counts; here because this
    transaction wrote a quota itself, so the process's copies are not its view — with current copies
    the check is the one statement: tests/accounting/test_budget_version.py) — with live holds and
    usage of the team in the database, so nothing is aggregated over them."""
    QuotaFactory(team=world.vision, gpu_type="a100", gpu_hours=1000, period_start=Quota.objects.get(team=world.vision).period_start,
                 period_end=Quota.objects.get(team=world.vision).period_end)  # fmt: skip
    budget_holds_place(team=world.vision, holds=[HoldRequest(uuid.uuid4(), _estimate()) for _ in range(30)])  # builds the totals
    usage_records_upsert(records=[acct(start=timezone.now() - dt.timedelta(hours=3), hours=1) for _ in range(30)])
    with transaction.atomic(), django_assert_num_queries(3):
        budget_holds_place(team=world.vision, holds=[HoldRequest(uuid.uuid4(), _estimate()) for _ in range(jobs)])
    assert BudgetTotal.objects.get(team=world.vision, gpu_type="a100").held_gpu_hours == 30 + jobs


def test_the_budget_check_costs_two_queries_when_bookings_charge_usage(world, settings, django_assert_num_queries):
    """Bookings charged by their use hold nothing of their own: no booked hours to read."""
    settings.BOOKING_CHARGE_MODE = "used"
    budget_holds_place(team=world.vision, holds=[HoldRequest(uuid.uuid4(), _estimate())])
    with transaction.atomic(), django_assert_num_queries(2):
        budget_holds_place(team=world.vision, holds=[HoldRequest(uuid.uuid4(), _estimate())])


# ---------------------------------------------------------------- the check compares exact values


@pytest.mark.parametrize("left_seconds", [27, 9])
def test_the_budget_check_compares_exact_gpu_seconds_not_cents(world, left_seconds):
    """A budget with exactly N GPU-seconds left takes a job needing N and refuses one needing N + 1.
    27 s = 0.0075 GPU-h (cents would say 0.01 left: 28 s would pass); 9 s = 0.0025 GPU-h (cents
    would say 0.00 left: 9 s would be refused)."""
    Quota.objects.filter(team=world.vision).update(gpu_hours=1)  # 3600 GPU-s

    def hold(seconds):
        estimate = SimpleNamespace(gpu_hours=Decimal(seconds) / 3600, gpu_seconds=seconds, gpu_type="a100",
                                   gpu_type_assumed=False, cost=None)  # fmt: skip
        budget_holds_place(team=world.vision, holds=[HoldRequest(uuid.uuid4(), estimate)])

    hold(3600 - left_seconds)
    with pytest.raises(Conflict, match="Over budget"), transaction.atomic():
        hold(left_seconds + 1)
    hold(left_seconds)
    assert any_type_total(world).held_gpu_hours == 1
    assert team_budget(team=world.vision)[0]["remaining"] == 0
