"""The budget holds' sweeper (jobs.services.budget_holds_sweep): holds whose final usage will not come
— the job ended long ago without it, the job row is gone, the job's cluster is no longer configured —
are released through budget_holds_release, audited, the running totals kept equal to their rows;
everything younger than BUDGET_HOLD_RELEASE_AFTER_HOURS is left holding; a second sweep does nothing."""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

import pytest
from django.utils import timezone

from accounting.models import BudgetHold
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import budget_holds_sweep
from jobs.tasks import budget_holds_sweep_task
from portal.models import AuditEvent, Cluster
from tests.jobs.test_services_budget_holds import any_type_total, assert_totals_consistent, submit

pytestmark = pytest.mark.django_db

NOTHING = {"ended": 0, "gone": 0, "unfollowed": 0}
_slurm_ids = itertools.count(7000)


def _ran(job, *, ended_hours_ago: float | None) -> None:
    """The job ran (and ended that many hours ago: None, still running); no usage ingested for it."""
    now = timezone.now()
    ended = None if ended_hours_ago is None else now - dt.timedelta(hours=ended_hours_ago)
    state = JobState.RUNNING if ended is None else JobState.COMPLETED
    Job.objects.filter(pk=job.pk).update(state=state, slurm_job_id=next(_slurm_ids), started_at=now - dt.timedelta(days=2),
                                         ended_at=ended)  # fmt: skip


def _placed_hours_ago(job, hours: float) -> None:
    BudgetHold.objects.filter(pk=job.pk).update(created_at=timezone.now() - dt.timedelta(hours=hours))


def _open(job) -> bool:
    return BudgetHold.objects.filter(pk=job.pk, released_at__isnull=True).exists()


def test_a_job_that_ended_a_day_ago_without_final_usage_releases_its_hold_once(world, inventory, relays, settings):
    settings.BUDGET_HOLD_RELEASE_AFTER_HOURS = 24
    lost, recent, running = submit(world, gpus=2), submit(world, gpus=1), submit(world, gpus=1, minutes=120)  # 2 + 1 + 2 GPU-h
    _ran(lost, ended_hours_ago=25)
    _ran(recent, ended_hours_ago=23)
    _ran(running, ended_hours_ago=None)
    assert any_type_total(world).held_gpu_hours == 5

    assert budget_holds_sweep_task() == {"ended": 1, "gone": 0, "unfollowed": 0}
    assert not _open(lost) and _open(recent) and _open(running)
    assert any_type_total(world).held_gpu_hours == 3
    assert_totals_consistent(world.vision)
    event = AuditEvent.objects.get(action="budget.hold_released")
    assert (event.target_id, event.team_id, event.actor_name) == (str(lost.pk), world.vision.pk, "system")
    assert event.data["held_gpu_hours"] == "2.000000" and "final usage never came" in event.data["reason"]
    # the sweep again: nothing left to do, nothing audited twice
    assert budget_holds_sweep() == NOTHING
    assert any_type_total(world).held_gpu_hours == 3 and AuditEvent.objects.filter(action="budget.hold_released").count() == 1


def test_the_setting_decides_how_long_an_ended_job_keeps_its_hold(world, inventory, relays, settings):
    job = submit(world)
    _ran(job, ended_hours_ago=3)
    settings.BUDGET_HOLD_RELEASE_AFTER_HOURS = 4
    assert budget_holds_sweep() == NOTHING and _open(job)
    settings.BUDGET_HOLD_RELEASE_AFTER_HOURS = 2
    assert budget_holds_sweep()["ended"] == 1 and not _open(job)


def test_the_hold_of_a_deleted_job_is_released(world, inventory, relays, settings):
    settings.BUDGET_HOLD_RELEASE_AFTER_HOURS = 24
    gone, young = submit(world, gpus=2), submit(world, gpus=1)
    Job.objects.filter(pk__in=[gone.pk, young.pk]).delete()
    _placed_hours_ago(gone, 25)
    _placed_hours_ago(young, 1)
    assert budget_holds_sweep() == {"ended": 0, "gone": 1, "unfollowed": 0}
    assert not BudgetHold.objects.filter(pk=gone.pk, released_at__isnull=True).exists()
    assert BudgetHold.objects.filter(pk=young.pk, released_at__isnull=True).exists()  # a submit may still be committing
    assert any_type_total(world).held_gpu_hours == 1
    assert_totals_consistent(world.vision)
    assert "no longer exists" in AuditEvent.objects.get(action="budget.hold_released", target_id=str(gone.pk)).data["reason"]


def test_the_hold_of_a_live_job_on_a_removed_cluster_is_released(world, inventory, relays, settings):
    settings.BUDGET_HOLD_RELEASE_AFTER_HOURS = 24
    removed = Cluster.objects.create(name="retired", active=False)
    stranded, followed = submit(world, gpus=2), submit(world, gpus=1)
    for job in (stranded, followed):
        _ran(job, ended_hours_ago=None)
        _placed_hours_ago(job, 48)
    Job.objects.filter(pk=stranded.pk).update(cluster=removed)
    assert budget_holds_sweep() == {"ended": 0, "gone": 0, "unfollowed": 1}
    assert not _open(stranded) and _open(followed)  # a job on a served cluster may run for days
    assert any_type_total(world).held_gpu_hours == 1
    assert_totals_consistent(world.vision)


def test_a_partly_ingested_hold_frees_only_what_it_still_held(world, inventory, relays, settings):
    """Usage ingested so far stays used; the release takes only what the hold still held."""
    from accounting.services import usage_records_upsert
    from tests.accounting.helpers import acct

    settings.BUDGET_HOLD_RELEASE_AFTER_HOURS = 24
    job = submit(world, gpus=2, minutes=240)  # 8 GPU-h
    start = timezone.now() - dt.timedelta(days=2)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=start)
    usage_records_upsert(records=[acct(start=start, hours=None, gpus=2, job_id=78, comment=job.slurm_tag)])  # 2 GPU-h, not final
    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED, ended_at=start + dt.timedelta(hours=2))
    total = any_type_total(world)
    assert (total.held_gpu_hours, total.used_gpu_hours) == (Decimal(6), Decimal(2))
    assert budget_holds_sweep()["ended"] == 1
    total.refresh_from_db()
    assert (total.held_gpu_hours, total.used_gpu_hours) == (Decimal(0), Decimal(2))
    assert_totals_consistent(world.vision)
