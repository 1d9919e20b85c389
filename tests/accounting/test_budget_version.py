"""Issue 38: the budget check reads the team's quotas and bookings from this process's copies only
when they were read at the team's budget version, which the database itself moves with every change
the budget counts (accounting migration 0011's triggers) and which the check reads under the team's
row lock. A change made by another process, whose invalidation has not reached this one, still
decides the next submission here."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounting.models import Booking, BookingStatus, Quota
from jobs.services import job_submit
from portal.exceptions import Conflict
from portal.models import NodeInfo, PartitionInfo, Team
from portal.snapshots import snapshot_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fast]


def _version(team) -> int:
    return Team.objects.values_list("budget_version", flat=True).get(pk=team.pk)


def _sql(statement: str, params: list) -> None:
    """A write as another process (or psql) makes it: no snapshot of this process moves."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_what_the_budget_counts_moves_the_version_and_nothing_else_does(world):
    team = world.vision
    quota = Quota.objects.filter(team=team).first()
    assert quota is not None
    start = _version(team)

    _sql("UPDATE accounting_quota SET justification = 'reworded' WHERE id = %s", [quota.pk])
    assert _version(team) == start  # not a figure the budget reads
    _sql("UPDATE accounting_quota SET gpu_hours = gpu_hours + 1 WHERE id = %s", [quota.pk])
    assert _version(team) == start + 1

    begin = timezone.now() + dt.timedelta(days=1)
    booking = Booking.objects.create(team=team, gpu_type="a100", gpus=1, start=begin, end=begin + dt.timedelta(hours=1),
                                     created_by=world.bob)  # fmt: skip
    assert _version(team) == start + 2  # a new booking
    Booking.objects.filter(pk=booking.pk).update(reservation_state="failed", reservation_error="scontrol")
    assert _version(team) == start + 2  # the reservation's mirror: not a figure the budget reads
    Booking.objects.filter(pk=booking.pk).update(status=BookingStatus.APPROVED, approved_at=timezone.now())
    assert _version(team) == start + 3

    # a Team read before the moves and saved after them (a form, the admin) does not take it back
    stale = Team.objects.get(pk=team.pk)
    stale.budget_version = 0
    _sql("UPDATE accounting_quota SET gpu_hours = gpu_hours + 1 WHERE id = %s", [quota.pk])
    stale.description = "saved from a stale copy"
    stale.save()
    assert _version(team) == start + 4
    Quota.objects.filter(pk=quota.pk).delete()
    assert _version(team) == start + 5


@pytest.fixture
def submits(world, monkeypatch, settings):
    """job_submit of a 2 GPU-h job as alice in vision, inside a request's snapshot scope (as the API
    and the form run it), the relay not enqueued."""
    monkeypatch.setattr("jobs.services.submit.relay_drain_after_commit", lambda: None)
    settings.SLURM_OVERRUN_SECONDS_UNREAD = 0
    now = timezone.now()
    PartitionInfo.objects.create(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320,
                                 node_names=["a100-01"], seen_at=now)  # fmt: skip
    NodeInfo.objects.create(name="a100-01", state="IDLE", partitions=["gpu"], gpu_type="a100", gpus_total=4,
                            cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip

    def submit(name: str):
        with snapshot_scope():
            return job_submit(user=world.alice, team=world.vision, name=name, script="true", partition="gpu",
                              gpu_type="a100", gpus=2, time_limit_minutes=60)[0]  # fmt: skip

    return submit


def test_a_quota_cut_by_another_process_decides_the_next_submission_here(world, submits):
    Quota.objects.filter(team=world.vision).update(gpu_hours=1000)
    for name in ("first", "second"):  # the team's running totals built, then this process's copies read
        submits(name)
    with CaptureQueriesContext(connection) as third:
        submits("third")
    read = [q["sql"] for q in third.captured_queries if "accounting_quota" in q["sql"] or "accounting_booking" in q["sql"]]
    assert not read, read  # the copies are current: no read of quotas or bookings

    # another process cuts the budget to 1 GPU-h: this process's copies (and its snapshot versions)
    # still say 1000, but the team's budget version moved with the row
    quota = Quota.objects.filter(team=world.vision).first()
    _sql("UPDATE accounting_quota SET gpu_hours = 1 WHERE id = %s", [quota.pk])
    with pytest.raises(Conflict, match="GPU-h left for vision"):
        submits("refused")


def test_a_booking_approved_by_another_process_decides_the_next_submission_here(world, submits):
    Quota.objects.filter(team=world.vision).update(gpu_hours=9)
    for name in ("first", "second"):
        submits(name)  # 4 GPU-h held: 5 left
    begin = (timezone.now() + dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    from accounting.selectors import billing_date

    if billing_date(begin + dt.timedelta(hours=2)).month != billing_date(timezone.now()).month:
        pytest.skip("the billing month ends within 3 h: the booking would fall in the next period")
    booking = Booking.objects.create(team=world.vision, gpu_type="a100", gpus=2, start=begin,
                                     end=begin + dt.timedelta(hours=2), created_by=world.bob)  # fmt: skip
    submits("third")  # 3 GPU-h left: the requested booking holds nothing
    # approved elsewhere: 4 GPU-h booked, which the copy of the bookings does not know
    _sql("UPDATE accounting_booking SET status = %s, approved_at = now() WHERE id = %s", [BookingStatus.APPROVED, booking.pk])
    with pytest.raises(Conflict, match="GPU-h left for vision"):
        submits("refused")
