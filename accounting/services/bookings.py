"""Bookings: GPUs of one type reserved for a team over a window — create, approve, reject, cancel,
with the capacity rule and the budget check. Making and deleting the Slurm reservations is
accounting.services.reservations; reads (visibility, availability, charges) are
accounting.selectors.bookings."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
import zlib
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounting.calendar import billing_date, billing_midnight, billing_zone
from accounting.charging import bookings_charge_reserved
from accounting.models import Booking, BookingStatus, Quota, QuotaState, ReservationState
from accounting.selectors.bookings import booking_load_steps
from accounting.selectors.budgets import budget_rows, quotas_effective
from accounting.services.budget import no_quota, no_quota_unlimited, over_budget
from portal import money
from portal.exceptions import ApplicationError, Conflict
from portal.models import Cluster, NodeInfo, Team, default_cluster_id
from portal.outbox import after_commit
from portal.roles import is_admin, is_manager
from portal.selectors import team_cluster_accounts
from portal.services import audit_record, cluster_row
from portal.slurm import SlurmError, get_gateway, slurm_clusters

logger = logging.getLogger(__name__)

# Capacity rule: at no instant may the APPROVED bookings of a GPU type hold more GPUs than the
# available nodes of that type have (NodeInfo: available=True, gpus_total, as sync_cluster last read
# them). REQUESTED bookings hold nothing; they are checked when made (so a hopeless request is refused
# at once) and again, under the lock, when an admin approves them. The check is the PEAK of the
# overlapping bookings' load over the window (a sweep over their start/end events), made under a
# per-GPU-type transaction-scoped advisory lock, so two bookings of the same type never both pass.
# On Slurm releases that cannot reserve GPU counts (22.05) a booking is whole nodes: the nodes are
# chosen in the same locked transaction among nodes of the type that no overlapping approved booking
# holds, so the node choice and the capacity check always agree.

BOOKING_LOCK_NAMESPACE = 0x6270  # "bp": first key of pg_advisory_xact_lock(int, int)
BOOKING_PAST_GRACE = dt.timedelta(minutes=5)  # a window may start this much before now (form latency)


def _booking_lock(gpu_type: str, cluster: Cluster) -> None:
    """Serialise capacity decisions for one GPU type of one cluster until the transaction ends."""
    key = zlib.crc32(f"{cluster.name}/{gpu_type}".encode() if not cluster.is_default else gpu_type.encode()) - 2**31
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [BOOKING_LOCK_NAMESPACE, key])


def bookings_whole_nodes(cluster: Cluster | None = None) -> bool:
    """True when bookings on ``cluster`` (None: the default one) must be whole nodes (its gateway
    cannot reserve GPU counts). The gateway's own answer (one ``sinfo --version``, cached by the
    gateway); whole nodes when Slurm is unreachable (the safe choice: whole-node bookings work on
    every release)."""
    choice = getattr(settings, "BOOKING_RESERVE_WHOLE_NODES", "auto")
    if choice in ("yes", "no"):
        return choice == "yes"
    try:
        return not get_gateway(cluster.name if cluster is not None else None).reservations_support_gpu_counts
    except SlurmError:
        return True


@dataclass(frozen=True)
class TypeCapacity:
    """Bookable GPUs of one type: the available nodes that have them."""

    gpu_type: str
    nodes: tuple  # NodeInfo rows, by name
    gpus_total: int
    gpus_per_node: int  # the smallest node's GPUs: the unit of whole-node bookings


def type_capacity(gpu_type: str, cluster: Cluster | None = None) -> TypeCapacity:
    """The bookable GPUs of a type on one cluster (None: the default cluster)."""
    cluster_id = cluster.pk if cluster is not None else default_cluster_id()
    nodes = tuple(
        NodeInfo.objects.filter(cluster_id=cluster_id, gpu_type=gpu_type, available=True, gpus_total__gt=0).order_by("name")
    )
    return TypeCapacity(
        gpu_type=gpu_type,
        nodes=nodes,
        gpus_total=sum(n.gpus_total for n in nodes),
        gpus_per_node=min((n.gpus_total for n in nodes), default=0),
    )


def _approved_overlapping(gpu_type: str, start: dt.datetime, end: dt.datetime, *, cluster: Cluster, exclude=None):
    queryset = Booking.objects.filter(cluster=cluster, gpu_type=gpu_type, status=BookingStatus.APPROVED, start__lt=end,
                                      end__gt=start)  # fmt: skip
    if exclude is not None:
        queryset = queryset.exclude(pk=exclude)
    return list(queryset.only("pk", "gpus", "start", "end", "nodes"))


def _window_text(a: dt.datetime, b: dt.datetime) -> str:
    zone = billing_zone()
    a, b = a.astimezone(zone), b.astimezone(zone)
    end_format = "%H:%M" if a.date() == b.date() else "%Y-%m-%d %H:%M"
    return f"{a:%Y-%m-%d %H:%M}–{b.strftime(end_format)} {a.tzname()}"


def _capacity_check(
    *, gpu_type: str, gpus: int, start: dt.datetime, end: dt.datetime, cluster: Cluster, exclude=None
) -> list[str]:
    """Raise Conflict (409) naming the first window where ``gpus`` more would exceed the bookable
    GPUs of the type on the cluster; returns the nodes to reserve (whole-node mode) or []. Call
    under _booking_lock."""
    capacity = type_capacity(gpu_type, cluster)
    overlapping = _approved_overlapping(gpu_type, start, end, cluster=cluster, exclude=exclude)
    for a, b, load in booking_load_steps(overlapping, start=start, end=end):
        if load + gpus > capacity.gpus_total:
            # widen to the whole stretch where this booking does not fit
            stretch_end = b
            for c, d, more in booking_load_steps(overlapping, start=b, end=end):
                if more + gpus <= capacity.gpus_total:
                    break
                stretch_end = d
            message = f"{gpu_type}: {load} of {capacity.gpus_total} GPUs already booked {_window_text(a, stretch_end)}"
            if load < capacity.gpus_total:
                message += f" (only {capacity.gpus_total - load} free)"
            raise Conflict(message, errors={"start": [message], "gpus": [message]})
    if not bookings_whole_nodes(cluster):
        return []
    taken = {name for booking in overlapping for name in (booking.nodes or [])}
    free = [n for n in capacity.nodes if n.name not in taken]
    free.sort(key=lambda n: (n.gpus_allocated > 0, n.name))  # idle nodes first
    chosen, covered = [], 0
    for node in free:
        if covered >= gpus:
            break
        chosen.append(node.name)
        covered += node.gpus_total
    if covered < gpus:
        message = (
            f"{gpu_type}: GPUs are free at every moment of {_window_text(start, end)}, but not {gpus} on whole nodes "
            "free for the whole window; shorten or split the booking"
        )
        raise Conflict(message, errors={"start": [message], "gpus": [message]})
    return sorted(chosen)


def _validate_booking_input(
    *, team: Team | None, gpu_type: str, gpus, start, end, now: dt.datetime, cluster: Cluster
) -> tuple[str, int]:
    errors: dict[str, list[str]] = {}
    if team is None:
        errors["team"] = ["No such team."]
    elif not team.active:
        errors["team"] = [f"Team {team.name} is inactive."]
    gpu_type = (gpu_type or "").strip()
    capacity = type_capacity(gpu_type, cluster) if gpu_type else None
    if not gpu_type:
        errors["gpu_type"] = ["This field is required."]
    elif not capacity.nodes:
        known = sorted(set(
            NodeInfo.objects.filter(cluster=cluster, gpus_total__gt=0).exclude(gpu_type="").values_list("gpu_type", flat=True)
        ))  # fmt: skip
        errors["gpu_type"] = [f"No available {gpu_type} GPUs on the cluster (types: {', '.join(known) or 'none'})."]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        errors["gpus"] = ["Give a whole number of GPUs, at least 1."]
    elif capacity is not None and capacity.nodes:
        if gpus > capacity.gpus_total:
            errors["gpus"] = [f"The cluster has {capacity.gpus_total} bookable {gpu_type} GPUs."]
        elif bookings_whole_nodes(cluster) and gpus % capacity.gpus_per_node:
            errors["gpus"] = [
                f"must be a multiple of {capacity.gpus_per_node} (whole nodes) on this cluster: "
                f"Slurm here reserves whole {gpu_type} nodes of {capacity.gpus_per_node} GPUs."
            ]
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, dt.datetime) or timezone.is_naive(value):
            errors[name] = ["Give a date and time with a time zone."]
    if "start" not in errors and "end" not in errors:
        if end <= start:
            errors["end"] = ["The end must be after the start."]
        elif end - start < dt.timedelta(minutes=settings.BOOKING_MIN_MINUTES):
            errors["end"] = [f"Book at least {settings.BOOKING_MIN_MINUTES} minutes."]
        elif end - start > dt.timedelta(days=settings.BOOKING_MAX_DAYS):
            errors["end"] = [f"Book at most {settings.BOOKING_MAX_DAYS} days at once."]
        if start < now - BOOKING_PAST_GRACE:
            errors["start"] = ["The window must not start in the past."]
    if errors:
        first = next(iter(errors.values()))[0]
        name = next(iter(errors))
        raise ApplicationError(f"The booking cannot be made: {name} {first}", errors=errors)
    return gpu_type, gpus


def _lock_team(team: Team | None) -> None:
    """Lock the team row until the transaction ends: the first lock of booking_create/booking_approve,
    taken in the same order as budget_holds_place (team, then anything else; its FOR KEY SHARE
    conflicts with this FOR UPDATE), so that a booking and a job submission of one team are
    serialised and never both spend the last of its budget."""
    if team is not None:
        Team.objects.select_for_update().filter(pk=team.pk).first()


def _booking_budget_check(*, team: Team, gpu_type: str, gpus: int, start: dt.datetime, end: dt.datetime,
                          now: dt.datetime) -> None:  # fmt: skip
    """Refuse (Conflict, 409, with the figures) a booking whose reserved GPU-hours do not fit the
    team's budget. When bookings are charged by their reserved hours (BOOKING_CHARGE_MODE=reserved),
    an approved booking's GPU-hours count as "booked" against every quota that applies — the any-type
    quota and its GPU type's — each for the part of the window inside the quota's period
    (accounting.selectors.budget_rows). The quotas in force at the start, and at each quota period
    boundary inside the window, are checked. Without an applicable quota at the start,
    QUOTA_NO_QUOTA_POLICY decides, as for jobs — unless the team has a quota now and the booking
    starts on a later day whose period has none yet (a manager books next month before its quota
    is approved). Call under the team row lock (_lock_team)."""
    if not bookings_charge_reserved():
        return  # only use is charged: jobs in the booking meet the budget when they are submitted
    points = {start}
    bounds = Quota.objects.filter(team=team, state=QuotaState.APPROVED, period_start__lte=billing_date(end),
                                  period_end__gt=billing_date(start)).values_list("period_start", "period_end")  # fmt: skip
    for first, last in bounds:
        for day in (first, last):
            if start < (moment := billing_midnight(day)) < end:
                points.add(moment)
    def in_force_at(moment):
        return [q for (_, kind), q in quotas_effective(team=team, at=moment, fresh=True).items() if kind in ("", gpu_type)]

    applicable: dict[int, object] = {}
    for moment in sorted(points):
        in_force = in_force_at(moment)
        if moment == start and not in_force:
            if no_quota_unlimited():
                return
            if billing_date(start) > billing_date(now) and in_force_at(now):
                # budgeted now, no quota yet for the booking's (later) period: nothing to check it
                # against; its hours count as booked against the quota approved for that period
                continue
            raise no_quota(team=team, what=f"GPU quota covering {gpu_type} GPUs", when=f"on {billing_date(start):%Y-%m-%d}")
        applicable.update((q.pk, q) for q in in_force)
    for row in budget_rows(sorted(applicable.values(), key=lambda q: (q.period_start, q.gpu_type)), at=now):
        quota = row["quota"]
        lo = max(start, billing_midnight(quota.period_start))
        hi = min(end, billing_midnight(quota.period_end))
        if hi <= lo:
            continue
        needs = money.gpu_hours(gpus * int((hi - lo).total_seconds()))
        if needs > row["remaining"]:
            raise over_budget(row=row, needs=needs, subject="the booking ", measure="The booking needs", span="window",
                              fix={"end": ["Book fewer GPUs or a shorter window."]})  # fmt: skip


def enqueue_booking_task(task_name: str, booking_id) -> None:
    """Enqueue a reservation task after commit (the outbox; booking_cleanup_task is its sweeper)."""
    after_commit(f"accounting.tasks.{task_name}", str(booking_id))


def bookable_cluster(name: str | None) -> Cluster:
    """The Cluster row of a configured cluster by name (None or "": the default one), for the
    bookings' API and pages. ApplicationError (400 naming ``cluster`` and the configured clusters)
    for a name the portal does not serve."""
    name = (name or "").strip()
    try:
        row = cluster_row(name or None)
    except KeyError:
        row = None
    if row is None or row.kind != "slurm":  # a Kubernetes cluster has no reservations
        known = ", ".join(c.name for c in slurm_clusters())
        why = "bookings are Slurm reservations; " if row is not None else ""
        message = f"No such cluster: {name!r} ({why}clusters: {known})."
        raise ApplicationError(message, errors={"cluster": [message]}) from None
    return row


def _booking_cluster(*, team: Team | None, gpu_type: str, cluster: str | None) -> Cluster:
    """Where a booking is made: the cluster named; without one, the default cluster when the portal
    serves one, else the one cluster whose available nodes have GPUs of the type (400 naming
    ``cluster`` and the candidates when several have; the default cluster when none has: the type is
    then refused there). 400 naming ``cluster`` for an unknown cluster, or one where the team has no
    Slurm account (the default cluster: always Team.slurm_account; another: a TeamClusterAccount)."""
    configs = slurm_clusters()  # bookings are Slurm reservations
    if (cluster or "").strip():
        row = bookable_cluster(cluster)
    elif len(configs) == 1:
        return cluster_row()
    else:
        gpu_type = (gpu_type or "").strip()
        names = sorted(set(
            NodeInfo.objects.filter(cluster__active=True, cluster__name__in=[c.name for c in configs], gpu_type=gpu_type,
                                    available=True, gpus_total__gt=0).values_list("cluster__name", flat=True)
        )) if gpu_type else []  # fmt: skip
        if len(names) > 1:
            message = f"{gpu_type} GPUs are on several clusters ({', '.join(names)}); name one."
            raise ApplicationError(f"The booking cannot be made: {message}", errors={"cluster": [message]})
        row = cluster_row(names[0] if names else None)
    if team is not None and row.name != configs[0].name and row.name not in team_cluster_accounts(team):
        message = f"Team {team.name} has no Slurm account on cluster {row.name!r}."
        raise ApplicationError(f"The booking cannot be made: {message}", errors={"cluster": [message]})
    return row


def booking_create(
    *, team: Team | None, gpu_type: str, gpus: int, start: dt.datetime, end: dt.datetime, note: str = "",
    actor, request=None, now: dt.datetime | None = None, cluster: str | None = None,
):  # fmt: skip
    """Book ``gpus`` GPUs of ``gpu_type`` for the team over [start, end). The team's managers and
    admins may book. Bookings of at most BOOKING_AUTO_APPROVE_GPU_HOURS GPU-hours (and every booking an
    admin makes) are approved at once and reserved in Slurm after commit; larger ones wait for an
    admin (``booking_approve``). ApplicationError (400) on bad input, Conflict (409) naming the window
    when the GPUs are not free. ``cluster``: whose GPUs (a configured name; None: the one cluster
    that has the GPU type, see _booking_cluster); capacity is each cluster's own."""
    now = now or timezone.now()
    if team is not None and not (is_admin(actor) or is_manager(actor, team)):
        raise ApplicationError(
            "Only the team's managers and admins may book GPUs.",
            errors={"team": [f"You are not a manager of team {team.name}."]}, status_code=403,
        )  # fmt: skip
    cluster_obj = _booking_cluster(team=team, gpu_type=gpu_type, cluster=cluster)
    gpu_type, gpus = _validate_booking_input(team=team, gpu_type=gpu_type, gpus=gpus, start=start, end=end, now=now,
                                             cluster=cluster_obj)  # fmt: skip
    start = max(start, now)  # a window starting within the grace period starts now
    booking_id = uuid.uuid4()
    booking = Booking(
        id=booking_id, team=team, cluster=cluster_obj, gpu_type=gpu_type, gpus=gpus, start=start, end=end, note=(note or "")[:200],
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
        reservation_name=Booking.reservation_name_for(booking_id),
    )  # fmt: skip
    auto = is_admin(actor) or booking.gpu_hours <= Decimal(settings.BOOKING_AUTO_APPROVE_GPU_HOURS)
    with transaction.atomic():
        # lock order: the team row (as budget_holds_place does for job submissions), then the type
        _lock_team(team)
        _booking_lock(gpu_type, cluster_obj)
        nodes = _capacity_check(gpu_type=gpu_type, gpus=gpus, start=start, end=end, cluster=cluster_obj)
        _booking_budget_check(team=team, gpu_type=gpu_type, gpus=gpus, start=start, end=end, now=now)
        if auto:
            booking.status = BookingStatus.APPROVED
            booking.auto_approved = True
            booking.approved_at = booking.decided_at = now
            booking.nodes = nodes
            booking.reservation_state = ReservationState.PENDING
            booking.reservation_updated_at = now
        booking.save(force_insert=True)
        audit_record(
            actor=actor, action="booking.create", target=booking, team=team, request=request,
            data={"cluster": cluster_obj.name, "gpu_type": gpu_type, "gpus": gpus, "start": start.isoformat(), "end": end.isoformat(),
                  "gpu_hours": str(booking.gpu_hours), "status": booking.status, "nodes": booking.nodes},
        )  # fmt: skip
        if auto:
            enqueue_booking_task("booking_reserve_task", booking.pk)
    return booking


