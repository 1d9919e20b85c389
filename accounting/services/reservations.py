"""The Slurm reservations of bookings: made after approval (``booking_reserve_run``, the task
booking_reserve_task), deleted after cancellation or end (``booking_unreserve_run``), and the periodic
``booking_cleanup`` that retries what was left behind. Each claims its row by a conditional update
and calls Slurm outside any transaction."""

from __future__ import annotations

import datetime as dt

from django.db.models import Q
from django.utils import timezone

from accounting.models import Booking, BookingStatus, ReservationState
from accounting.services.bookings import enqueue_booking_task
from portal.outbox import publish
from portal.services import audit_record
from portal.selectors import team_cluster_accounts
from portal.slurm import ReservationSpec, SlurmRejected, SlurmUnavailable, get_gateway

RESERVE_LEASE = dt.timedelta(minutes=5)


def booking_reserve_run(booking_id) -> str:
    """Make the Slurm reservation of an approved booking (what ``booking_reserve_task`` does).
    Claims PENDING → CREATING (conditional update), calls Slurm outside any transaction, records the
    outcome. Idempotent through the reservation's name: a rerun after a crash finds it in Slurm.
    Raises SlurmUnavailable (state back to PENDING) for the task to retry."""
    now = timezone.now()
    claimed = Booking.objects.filter(
        Q(reservation_state=ReservationState.PENDING)
        | Q(reservation_state=ReservationState.CREATING, reservation_updated_at__lt=now - RESERVE_LEASE),
        pk=booking_id, status=BookingStatus.APPROVED,
    ).update(reservation_state=ReservationState.CREATING, reservation_updated_at=now)  # fmt: skip
    if not claimed:
        return "not-claimed"
    booking = Booking.objects.select_related("team", "cluster").get(pk=booking_id)
    if booking.end <= now:
        _reservation_state(booking, ReservationState.DELETED, "The window passed before the reservation was made.")
        return "ended"
    gateway = get_gateway(booking.cluster.name)  # the booked cluster's, under the team's account there
    account = team_cluster_accounts(booking.team).get(booking.cluster.name, booking.team.slurm_account)
    spec = ReservationSpec(
        name=booking.reservation_name,
        start=max(booking.start, now),
        end=booking.end,
        accounts=(account,),
        nodes=tuple(booking.nodes),
        tres={} if booking.nodes else {f"gres/gpu:{booking.gpu_type}": booking.gpus},
        # IGNORE_JOBS: jobs already running on the nodes (or holding them by time limit) must not make
        # the reservation fail; the scheduler starts nothing new there that would overlap the window
        flags=("IGNORE_JOBS",),
    )
    try:
        gateway.reservation_create(spec)
        outcome = "created"
    except SlurmUnavailable as exc:
        _reservation_state(booking, ReservationState.PENDING, f"Slurm unavailable: {exc.message}", expect=ReservationState.CREATING)
        raise
    except SlurmRejected as exc:
        try:
            exists = any(r.name == booking.reservation_name for r in gateway.reservation_list())
        except SlurmUnavailable:
            _reservation_state(booking, ReservationState.PENDING, f"Slurm unavailable: {exc.message}", expect=ReservationState.CREATING)
            raise
        if not exists:
            _reservation_state(booking, ReservationState.FAILED, exc.message, expect=ReservationState.CREATING)
            audit_record(actor=None, action="booking.reservation_failed", target=booking, team=booking.team,
                         data={"error": exc.message[:500]})  # fmt: skip
            return "failed"
        outcome = "adopted"  # made by an earlier run that died before recording it
    _reservation_state(booking, ReservationState.ACTIVE, "", expect=ReservationState.CREATING)
    audit_record(actor=None, action="booking.reserve", target=booking, team=booking.team,
                 data={"reservation": booking.reservation_name, "nodes": booking.nodes, "outcome": outcome})  # fmt: skip
    booking.refresh_from_db(fields=["status"])
    if booking.status != BookingStatus.APPROVED:  # cancelled while Slurm was creating it
        Booking.objects.filter(pk=booking.pk, reservation_state=ReservationState.ACTIVE).update(
            reservation_state=ReservationState.DELETING, reservation_updated_at=timezone.now()
        )
        enqueue_booking_task("booking_unreserve_task", booking.pk)
        return "cancelled"
    return outcome


