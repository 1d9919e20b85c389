"""The bookings page without Slurm: the calendar partial answering htmx for another week, the
booking form keeping its input with errors beside the fields (whole-node multiple, capacity
conflict naming the window, over budget), the cancel/approve/reject buttons and their routes per
role (database state after refresh_from_db), and the team-row lock booking_create takes first."""

from __future__ import annotations

import datetime as dt
import re
import threading
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test import Client

from accounting.models import Booking, BookingStatus, ReservationState
from accounting.services import booking_create
from portal.exceptions import Conflict
from portal.models import Team
from tests.accounting import test_bookings
from tests.accounting.test_bookings import book, day_at, make_inventory
from tests.factories import QuotaFactory

# the fixtures of the bookings tests (whole-node inventory without Slurm; reservation tasks recorded)
inventory_whole_nodes = test_bookings.inventory_whole_nodes
reserve_calls = test_bookings.reserve_calls

pytestmark = pytest.mark.django_db

URL = "/accounting/bookings/"


def page_as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def local(value: dt.datetime) -> str:
    """A datetime-local input's value (the page's time zone is UTC in these tests)."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M")


def form_data(start: dt.datetime, end: dt.datetime, *, gpus: int = 4, gpu_type: str = "a100", note: str = "page test") -> dict:
    return {"team": "vision", "gpu_type": gpu_type, "gpus": str(gpus), "start": local(start), "end": local(end), "note": note}


def field_group(html: str, name: str) -> str:
    """The HTML of a form field's group (label … input) of the booking form."""
    form = html[html.index('id="booking-form"'):html.index("</form>", html.index('id="booking-form"'))]
    match = re.search(rf'<label for="id_{name}".*?(?=<label for=|<button)', form, re.DOTALL)
    assert match, f"no field group for {name}"
    return match.group(0)


# ---------------------------------------------------------------- the calendar


