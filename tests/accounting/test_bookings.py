"""Bookings: the peak capacity rule (sweep, not a count of overlaps), the 409 naming the full window,
the per-type lock under a real race, whole-node multiples, the availability step function,
auto-approval and admin approval, cancel, job submission into a booking, and charges."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from accounting.models import Booking, BookingStatus, ReservationState
from accounting.selectors import booked_gpu_hours, booking_charges
from accounting.services import booking_approve, booking_cancel, booking_create
from portal.exceptions import ApplicationError, Conflict
from portal.models import AuditEvent, NodeInfo, PartitionInfo

pytestmark = pytest.mark.django_db

UTC = dt.UTC


def day_at(hour: int, minute: int = 0, *, days: int = 2) -> dt.datetime:
    """hour:minute UTC, ``days`` days from today (always in the future)."""
    base = timezone.now().astimezone(UTC).date() + dt.timedelta(days=days)
    return dt.datetime(base.year, base.month, base.day, hour, minute, tzinfo=UTC)


def make_inventory(*, a100_nodes: int = 2, h100_nodes: int = 1):
    now = timezone.now()
    names = [f"a100-{i:02d}" for i in range(1, a100_nodes + 1)] + [f"h100-{i:02d}" for i in range(1, h100_nodes + 1)]
    PartitionInfo.objects.update_or_create(name="gpu", defaults=dict(
        is_default=True, state="UP", default_time_minutes=60, max_time_minutes=4320, node_names=names, seen_at=now))  # fmt: skip
    for name in names:
        NodeInfo.objects.update_or_create(name=name, defaults=dict(
            state="IDLE", partitions=["gpu"], gpu_type=name.split("-")[0], gpus_total=4, cpus_total=32,
            memory_mb=256000, seen_at=now))  # fmt: skip


@pytest.fixture
def inventory_whole_nodes(db, settings):
    """The local cluster's shape (2 × 4 a100, 1 × 4 h100), Slurm 22.05 style whole-node bookings, no
    Slurm calls (the reservation tasks are recorded, not run)."""
    settings.BOOKING_RESERVE_WHOLE_NODES = "yes"
    settings.TIME_ZONE = "UTC"
    make_inventory()


@pytest.fixture
def reserve_calls(monkeypatch):
    from accounting import tasks

    calls = {"reserve": [], "unreserve": []}
    monkeypatch.setattr(tasks.booking_reserve_task, "delay", lambda booking_id: calls["reserve"].append(booking_id))
    monkeypatch.setattr(tasks.booking_unreserve_task, "delay", lambda booking_id: calls["unreserve"].append(booking_id))
    return calls


def book(world, start, end, gpus=4, gpu_type="a100", actor=None, team=None):
    return booking_create(team=team or world.vision, gpu_type=gpu_type, gpus=gpus, start=start, end=end, actor=actor or world.admin)


# ---------------------------------------------------------------- the capacity rule


def test_peak_not_overlap_count_decides(world, inventory_whole_nodes, reserve_calls):
    """A and B (4 GPUs each) do not overlap; C overlaps both. Counting overlaps says 12 of 8, the peak
    is 8: C fits (on the node A and B do not hold)."""
    a = book(world, day_at(9), day_at(11))
    b = book(world, day_at(12), day_at(14))
    c = book(world, day_at(10), day_at(13))
    assert [x.status for x in (a, b, c)] == [BookingStatus.APPROVED] * 3
    assert a.nodes == b.nodes == ["a100-01"] and c.nodes == ["a100-02"]
    # the peak at 10:00-11:00 is now 8: one more GPU there is refused, but 12:00-... also full, 11-12 has 4 free
    with pytest.raises(Conflict):
        book(world, day_at(10, 30), day_at(10, 45) + dt.timedelta(minutes=30))
    d = book(world, day_at(11), day_at(12))
    assert d.nodes == ["a100-01"]


def test_three_pairwise_overlapping_bookings_up_to_capacity(world, inventory_whole_nodes, reserve_calls):
    """Capacity for two at a time (8 GPUs = 2 × 4): two overlapping bookings then a third that overlaps
    only the later one fit; a fourth across the common hour of three is refused."""
    book(world, day_at(8), day_at(12))
    book(world, day_at(10), day_at(16))
    book(world, day_at(12), day_at(18))  # overlaps the second, not the first: peak stays 8
    with pytest.raises(Conflict) as info:
        book(world, day_at(11), day_at(13))
    assert "8 of 8 GPUs already booked" in info.value.message


def test_conflict_names_the_full_window(world, inventory_whole_nodes, reserve_calls, api_client_for):
    book(world, day_at(9), day_at(12), gpus=8)
    response = api_client_for("manager").post("/api/v1/bookings/", {
        "team": "vision", "gpu_type": "a100", "gpus": 4,
        "start": day_at(10).isoformat(), "end": day_at(11).isoformat()}, format="json")  # fmt: skip
    assert response.status_code == 409, response.json()
    day = day_at(9).strftime("%Y-%m-%d")
    assert response.json()["detail"] == f"a100: 8 of 8 GPUs already booked {day} 10:00–11:00 UTC"
    assert set(response.json()["errors"]) >= {"start", "gpus"}
    # the whole stretch that is full is named, not only the requested part of it
    with pytest.raises(Conflict) as info:
        book(world, day_at(8), day_at(13), gpus=4)
    assert info.value.message == f"a100: 8 of 8 GPUs already booked {day} 09:00–12:00 UTC"
    assert Booking.objects.count() == 1


def test_gpus_must_be_whole_nodes_on_this_cluster(world, inventory_whole_nodes, api_client_for):
    response = api_client_for("manager").post("/api/v1/bookings/", {
        "team": "vision", "gpu_type": "a100", "gpus": 2,
        "start": day_at(9).isoformat(), "end": day_at(10).isoformat()}, format="json")  # fmt: skip
    assert response.status_code == 400
    assert "must be a multiple of 4 (whole nodes) on this cluster" in response.json()["errors"]["gpus"][0]


def test_gpu_counts_where_slurm_reserves_them(world, inventory_whole_nodes, settings, reserve_calls):
    settings.BOOKING_RESERVE_WHOLE_NODES = "no"
    booking = book(world, day_at(9), day_at(10), gpus=2)
    assert booking.status == BookingStatus.APPROVED and booking.nodes == []


@pytest.mark.django_db(transaction=True)
def test_race_for_the_last_gpus_lets_exactly_one_win(transactional_db, settings, reserve_calls):
    from tests.conftest import World

    settings.BOOKING_RESERVE_WHOLE_NODES = "yes"
    make_inventory(a100_nodes=2)
    world = World()
    book(world, day_at(9), day_at(10), gpus=4)  # 4 of 8 left
    barrier = threading.Barrier(10)
    outcomes: list[str] = []

    def attempt():
        try:
            barrier.wait()
            book(world, day_at(9), day_at(10), gpus=4)
            outcomes.append("ok")
        except Conflict:
            outcomes.append("409")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion
            outcomes.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["409"] * 9 + ["ok"], outcomes
    assert Booking.objects.filter(status=BookingStatus.APPROVED).count() == 2
    assert sorted(n for b in Booking.objects.all() for n in b.nodes) == ["a100-01", "a100-02"]


# ---------------------------------------------------------------- availability


def test_availability_is_a_step_function(world, inventory_whole_nodes, reserve_calls, api_client_for):
    book(world, day_at(10), day_at(12))
    book(world, day_at(11), day_at(13))
    response = api_client_for("member").get(
        "/api/v1/bookings/availability/", {"gpu_type": "a100", "start": day_at(9).isoformat(), "end": day_at(14).isoformat()}
    )
    assert response.status_code == 200, response.json()
    (row,) = response.json()["results"]
    assert row["capacity"] == 8 and row["gpus_per_node"] == 4
    steps = [(dt.datetime.fromisoformat(s["start"]).hour, dt.datetime.fromisoformat(s["end"]).hour, s["free"]) for s in row["steps"]]
    assert steps == [(9, 10, 8), (10, 11, 4), (11, 12, 0), (12, 13, 4), (13, 14, 8)]
    assert response.json()["whole_nodes"] is True


# ---------------------------------------------------------------- approval


def test_small_bookings_are_approved_at_once_large_ones_wait(world, inventory_whole_nodes, settings, reserve_calls, django_capture_on_commit_callbacks):
    settings.BOOKING_AUTO_APPROVE_GPU_HOURS = 32
    with django_capture_on_commit_callbacks(execute=True):
        small = book(world, day_at(1), day_at(9), actor=world.bob)  # 4 × 8 h = 32
        large = book(world, day_at(10), day_at(19), actor=world.bob)  # 36 GPU-h
    assert small.status == BookingStatus.APPROVED and small.auto_approved
    assert small.reservation_state == ReservationState.PENDING
    assert large.status == BookingStatus.REQUESTED and large.reservation_state == ReservationState.NONE
    assert reserve_calls["reserve"] == [str(small.pk)]
    # a requested booking holds nothing: another one may take the capacity meanwhile ...
    book(world, day_at(10), day_at(11), gpus=8, actor=world.admin)
    with pytest.raises(Conflict):  # ... and approval checks again
        booking_approve(booking=large, actor=world.admin)
    with pytest.raises(ApplicationError) as info:
        booking_approve(booking=large, actor=world.bob)
    assert info.value.status_code == 403
    assert AuditEvent.objects.filter(action="booking.create").count() == 3


def test_admin_approves_over_the_api(world, inventory_whole_nodes, settings, reserve_calls, api_client_for, django_capture_on_commit_callbacks):
    settings.BOOKING_AUTO_APPROVE_GPU_HOURS = 1
    response = api_client_for("manager").post("/api/v1/bookings/", {
        "team": "vision", "gpu_type": "h100", "gpus": 4,
        "start": day_at(9).isoformat(), "end": day_at(10).isoformat()}, format="json")  # fmt: skip
    assert response.status_code == 201 and response.json()["status"] == "requested"
    booking_id = response.json()["id"]
    assert api_client_for("manager").post(f"/api/v1/bookings/{booking_id}/approve/").status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for("admin").post(f"/api/v1/bookings/{booking_id}/approve/", {"note": "ok"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "approved" and response.json()["nodes"] == ["h100-01"]
    assert reserve_calls["reserve"] == [booking_id]
    assert AuditEvent.objects.filter(action="booking.approve", target_id=booking_id).exists()


def test_members_cannot_book_and_outsiders_do_not_see(world, inventory_whole_nodes, api_client_for):
    payload = {"team": "vision", "gpu_type": "a100", "gpus": 4, "start": day_at(9).isoformat(), "end": day_at(10).isoformat()}
    assert api_client_for("member").post("/api/v1/bookings/", payload, format="json").status_code == 403
    assert api_client_for("outsider").post("/api/v1/bookings/", payload, format="json").status_code == 400
    assert api_client_for("finance").post("/api/v1/bookings/", payload, format="json").status_code == 403


def test_cancel_frees_capacity_and_deletes_the_reservation(world, inventory_whole_nodes, reserve_calls, django_capture_on_commit_callbacks):
    booking = book(world, day_at(9), day_at(10), gpus=8)
    Booking.objects.filter(pk=booking.pk).update(reservation_state=ReservationState.ACTIVE)
    with django_capture_on_commit_callbacks(execute=True):
        booking_cancel(booking=booking, actor=world.bob)
    booking.refresh_from_db()
    assert booking.status == BookingStatus.CANCELLED and booking.reservation_state == ReservationState.DELETING
    assert reserve_calls["unreserve"] == [str(booking.pk)]
    book(world, day_at(9), day_at(10), gpus=8)  # the capacity is free again
    with pytest.raises(Conflict):
        booking_cancel(booking=booking, actor=world.bob)


# ---------------------------------------------------------------- budgets and charges


def test_booked_gpu_hours_clips_to_the_range(world, inventory_whole_nodes, reserve_calls, settings):
    settings.BOOKING_AUTO_APPROVE_GPU_HOURS = 8
    book(world, day_at(9), day_at(11), actor=world.bob)  # 8 GPU-h, approved
    book(world, day_at(12), day_at(15), actor=world.bob)  # 12 GPU-h, requested: counts nothing
    assert booked_gpu_hours(team=world.vision, start=day_at(10), end=day_at(23)) == Decimal(4)
    assert booked_gpu_hours(team=world.vision, start=day_at(0), end=day_at(23), gpu_type="h100") == 0
    assert booked_gpu_hours(team=world.nlp, start=day_at(0), end=day_at(23)) == 0


def test_reserved_mode_charges_the_booking_not_the_usage_inside(world, inventory_whole_nodes, reserve_calls, settings):
    from accounting.models import Rate

    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), effective_from=dt.date(2020, 1, 1))
    book(world, day_at(9), day_at(11))
    (line,) = booking_charges(start_at=day_at(0), end_at=day_at(23), team=world.vision)
    assert line["gpu_hours"] == Decimal("8.00") and line["cost"] == Decimal("80.00")
    settings.BOOKING_CHARGE_MODE = "used"
    (line,) = booking_charges(start_at=day_at(0), end_at=day_at(23), team=world.vision)
    assert line["cost"] == Decimal("0.00")


def test_usage_in_a_booking_is_linked_and_free_in_reserved_mode(world, inventory_whole_nodes, reserve_calls):
    from accounting.models import Rate, UsageRecord
    from accounting.services import usage_records_upsert
    from portal.slurm import AccountingRecord

    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), effective_from=dt.date(2020, 1, 1))
    booking = book(world, day_at(9), day_at(11))
    t = day_at(9)
    records = [
        AccountingRecord(job_id=7000 + i, name="j", user="alice", account="vision", partition="gpu", state="COMPLETED",
                         exit_code=0, submit_time=t, start_time=t, end_time=t + dt.timedelta(hours=1), elapsed_seconds=3600,
                         time_limit_minutes=60, num_nodes=1, nodes="a100-01", alloc_tres={"gres/gpu": 4, "gres/gpu:a100": 4},
                         req_tres={"gres/gpu": 4}, comment="", reservation=resv)
        for i, resv in enumerate([booking.reservation_name, ""])
    ]  # fmt: skip
    usage_records_upsert(records=records)
    inside, outside = UsageRecord.objects.get(job_id=7000), UsageRecord.objects.get(job_id=7001)
    assert inside.booking_id == booking.pk and inside.reservation == booking.reservation_name
    assert outside.booking_id is None
    assert sum(s.cost for s in inside.slices.all()) == 0
    assert sum(s.cost for s in outside.slices.all()) == Decimal("40")


# ---------------------------------------------------------------- jobs into a booking


def test_job_submit_checks_the_booking(world, inventory_whole_nodes, reserve_calls, relays, unix_users):
    from jobs.services import job_submit

    booking = book(world, timezone.now(), timezone.now() + dt.timedelta(hours=1), gpu_type="h100")
    common = dict(user=world.alice, team=world.vision, name="in-booking", script="true", partition="gpu", gpus=4)
    with pytest.raises(ApplicationError) as info:  # reservation not made yet
        job_submit(**common, gpu_type="h100", time_limit_minutes=10, booking=booking.pk)
    assert "booking" in info.value.errors
    Booking.objects.filter(pk=booking.pk).update(reservation_state=ReservationState.ACTIVE)
    with pytest.raises(ApplicationError) as info:
        job_submit(**common, gpu_type="a100", time_limit_minutes=10, booking=booking.pk)
    assert "gpu_type" in info.value.errors
    with pytest.raises(ApplicationError) as info:
        job_submit(**common, gpu_type="h100", time_limit_minutes=120, booking=booking.pk)
    assert "time_limit_minutes" in info.value.errors
    with pytest.raises(ApplicationError):  # another team's booking
        job_submit(**{**common, "user": world.carol, "team": world.nlp}, gpu_type="h100", time_limit_minutes=10, booking=booking.pk)
    job, created = job_submit(**common, gpu_type="h100", time_limit_minutes=10, booking=booking.pk)
    assert created and job.booking_id == booking.pk
    from jobs.services import _submission_for

    assert _submission_for(job).reservation == booking.reservation_name


# ---------------------------------------------------------------- several clusters


def test_each_cluster_books_its_own_gpus(world, inventory_whole_nodes, reserve_calls, settings):
    """A second cluster with one 4×a100 node: the default cluster full does not make it full, and
    a booking there gets its node and its cluster; the availability is each cluster's own."""
    from accounting.selectors import booking_availability
    from portal.models import TeamClusterAccount
    from portal.services import cluster_row, clusters_record
    from portal.slurm import ClusterConfig

    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(settings.SLURM_CLUSTER, "cli"), ClusterConfig("east", "cli"))
    clusters_record()
    east = cluster_row("east")
    TeamClusterAccount.objects.create(team=world.vision, cluster=east, slurm_account="vision-east")
    NodeInfo.objects.create(cluster=east, name="a100-01", state="IDLE", partitions=["gpu"], gpu_type="a100", gpus_total=4,
                            cpus_total=32, memory_mb=256000, seen_at=timezone.now())  # fmt: skip
    here = settings.SLURM_CLUSTER  # both clusters have a100: the booking names its cluster
    booking_create(team=world.vision, gpu_type="a100", gpus=8, start=day_at(9), end=day_at(12), actor=world.admin,
                   cluster=here)  # every a100 of the default cluster  # fmt: skip
    with pytest.raises(Conflict):
        booking_create(team=world.vision, gpu_type="a100", gpus=4, start=day_at(10), end=day_at(11), actor=world.admin,
                       cluster=here)  # fmt: skip
    there = booking_create(team=world.vision, gpu_type="a100", gpus=4, start=day_at(10), end=day_at(11), actor=world.admin,
                           cluster="east")  # fmt: skip
    assert (there.cluster_id, there.nodes) == (east.pk, ["a100-01"])
    with pytest.raises(Conflict, match="4 of 4 GPUs already booked"):
        booking_create(team=world.vision, gpu_type="a100", gpus=4, start=day_at(10), end=day_at(11), actor=world.admin, cluster="east")
    with pytest.raises(ApplicationError) as info:
        booking_create(team=world.vision, gpu_type="a100", gpus=4, start=day_at(10), end=day_at(11), actor=world.admin, cluster="west")
    assert "cluster" in info.value.errors
    default = {r["gpu_type"]: r for r in booking_availability(start=day_at(9), end=day_at(12))}
    assert default["a100"]["capacity"] == 8 and {s["free"] for s in default["a100"]["steps"]} == {0}
    other = {r["gpu_type"]: r for r in booking_availability(start=day_at(10), end=day_at(11), cluster="east")}
    assert other["a100"]["capacity"] == 4 and other["a100"]["steps"][0]["booked"] == 4