def _reservation_state(booking, state: str, error: str, *, expect: str | None = None) -> bool:
    query = Booking.objects.filter(pk=booking.pk)
    if expect is not None:
        query = query.filter(reservation_state=expect)
    return bool(query.update(reservation_state=state, reservation_error=error[:4000], reservation_updated_at=timezone.now()))


def booking_unreserve_run(booking_id) -> str:
    """Delete the Slurm reservation of a cancelled (or ended) booking: DELETING → DELETED. Deleting a
    reservation that is gone is not an error, so reruns are harmless. SlurmUnavailable: retried."""
    booking = (
        Booking.objects.filter(pk=booking_id, reservation_state=ReservationState.DELETING).select_related("team", "cluster").first()
    )
    if booking is None:
        return "not-claimed"
    try:
        get_gateway(booking.cluster.name).reservation_delete(booking.reservation_name)
    except SlurmRejected as exc:
        # "Requested reservation is in use": Slurm keeps a reservation while jobs run in it; it stays
        # DELETING and booking_cleanup tries again each minute (the jobs end by the booking's end)
        _reservation_state(booking, ReservationState.DELETING, exc.message, expect=ReservationState.DELETING)
        return "in-use"
    if _reservation_state(booking, ReservationState.DELETED, "", expect=ReservationState.DELETING):
        audit_record(actor=None, action="booking.unreserve", target=booking, team=booking.team,
                     data={"reservation": booking.reservation_name})  # fmt: skip
    return "deleted"


def booking_cleanup(*, now: dt.datetime | None = None) -> dict:
    """Periodic: delete reservations of cancelled and ended bookings that still exist in Slurm (one
    ``reservation_list``), retry deletions and creations left behind (broker down, worker lost)."""
    now = now or timezone.now()
    stale = now - dt.timedelta(minutes=1)
    done = {"deleted": 0, "marked": 0, "requeued": 0}
    # ended bookings: Slurm removes ended reservations itself; delete any left and mark them
    ended = list(Booking.objects.filter(reservation_state=ReservationState.ACTIVE, end__lte=now).select_related("cluster"))
    leftover = list(Booking.objects.filter(reservation_state=ReservationState.DELETING, reservation_updated_at__lt=stale)
                    .select_related("cluster"))  # fmt: skip
    in_slurm: dict[str, set[str]] = {}  # one reservation_list per cluster that has any
    for booking in ended + leftover:
        name = booking.cluster.name
        if name not in in_slurm:
            in_slurm[name] = {r.name for r in get_gateway(name).reservation_list()}
    if ended or leftover:
        for booking in ended + leftover:
            if booking.reservation_name in in_slurm[booking.cluster.name]:
                try:
                    get_gateway(booking.cluster.name).reservation_delete(booking.reservation_name)
                except SlurmRejected as exc:  # jobs still run in it: next time
                    _reservation_state(booking, ReservationState.DELETING, exc.message)
                    continue
                done["deleted"] += 1
            _reservation_state(booking, ReservationState.DELETED, "", expect=booking.reservation_state)
            done["marked"] += 1
    # creations never run (enqueue lost) or stuck
    for booking_id in Booking.objects.filter(
        Q(reservation_state=ReservationState.PENDING) | Q(reservation_state=ReservationState.CREATING, reservation_updated_at__lt=now - RESERVE_LEASE),
        status=BookingStatus.APPROVED, end__gt=now,
    ).filter(Q(reservation_updated_at__isnull=True) | Q(reservation_updated_at__lt=stale)).values_list("pk", flat=True):  # fmt: skip
        done["requeued"] += publish("accounting.tasks.booking_reserve_task", str(booking_id))  # not published: the next cleanup
    return done

