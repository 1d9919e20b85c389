"""Reads of bookings: the capacity they hold (the load sweep shared with the capacity rule of
accounting.services.bookings), visibility, the job form's picker, availability, the check that a job
may run in a booking, and what bookings are charged."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from accounting.calendar import billing_date, billing_midnight, month_start, next_month
from accounting.charging import bookings_charge_reserved
from accounting.models import Booking, BookingStatus, ReservationState
from accounting.rates import RateBook
from portal import money
from portal.exceptions import ApplicationError
from portal.models import NodeInfo, Team
from portal.selectors import teams_user_can_submit_to, teams_visible_to
from portal.slurm import cluster_config


def booking_load_steps(bookings, *, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime, int]]:
    """The GPUs the bookings hold over [start, end), as consecutive (from, to, gpus) steps covering
    the whole range (a sweep over their clipped start/end events). Steps with equal load are merged."""
    events: dict[dt.datetime, int] = {start: 0, end: 0}
    for booking in bookings:
        lo, hi = max(booking.start, start), min(booking.end, end)
        if hi <= lo:
            continue
        events[lo] = events.get(lo, 0) + booking.gpus
        events[hi] = events.get(hi, 0) - booking.gpus
    points = sorted(events)
    steps: list[tuple[dt.datetime, dt.datetime, int]] = []
    load = 0
    for a, b in zip(points, points[1:]):
        load += events[a]
        if steps and steps[-1][2] == load and steps[-1][1] == a:
            steps[-1] = (steps[-1][0], b, load)
        else:
            steps.append((a, b, load))
    return steps


def bookings_holding_capacity(*, start: dt.datetime, end: dt.datetime, gpu_type: str | None = None, team: Team | None = None):
    """Bookings that held (or hold) capacity during part of [start, end): approved ones, and the part
    before cancellation of approved bookings cancelled after they started. One query; evaluate
    ``held_until`` on each row for the exact end."""
    queryset = Booking.objects.filter(
        status__in=[BookingStatus.APPROVED, BookingStatus.CANCELLED],
        approved_at__isnull=False,
        start__lt=end,
        end__gt=start,
    )
    if gpu_type:
        queryset = queryset.filter(gpu_type=gpu_type)
    if team is not None:
        queryset = queryset.filter(team=team)
    return queryset


def booked_gpu_hours(*, team: Team, start: dt.datetime, end: dt.datetime, gpu_type: str | None = None) -> Decimal:
    """GPU-hours the team's approved bookings reserve within [start, end) (aware datetimes), each
    booking's window clipped to the range. Counted from the moment a booking is approved (upcoming,
    active and ended bookings alike); requested, rejected and cancelled-before-start bookings count
    nothing; a booking cancelled while active counts up to its cancellation. ``gpu_type`` narrows to
    one type. One query. Exact to the second (not rounded)."""
    if timezone.is_naive(start) or timezone.is_naive(end):
        raise ValueError("aware datetimes are needed")
    if end <= start:
        return Decimal("0")
    seconds = 0
    for booking in bookings_holding_capacity(start=start, end=end, gpu_type=gpu_type, team=team).only(
        "gpus", "start", "end", "status", "approved_at", "cancelled_at"
    ):
        held_until = booking.held_until
        if held_until is None:
            continue
        lo, hi = max(booking.start, start), min(held_until, end)
        if hi > lo:
            seconds += booking.gpus * int((hi - lo).total_seconds())
    return money.gpu_hours(seconds)


def bookings_visible_to(user) -> QuerySet:
    """Admins and finance see every booking; everyone else their teams' bookings (the teams rule)."""
    return Booking.objects.filter(team__in=teams_visible_to(user)).select_related("team", "created_by")


def bookings_usable_by(user, *, team: Team | None = None, now: dt.datetime | None = None) -> QuerySet:
    """Approved, reserved bookings that have not ended, of the teams the user may submit to: the
    job form's booking picker."""
    now = now or timezone.now()
    queryset = Booking.objects.filter(
        team__in=teams_user_can_submit_to(user), status=BookingStatus.APPROVED,
        reservation_state=ReservationState.ACTIVE, end__gt=now,
    ).select_related("team")  # fmt: skip
    if team is not None:
        queryset = queryset.filter(team=team)
    return queryset.order_by("start")


def booking_availability(
    *, start: dt.datetime, end: dt.datetime, gpu_type: str | None = None, cluster: str | None = None
) -> list[dict]:
    """Bookable GPUs of one cluster (None: the default one) over [start, end) per GPU type: capacity
    (GPUs on available nodes of the type) minus what approved bookings there hold, as a step function
    [{start, end, free, booked}] covering the range (equal steps merged). Two queries."""
    where = {"cluster__name": cluster or cluster_config().name}
    nodes = NodeInfo.objects.filter(available=True, gpus_total__gt=0, **where).exclude(gpu_type="")
    if gpu_type:
        nodes = nodes.filter(gpu_type=gpu_type)
    capacity: dict[str, list[int]] = {}
    for node in nodes:
        capacity.setdefault(node.gpu_type, []).append(node.gpus_total)
    bookings = Booking.objects.filter(
        gpu_type__in=list(capacity), status=BookingStatus.APPROVED, start__lt=end, end__gt=start, **where
    ).only("gpu_type", "gpus", "start", "end")
    by_type: dict[str, list] = {}
    for booking in bookings:
        by_type.setdefault(booking.gpu_type, []).append(booking)
    result = []
    for name in sorted(capacity):
        total = sum(capacity[name])
        steps = [
            {"start": a, "end": b, "free": max(total - load, 0), "booked": load}
            for a, b, load in booking_load_steps(by_type.get(name, []), start=start, end=end)
        ]
        result.append({"gpu_type": name, "capacity": total, "gpus_per_node": min(capacity[name]), "steps": steps})
    return result