def _locked_booking(booking_id):
    """The booking row, locked, with its team row locked first (FOR UPDATE, as _lock_team): every
    change the budget counts is made under the team's lock, which the budget check waits for
    (accounting.services.budget_holds_place), and in the same order everywhere (team, then booking)."""
    team_id = Booking.objects.filter(pk=booking_id).values_list("team_id", flat=True).first()
    if team_id is not None:
        Team.objects.select_for_update().filter(pk=team_id).first()
    return Booking.objects.select_for_update().select_related("team", "cluster").get(pk=booking_id)


def booking_approve(*, booking, actor, note: str = "", request=None, now: dt.datetime | None = None):
    """An admin approves a REQUESTED booking: the capacity is checked again under the type's lock
    (409 naming the window when it does not fit any more), nodes are chosen, and the Slurm reservation
    is made after commit."""
    if not is_admin(actor):
        raise ApplicationError("Only admins approve bookings.", status_code=403)
    now = now or timezone.now()
    with transaction.atomic():
        # lock order: the team row (as budget_holds_place does for job submissions), then the type,
        # then the booking row
        _lock_team(booking.team)
        _booking_lock(booking.gpu_type, booking.cluster)
        booking = _locked_booking(booking.pk)
        if booking.status != BookingStatus.REQUESTED:
            raise Conflict(f"The booking is {booking.get_status_display().lower()}, not awaiting approval.",
                           errors={"status": [booking.status]})  # fmt: skip
        if booking.end <= now:
            raise Conflict("The booking's window has passed.", errors={"end": ["The window has passed."]})
        start = max(booking.start, now)
        nodes = _capacity_check(gpu_type=booking.gpu_type, gpus=booking.gpus, start=start, end=booking.end,
                                cluster=booking.cluster, exclude=booking.pk)  # fmt: skip
        _booking_budget_check(team=booking.team, gpu_type=booking.gpu_type, gpus=booking.gpus, start=booking.start,
                              end=booking.end, now=now)  # fmt: skip
        booking.status = BookingStatus.APPROVED
        booking.approved_at = booking.decided_at = now
        booking.decided_by = actor
        booking.decision_note = (note or "")[:500]
        booking.nodes = nodes
        booking.reservation_state = ReservationState.PENDING
        booking.reservation_updated_at = now
        booking.save(update_fields=["status", "approved_at", "decided_at", "decided_by", "decision_note", "nodes", "reservation_state", "reservation_updated_at"])
        audit_record(actor=actor, action="booking.approve", target=booking, team=booking.team, request=request,
                     data={"nodes": nodes, "note": booking.decision_note})  # fmt: skip
        enqueue_booking_task("booking_reserve_task", booking.pk)
    return booking