def test_calendar_answers_an_htmx_request_with_the_partial_for_another_week(world, inventory_whole_nodes, reserve_calls):
    monday = day_at(0, days=0).date() - dt.timedelta(days=day_at(0, days=0).weekday())
    next_week = monday + dt.timedelta(days=7)
    start = dt.datetime.combine(next_week + dt.timedelta(days=2), dt.time(10), tzinfo=dt.UTC)
    book(world, start, start + dt.timedelta(hours=2), gpus=4)
    client = page_as(world.alice)

    response = client.get(URL, {"week": (next_week + dt.timedelta(days=3)).isoformat()}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert [t.name for t in response.templates] == ["partials/accounting_booking_calendar.html"]
    html = response.content.decode()
    assert html.count('id="booking-calendar"') == 1
    assert "<html" not in html and "booking-form" not in html and "booking-table" not in html
    assert f"Week of {next_week:%Y-%m-%d}" in html  # any day of the week: the week from its Monday
    assert f'hx-get="?week={next_week + dt.timedelta(days=7):%Y-%m-%d}"' in html
    assert f'hx-get="?week={monday:%Y-%m-%d}"' in html
    # the booked hours of that week show 4 of 8 a100 GPUs free, the others all 8
    a100 = html[html.index('data-gpu-type="a100"'):html.index("</table>", html.index('data-gpu-type="a100"'))]
    assert f'title="{start:%Y-%m-%d} 10:00: 4 of 8 free">4<' in a100
    assert f'title="{start:%Y-%m-%d} 11:00: 4 of 8 free">4<' in a100
    assert f'title="{start:%Y-%m-%d} 12:00: 8 of 8 free">8<' in a100

    # without htmx the same URL is the whole page
    full = client.get(URL, {"week": next_week.isoformat()})
    assert full.status_code == 200
    assert "accounting/booking_list.html" in [t.name for t in full.templates]
    assert f"Week of {next_week:%Y-%m-%d}" in full.content.decode()


def test_calendar_with_a_bad_week_falls_back_to_this_week(world, inventory_whole_nodes):
    response = page_as(world.alice).get(URL, {"week": "not-a-date"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert b"Week of " in response.content


# ---------------------------------------------------------------- the booking form


def test_members_see_no_form_and_cannot_post_one(world, inventory_whole_nodes, reserve_calls):
    client = page_as(world.alice)
    assert client.get(URL).context["form"] is None
    response = client.post(URL, form_data(day_at(9), day_at(10)))
    assert response.status_code == 403
    assert not Booking.objects.exists() and reserve_calls["reserve"] == []


def test_manager_books_and_is_sent_to_the_week_of_the_booking(world, inventory_whole_nodes, reserve_calls,
                                                             django_capture_on_commit_callbacks):  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        response = page_as(world.bob).post(URL, form_data(day_at(9), day_at(9, 30)))
    booking = Booking.objects.get()
    monday = day_at(9).date() - dt.timedelta(days=day_at(9).weekday())
    assert response.status_code == 302 and response["Location"] == f"{URL}?week={monday:%Y-%m-%d}"
    assert (booking.team, booking.gpus, booking.status, booking.reservation_state, booking.created_by) == (
        world.vision, 4, BookingStatus.APPROVED, ReservationState.PENDING, world.bob)  # fmt: skip
    assert booking.note == "page test" and booking.gpu_hours == Decimal("2.00")
    assert reserve_calls["reserve"] == [str(booking.pk)]


def test_form_keeps_its_input_and_shows_the_whole_node_error_beside_gpus(world, inventory_whole_nodes, reserve_calls):
    data = form_data(day_at(9), day_at(10), gpus=2, note="keep me")
    response = page_as(world.bob).post(URL, data)
    assert response.status_code == 400
    form = response.context["form"]
    assert "must be a multiple of 4 (whole nodes) on this cluster" in form.errors["gpus"][0]
    html = response.content.decode()
    gpus = field_group(html, "gpus")
    assert "must be a multiple of 4 (whole nodes)" in gpus and 'value="2"' in gpus
    assert f'value="{data["start"]}"' in field_group(html, "start")
    assert f'value="{data["end"]}"' in field_group(html, "end")
    assert 'value="keep me"' in field_group(html, "note")
    assert not Booking.objects.exists() and reserve_calls["reserve"] == []


def test_form_shows_the_capacity_conflict_naming_the_window(world, inventory_whole_nodes, reserve_calls):
    book(world, day_at(9), day_at(12), gpus=8)  # every a100 GPU, 09:00-12:00
    data = form_data(day_at(10), day_at(11), gpus=4, note="conflict")
    response = page_as(world.bob).post(URL, data)
    assert response.status_code == 400
    message = f"a100: 8 of 8 GPUs already booked {day_at(10):%Y-%m-%d} 10:00–11:00 UTC"
    form = response.context["form"]
    assert form.errors["start"] == [message] and form.errors["gpus"] == [message]
    html = response.content.decode()
    assert message in field_group(html, "start") and message in field_group(html, "gpus")
    assert f'value="{data["start"]}"' in field_group(html, "start") and 'value="4"' in field_group(html, "gpus")
    assert Booking.objects.count() == 1


def test_booking_over_the_team_budget_is_refused_with_the_figures(world, inventory_whole_nodes, reserve_calls,
                                                                  api_client_for):  # fmt: skip
    """Booked GPU-hours count against the budget (reserved charge mode): a booking that does not fit
    what is left is refused with a 409 naming the figures, on the page beside the GPUs field."""
    start, end = day_at(9, days=1), day_at(11, days=1)  # tomorrow: inside this month or the next
    for day in {start.date().replace(day=1)}:
        nxt = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        QuotaFactory(team=world.vision, gpu_hours=10, period_start=day, period_end=nxt)  # newer: wins
    assert book(world, start, end, gpus=4, actor=world.bob).status == BookingStatus.APPROVED  # 8 of 10 GPU-h

    with pytest.raises(Conflict) as info:
        book(world, start, end, gpus=4, actor=world.admin)  # admins are held to the budget too
    assert info.value.message.startswith("Over budget: the booking needs 8.0 GPU-h; 2.0 of 10.0 GPU-h left for vision")
    assert "booked 8.0" in info.value.message
    response = api_client_for("manager").post("/api/v1/bookings/", {
        "team": "vision", "gpu_type": "h100", "gpus": 4, "start": start.isoformat(), "end": end.isoformat()}, format="json")  # fmt: skip
    assert response.status_code == 409, response.json()
    assert "Over budget" in response.json()["detail"] and "gpus" in response.json()["errors"]

    page = page_as(world.bob).post(URL, form_data(start, end, gpu_type="h100"))
    assert page.status_code == 400
    assert "The booking needs 8.0 GPU-h (GPUs × window); 2.0 GPU-h are left." in field_group(page.content.decode(), "gpus")
    assert Booking.objects.count() == 1


def test_approval_checks_the_budget_again(world, inventory_whole_nodes, reserve_calls, settings):
    from accounting.services import booking_approve

    settings.BOOKING_AUTO_APPROVE_GPU_HOURS = 0
    start, end = day_at(9, days=1), day_at(11, days=1)
    first = start.date().replace(day=1)
    QuotaFactory(team=world.vision, gpu_hours=10, period_start=first, period_end=(first.replace(day=28) + dt.timedelta(days=4)).replace(day=1))
    a = book(world, start, end, gpus=4, actor=world.bob)
    b = book(world, start, end, gpus=4, actor=world.bob, gpu_type="h100")
    assert a.status == b.status == BookingStatus.REQUESTED  # requests hold nothing: both fit alone
    booking_approve(booking=a, actor=world.admin)
    with pytest.raises(Conflict, match="Over budget"):
        booking_approve(booking=b, actor=world.admin)
    b.refresh_from_db()
    assert b.status == BookingStatus.REQUESTED and b.reservation_state == ReservationState.NONE


def test_no_quota_blocks_bookings_like_jobs(world, inventory_whole_nodes, reserve_calls, settings):
    world.vision.quotas.all().delete()
    with pytest.raises(Conflict, match="has no approved GPU quota"):
        book(world, day_at(9), day_at(10), actor=world.bob)
    settings.QUOTA_NO_QUOTA_POLICY = "unlimited"
    assert book(world, day_at(9), day_at(10), actor=world.bob).status == BookingStatus.APPROVED


def test_a_later_period_without_a_quota_yet_is_bookable_by_a_budgeted_team(world, inventory_whole_nodes, reserve_calls):
    """vision has a quota now; a booking in 2099 (no quota for that period yet) is accepted, and its
    hours count as booked once a quota for that period is approved."""
    from accounting.selectors import budget_rows

    start = dt.datetime(2099, 1, 5, 9, tzinfo=dt.UTC)
    booking = book(world, start, start + dt.timedelta(hours=2), actor=world.bob)
    assert booking.status == BookingStatus.APPROVED
    later = QuotaFactory(team=world.vision, gpu_hours=100, period_start=dt.date(2099, 1, 1), period_end=dt.date(2099, 2, 1))
    assert budget_rows([later])[0]["booked"] == Decimal(8)


def test_used_charge_mode_does_not_count_bookings_against_the_budget(world, inventory_whole_nodes, reserve_calls, settings):
    settings.BOOKING_CHARGE_MODE = "used"
    world.vision.quotas.update(gpu_hours=1)
    assert book(world, day_at(9), day_at(11), gpus=8, actor=world.bob).status == BookingStatus.APPROVED


# ---------------------------------------------------------------- the buttons


def buttons(html: str, booking) -> set[str]:
    row = re.search(rf'<tr data-booking="{booking.pk}">.*?</tr>', html, re.DOTALL)
    assert row, "the booking is not listed"
    return set(re.findall(r"<button[^>]*>(\w+)</button>", row.group(0)))


@pytest.fixture
def small(world, inventory_whole_nodes, reserve_calls):
    """An approved (auto) vision booking of one a100 node, its reservation not made yet."""
    return book(world, day_at(9), day_at(10), actor=world.bob)


@pytest.fixture
def large(world, inventory_whole_nodes, reserve_calls):
    """A REQUESTED vision booking: 8 GPUs × 10 h = 80 GPU-h, over the auto-approval threshold (32)."""
    booking = book(world, day_at(8), day_at(18), gpus=8, actor=world.bob)
    assert booking.status == BookingStatus.REQUESTED
    return booking


@pytest.mark.parametrize(("role", "expected"), [
    ("member", set()), ("manager", {"Cancel"}), ("admin", {"Cancel", "Approve", "Reject"}), ("finance", set()),
])  # fmt: skip
def test_buttons_shown_per_role(world, large, role, expected):
    assert buttons(page_as(world.user_for(role)).get(URL).content.decode(), large) == expected


def test_outsiders_and_other_teams_do_not_see_the_booking(world, large):
    for user in (world.outsider, world.dave):
        assert f'data-booking="{large.pk}"' not in page_as(user).get(URL).content.decode()


@pytest.mark.parametrize(("username", "status"), [("alice", 403), ("finn", 403), ("dave", 404), ("outsider", 404)])
def test_others_cannot_cancel(world, small, username, status):
    response = page_as(getattr(world, username)).post(f"{URL}{small.pk}/cancel/")
    assert response.status_code == status
    small.refresh_from_db()
    assert small.status == BookingStatus.APPROVED and small.cancelled_at is None


def test_manager_cancels_their_teams_booking(world, small, reserve_calls, django_capture_on_commit_callbacks):
    client = page_as(world.bob)
    assert client.get(f"{URL}{small.pk}/cancel/").status_code == 405
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"{URL}{small.pk}/cancel/", follow=True)
    assert response.redirect_chain == [(URL, 302)]
    small.refresh_from_db()
    assert (small.status, small.cancelled_by, small.reservation_state) == (
        BookingStatus.CANCELLED, world.bob, ReservationState.DELETED)  # fmt: skip  (nothing was in Slurm yet)
    assert reserve_calls["unreserve"] == []
    assert f"Booking {small.reservation_name}: cancel done." in response.content.decode()
    assert buttons(response.content.decode(), small) == set()
    # cancelling again: the page says why, nothing changes
    again = client.post(f"{URL}{small.pk}/cancel/", follow=True)
    assert "The booking is already cancelled." in again.content.decode()


def test_cancelling_a_reserved_booking_queues_the_deletion(world, small, reserve_calls, django_capture_on_commit_callbacks):
    Booking.objects.filter(pk=small.pk).update(reservation_state=ReservationState.ACTIVE)
    with django_capture_on_commit_callbacks(execute=True):
        assert page_as(world.bob).post(f"{URL}{small.pk}/cancel/").status_code == 302
    small.refresh_from_db()
    assert (small.status, small.reservation_state) == (BookingStatus.CANCELLED, ReservationState.DELETING)
    assert reserve_calls["unreserve"] == [str(small.pk)]


@pytest.mark.parametrize(("username", "status"), [("alice", 403), ("bob", 403), ("finn", 403), ("dave", 404), ("outsider", 404)])
@pytest.mark.parametrize("action", ["approve", "reject"])
def test_only_admins_decide(world, large, username, status, action):
    response = page_as(getattr(world, username)).post(f"{URL}{large.pk}/{action}/", {"note": "x"})
    assert response.status_code == status
    large.refresh_from_db()
    assert large.status == BookingStatus.REQUESTED and large.decided_by is None


def test_admin_approves_a_large_requested_booking(world, large, reserve_calls, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = page_as(world.admin).post(f"{URL}{large.pk}/approve/", {"note": "go"})
    assert response.status_code == 302 and response["Location"] == URL
    large.refresh_from_db()
    assert (large.status, large.decided_by, large.decision_note, large.reservation_state) == (
        BookingStatus.APPROVED, world.admin, "go", ReservationState.PENDING)  # fmt: skip
    assert large.nodes == ["a100-01", "a100-02"] and large.approved_at is not None and not large.auto_approved
    assert reserve_calls["reserve"][-1] == str(large.pk)
    # approving twice: a message, no change
    again = page_as(world.admin).post(f"{URL}{large.pk}/approve/", follow=True)
    assert "not awaiting approval" in again.content.decode()


def test_admin_rejects_a_requested_booking(world, large, reserve_calls):
    before = list(reserve_calls["reserve"])
    assert page_as(world.admin).post(f"{URL}{large.pk}/reject/", {"note": "too big"}).status_code == 302
    large.refresh_from_db()
    assert (large.status, large.decided_by, large.decision_note, large.reservation_state) == (
        BookingStatus.REJECTED, world.admin, "too big", ReservationState.NONE)  # fmt: skip
    assert reserve_calls["reserve"] == before


def test_approval_refused_when_the_gpus_were_taken_meanwhile(world, large, reserve_calls):
    book(world, day_at(12), day_at(13), gpus=4)  # an admin's booking in the middle of the window
    response = page_as(world.admin).post(f"{URL}{large.pk}/approve/", follow=True)
    assert f"a100: 4 of 8 GPUs already booked {day_at(12):%Y-%m-%d} 12:00–13:00 UTC (only 4 free)" in response.content.decode()
    large.refresh_from_db()
    assert large.status == BookingStatus.REQUESTED


# ---------------------------------------------------------------- lock order


def _type_lock_free(gpu_type: str) -> bool:
    import zlib

    from accounting.services import BOOKING_LOCK_NAMESPACE

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [BOOKING_LOCK_NAMESPACE, zlib.crc32(gpu_type.encode()) - 2**31])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_booking_create_waits_for_the_team_row_lock(transactional_db, settings, reserve_calls):
    """booking_create locks the team row first (as job submission's budget_hold_check does): while
    another transaction holds it, the booking waits; it goes through once that one commits."""
    from tests.conftest import World

    settings.BOOKING_RESERVE_WHOLE_NODES = "yes"
    settings.TIME_ZONE = "UTC"
    make_inventory()
    world = World()
    holding, done, outcome = threading.Event(), threading.Event(), {}

    def hold_the_team():
        try:
            with transaction.atomic():
                Team.objects.select_for_update().get(pk=world.vision.pk)
                holding.set()
                done.wait(10)
        finally:
            connection.close()

    def make_booking():
        try:
            outcome["booking"] = booking_create(team=world.vision, gpu_type="a100", gpus=4, start=day_at(9), end=day_at(10),
                                                actor=world.bob)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 (reported by the assertion below)
            outcome["error"] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_team)
    holder.start()
    assert holding.wait(10)
    booker = threading.Thread(target=make_booking)
    booker.start()
    booker.join(1.0)
    assert booker.is_alive() and not Booking.objects.exists(), "booking_create did not wait for the team row lock"
    # it waits BEFORE taking the a100 lock (team first, then the type): the type lock is still free
    assert _type_lock_free("a100"), "booking_create took the GPU type's lock before the team row lock"
    done.set()
    holder.join(10)
    booker.join(10)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["booking"].status == BookingStatus.APPROVED


# ---------------------------------------------------------------- the Django admin


def test_admin_lists_bookings_quotas_alerts_read_only_and_approves_through_the_service(world, large, reserve_calls):
    from accounting.models import BudgetAlert

    quota = world.vision.quotas.get()
    BudgetAlert.objects.create(quota=quota, threshold=80, consumed_gpu_hours=800, budget_gpu_hours=1000)
    client = page_as(world.admin)
    for model in ("booking", "quota", "budgetalert"):
        assert client.get(f"/admin/accounting/{model}/").status_code == 200, model
        assert client.get(f"/admin/accounting/{model}/add/").status_code == 403, model
    page = client.get(f"/admin/accounting/booking/{large.pk}/change/")
    assert page.status_code == 200 and b'name="status"' not in page.content  # read-only
    response = client.post("/admin/accounting/booking/", {"action": "approve_bookings", "_selected_action": [str(large.pk)]})
    assert response.status_code == 302
    large.refresh_from_db()
    assert (large.status, large.decided_by, large.reservation_state) == (BookingStatus.APPROVED, world.admin, ReservationState.PENDING)
    # the same action on a booking no longer awaiting approval changes nothing
    client.post("/admin/accounting/booking/", {"action": "reject_bookings", "_selected_action": [str(large.pk)]})
    large.refresh_from_db()
    assert large.status == BookingStatus.APPROVED