def booking_check_for_job(*, booking_id, team: Team, gpu_type: str, gpus: int, time_limit_minutes: int,
                          now: dt.datetime | None = None, cluster: str | None = None):  # fmt: skip
    """The booking a job is submitted into, when it may run there: it belongs to the job's team, is
    on the job's cluster (``cluster``, a name; None: not checked), approved with its reservation in
    Slurm, has the job's GPU type and at least its GPUs, and the job (starting now, or at the
    booking's start if later) ends by the booking's end. ApplicationError (400, field "booking", or
    the job field at fault) otherwise."""
    now = now or timezone.now()
    booking = Booking.objects.filter(pk=booking_id, team=team).select_related("cluster").first()

    def refuse(message: str, field: str = "booking"):
        raise ApplicationError(f"The job cannot run in this booking: {message}", errors={field: [message]})

    if booking is None:
        refuse(f"no such booking of team {team.name}.")
    if cluster and cluster != booking.cluster.name:
        refuse(f"the booking is on cluster {booking.cluster.name!r}, the job on {cluster!r}; set cluster to "
               f"{booking.cluster.name!r}.", "cluster")  # fmt: skip
    if booking.status != BookingStatus.APPROVED:
        refuse(f"the booking is {booking.get_status_display().lower()}.")
    if booking.end <= now:
        refuse("the booking has ended.")
    if booking.reservation_state != ReservationState.ACTIVE:
        refuse(f"its Slurm reservation is not ready ({booking.get_reservation_state_display().lower()}); try again shortly.")
    if gpu_type != booking.gpu_type:
        refuse(f"the booking is for {booking.gpu_type} GPUs; set gpu_type to {booking.gpu_type}.", "gpu_type")
    if gpus > booking.gpus:
        refuse(f"the booking holds {booking.gpus} GPUs.", "gpus")
    starts = max(now, booking.start)
    room = int((booking.end - starts).total_seconds() // 60)
    if time_limit_minutes > room:
        refuse(f"the job must end by the booking's end: at most {room} minutes.", "time_limit_minutes")
    return booking


def booking_charges(*, start_at: dt.datetime, end_at: dt.datetime, team: Team | None = None) -> list[dict]:
    """What bookings are charged within [start_at, end_at): every GPU-hour they held (approved, up to
    their end or cancellation), priced at the generic rate of their GPU type in force (split at rate
    changes). Zero cost when BOOKING_CHARGE_MODE=used (then only usage is charged). One line per booking
    with gpu_hours, cost, and the booking. Two queries."""
    bookings = list(
        bookings_holding_capacity(start=start_at, end=end_at, team=team).select_related("team", "cluster").order_by("start")
    )
    return _charge_lines(bookings, RateBook.load({b.gpu_type for b in bookings}), start_at=start_at, end_at=end_at)


def booking_charges_by_month(*, start_at: dt.datetime, end_at: dt.datetime, team: Team | None = None) -> list[tuple[str, dict]]:
    """``booking_charges`` month by month (billing calendar) over [start_at, end_at): ("YYYY-MM", line)
    pairs, each month's lines what ``booking_charges`` gives for its part of the range. The bookings
    are read once for the whole range (two queries, whatever the number of months)."""
    bookings = list(
        bookings_holding_capacity(start=start_at, end=end_at, team=team).select_related("team", "cluster").order_by("start")
    )
    book = RateBook.load({b.gpu_type for b in bookings})
    pieces, month = [], month_start(billing_date(start_at))
    while billing_midnight(month) < end_at:
        lo, hi = max(billing_midnight(month), start_at), min(billing_midnight(next_month(month)), end_at)
        pieces += [(month.strftime("%Y-%m"), line) for line in _charge_lines(bookings, book, start_at=lo, end_at=hi)]
        month = next_month(month)
    return pieces


def _charge_lines(bookings: list, book: RateBook, *, start_at: dt.datetime, end_at: dt.datetime) -> list[dict]:
    """The charge lines of ``bookings`` within [start_at, end_at) (those outside it give none)."""
    reserved = bookings_charge_reserved()
    lines = []
    for booking in bookings:
        held_until = booking.held_until
        if held_until is None:
            continue
        lo, hi = max(booking.start, start_at), min(held_until, end_at)
        if hi <= lo:
            continue
        cuts = [lo, *book.change_points(booking.gpu_type, "", lo, hi), hi]
        priced, price, unpriced = [], None, False
        for a, b in zip(cuts, cuts[1:]):
            rate = book.rate_at(booking.gpu_type, "", a)  # bookings are priced at the generic rate
            if rate is None:
                unpriced = True
                continue
            price = rate.price_per_gpu_hour
            priced.append((booking.gpus * int((b - a).total_seconds()), price))
        seconds = booking.gpus * int((hi - lo).total_seconds())
        cost = money.total_cost(priced)  # exact GPU-second × price products, divided once
        lines.append({
            "booking": booking,
            "team": booking.team,
            "cluster": booking.cluster.name,
            "gpu_type": booking.gpu_type,
            "gpus": booking.gpus,
            "start": lo,
            "end": hi,
            "gpu_hours": money.display(money.gpu_hours(seconds)),
            "price": price,
            "unpriced": unpriced,
            "cost": money.display(cost if reserved else 0),
        })  # fmt: skip
    return lines