def booking_reject(*, booking, actor, note: str = "", request=None, now: dt.datetime | None = None):
    if not is_admin(actor):
        raise ApplicationError("Only admins reject bookings.", status_code=403)
    now = now or timezone.now()
    with transaction.atomic():
        booking = _locked_booking(booking.pk)
        if booking.status != BookingStatus.REQUESTED:
            raise Conflict(f"The booking is {booking.get_status_display().lower()}, not awaiting approval.",
                           errors={"status": [booking.status]})  # fmt: skip
        booking.status = BookingStatus.REJECTED
        booking.decided_at = now
        booking.decided_by = actor
        booking.decision_note = (note or "")[:500]
        booking.save(update_fields=["status", "decided_at", "decided_by", "decision_note"])
        audit_record(actor=actor, action="booking.reject", target=booking, team=booking.team, request=request,
                     data={"note": booking.decision_note})  # fmt: skip
    return booking


def booking_cancel(*, booking, actor, request=None, now: dt.datetime | None = None):
    """The team's managers or an admin cancel a requested or approved booking that has not ended. Its
    reservation is deleted after commit; the part of an active booking before now stays charged."""
    if not (is_admin(actor) or is_manager(actor, booking.team)):
        raise ApplicationError("Only the team's managers and admins may cancel its bookings.", status_code=403)
    now = now or timezone.now()
    with transaction.atomic():
        booking = _locked_booking(booking.pk)
        if booking.status not in (BookingStatus.REQUESTED, BookingStatus.APPROVED):
            raise Conflict(f"The booking is already {booking.get_status_display().lower()}.", errors={"status": [booking.status]})
        if booking.end <= now:
            raise Conflict("The booking has ended.", errors={"end": ["The booking has ended."]})
        booking.status = BookingStatus.CANCELLED
        booking.cancelled_at = now
        booking.cancelled_by = actor
        fields = ["status", "cancelled_at", "cancelled_by"]
        state = booking.reservation_state
        if state in (ReservationState.ACTIVE, ReservationState.DELETING):
            booking.reservation_state = ReservationState.DELETING
            enqueue_booking_task("booking_unreserve_task", booking.pk)
        elif state in (ReservationState.PENDING, ReservationState.FAILED):
            booking.reservation_state = ReservationState.DELETED  # nothing in Slurm (the claim needs APPROVED)
        # CREATING: booking_reserve_run sees the cancellation after its Slurm call and deletes it
        booking.reservation_updated_at = now
        booking.save(update_fields=[*fields, "reservation_state", "reservation_updated_at"])
        audit_record(actor=actor, action="booking.cancel", target=booking, team=booking.team, request=request,
                     data={"reservation_state": booking.reservation_state})  # fmt: skip
    return booking
