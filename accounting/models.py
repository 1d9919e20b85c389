"""Accounting: GPU-hour rates (effective-dated), ingested usage records (one per Slurm job
allocation) and their calendar-month slices with cost."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models

from portal import models as portal_models
from portal import money
from portal.snapshots import BOOKINGS, QUOTAS, RATES, USAGE_MONTHS, SnapshotManager


class Rate(models.Model):
    """Price of one GPU-hour of a GPU type, from ``effective_from`` (a date; the rate starts at 00:00
    UTC of that day) until the next row of the same (gpu_type, partition). Rows are never edited:
    a price change is a new row, so history is kept. ``partition=""`` is the generic rate; a
    partition-specific rate wins over it."""

    objects = SnapshotManager(RATES)

    gpu_type = models.CharField(max_length=32, help_text="Slurm GRES type, e.g. a100.")
    partition = models.CharField(max_length=64, blank=True, help_text="Empty: every partition.")
    price_per_gpu_hour = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(Decimal("0"))]
    )
    currency = models.CharField(max_length=3, default="CNY")
    effective_from = models.DateField()
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = portal_models.user_reference()

    class Meta:
        ordering = ["gpu_type", "partition", "-effective_from"]
        constraints = [
            # also the index of gpu_hour_price(): gpu_type=…, partition IN (…, ''), effective_from <= …
            models.UniqueConstraint(fields=["gpu_type", "partition", "effective_from"], name="rate_unique_type_partition_from"),
            models.CheckConstraint(condition=models.Q(price_per_gpu_hour__gte=0), name="rate_price_not_negative"),
        ]

    def __str__(self) -> str:
        where = f"/{self.partition}" if self.partition else ""
        return f"{self.gpu_type}{where} {self.price_per_gpu_hour} {self.currency}/GPU-h from {self.effective_from}"


class UsageRecord(models.Model):
    """One Slurm job allocation (``sacct -X``) that started, as last read from slurmdbd. Keyed by
    (cluster, job_id, submit_time): Slurm reuses job ids after a state wipe, and a requeued job gets a
    new submit time. Jobs that never started used nothing and are not recorded. Re-ingesting a record
    whose values did not change writes nothing."""

    cluster = models.CharField(max_length=64)
    job_id = models.BigIntegerField()
    submit_time = models.DateTimeField()
    start_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)  # None while running
    state = models.CharField(max_length=32)
    name = models.CharField(max_length=200, blank=True)
    account = models.CharField(max_length=64)
    team = models.ForeignKey("portal.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    unix_user = models.CharField(max_length=64)
    user = portal_models.user_reference()
    partition = models.CharField(max_length=64, blank=True)
    num_nodes = models.PositiveIntegerField(default=1)
    comment = models.CharField(max_length=500, blank=True)
    # the portal's jobs.Job pk when the comment carries "gpuportal:<uuid>"; no FK so that usage outlives
    # deleted jobs and does not depend on the jobs app's migrations (see accounting.selectors.jobs_by_uuid)
    portal_job_uuid = models.UUIDField(null=True, blank=True)
    # sacct's Reservation, and the booking whose reservation it is: usage inside a booking (the
    # booking carries the charge in BOOKING_CHARGE_MODE="reserved"; budgets must not count it twice)
    reservation = models.CharField(max_length=64, blank=True)
    booking = models.ForeignKey("accounting.Booking", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_records")
    gpus = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=32, blank=True)
    elapsed_seconds = models.PositiveBigIntegerField(default=0)
    time_limit_minutes = models.PositiveIntegerField(null=True, blank=True)  # None = unlimited
    gpu_seconds = models.PositiveBigIntegerField(default=0)  # exact: gpus × (end or now − start)
    gpu_hours = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    requested_gpu_hours = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    provisional = models.BooleanField(default=False)  # still running: figures grow until it ends
    # What share of its GPU-time the GPUs computed (mean utilisation / 100, from the site's GPU
    # monitoring: accounting.services.usage_busy_record); null: not monitored. Busy GPU-hours =
    # gpu_hours x this; the cost of idle GPU-hours = cost x (1 - this) (accounting.selectors.usage).
    gpu_busy_fraction = models.DecimalField(max_digits=7, decimal_places=6, null=True, blank=True)
    # until when the figures are known: end_time once finished, the reading time while running
    # (usage_ingest re-reads from the oldest recent provisional record)
    known_until = models.DateTimeField()
    first_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["-start_time"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "job_id", "submit_time"], name="usagerecord_unique_job"),
        ]
        indexes = [
            # invoices: records of one team whose slices fall in a month (team=…, start_time < …)
            models.Index(fields=["team", "start_time"], name="usagerecord_team_start"),
            # usage_ingest: the oldest provisional record (provisional=True, known_until > …)
            models.Index(fields=["provisional", "known_until"], name="usagerecord_provisional"),
            # links from the jobs app: usage of one portal job
            models.Index(fields=["portal_job_uuid"], name="usagerecord_portal_job"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster}:{self.job_id} ({self.account}, {self.gpu_hours} GPU-h)"


class UsageSlice(models.Model):
    """The part of a record that falls in one calendar month (billing time zone = settings.TIME_ZONE)
    and under one rate: a rate change inside a month splits the slice at the change. Within a slice
    GPU count and price are constant, so any sub-range of it is priced exactly by proportion (reports
    over arbitrary date ranges rely on that). Team, account, user, GPU type and partition are copied
    from the record so that cost_report is one aggregate over this table."""

    record = models.ForeignKey(UsageRecord, on_delete=models.CASCADE, related_name="slices")
    period = models.DateField(help_text="First day of the month (billing time zone).")
    slice_start = models.DateTimeField()
    slice_end = models.DateTimeField()
    cluster = models.CharField(max_length=64)
    account = models.CharField(max_length=64)
    team = models.ForeignKey("portal.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    unix_user = models.CharField(max_length=64)
    gpu_type = models.CharField(max_length=32, blank=True)
    partition = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField()
    gpu_seconds = models.PositiveBigIntegerField()
    requested_gpu_seconds = models.PositiveBigIntegerField()
    rate = models.ForeignKey(Rate, null=True, blank=True, on_delete=models.PROTECT, related_name="slices")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)  # None: unpriced
    cost = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal("0"))
    provisional = models.BooleanField(default=False)

    class Meta:
        ordering = ["slice_start"]
        constraints = [
            models.UniqueConstraint(fields=["record", "slice_start"], name="usageslice_unique_record_start"),
            models.CheckConstraint(condition=models.Q(slice_end__gt=models.F("slice_start")), name="usageslice_not_empty"),
        ]
        indexes = [
            # cost_report(): period BETWEEN … AND … (then slice_end > start, slice_start < end),
            # grouped by account / unix_user / gpu_type / period
            models.Index(fields=["period", "account", "gpu_type"], name="usageslice_report"),
            # team_usage(): team=…, period BETWEEN …
            models.Index(fields=["team", "period"], name="usageslice_team_period"),
            # usage_reprice(): gpu_type=…, slice_end >= effective_from
            models.Index(fields=["gpu_type", "slice_end"], name="usageslice_type_end"),
        ]

    def __str__(self) -> str:
        return f"{self.record_id} {self.period:%Y-%m} {self.gpu_seconds} GPU-s"


class UsageMonth(models.Model):
    """A closed month's roll-up state (accounting.services.usage_rollup): ``rolled_at`` when its
    UsageMonthTotal rows were last written from the slices; ``stale`` when a slice of the month was
    written since (a late record, a re-pricing: accounting.services.repricing.slices_replace marks it in
    the same transaction). Reports and invoices read the totals of a month only while it is rolled and
    not stale, the slices otherwise; the next roll-up run writes it again. One row per month;
    kept in each process (portal.snapshots USAGE_MONTHS: reports ask on every request, it changes a
    few times a month)."""

    objects = SnapshotManager(USAGE_MONTHS)

    period = models.DateField(unique=True, help_text="First day of the month (billing time zone).")
    rolled_at = models.DateTimeField(null=True, blank=True)  # None: never rolled
    stale = models.BooleanField(default=True)
    revised_at = models.DateTimeField(null=True, blank=True)  # last re-roll that changed the month's totals
    slices = models.PositiveIntegerField(default=0)  # how many slices the totals sum

    class Meta:
        ordering = ["period"]

    def __str__(self) -> str:
        return f"{self.period:%Y-%m} {'stale' if self.stale else 'rolled'}"


class UsageMonthTotal(models.Model):
    """The sums of a closed month's slices per team × account × user × cluster × GPU type × rate
    (accounting.services.usage_rollup): what the cost report and the invoice read for a whole closed
    month instead of its slices. Sums are exact (GPU-seconds whole, costs the slices' six-place costs
    added); the busy and idle figures are the products the report computes per slice, added."""

    period = models.DateField()
    team = models.ForeignKey("portal.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    account = models.CharField(max_length=64)
    unix_user = models.CharField(max_length=64)
    cluster = models.CharField(max_length=64)
    gpu_type = models.CharField(max_length=32, blank=True)
    rate = models.ForeignKey(Rate, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    slices = models.PositiveIntegerField()
    gpu_seconds = models.DecimalField(max_digits=30, decimal_places=0)
    requested_gpu_seconds = models.DecimalField(max_digits=30, decimal_places=0)
    unpriced_gpu_seconds = models.DecimalField(max_digits=30, decimal_places=0)
    cost = models.DecimalField(max_digits=30, decimal_places=6)
    monitored_gpu_seconds = models.DecimalField(max_digits=30, decimal_places=0)
    busy_gpu_seconds = models.DecimalField(max_digits=36, decimal_places=6)  # gpu_seconds × busy fraction
    idle_cost = models.DecimalField(max_digits=36, decimal_places=12)  # cost × (1 − busy fraction)
    provisional = models.BooleanField(default=False)

    class Meta:
        indexes = [
            # cost_report()/usage_by_team_and_month(): period IN (…), grouped by a column
            models.Index(fields=["period", "account"], name="usagemonthtotal_period"),
            # invoice(): team=…, period=…
            models.Index(fields=["team", "period"], name="usagemonthtotal_team_period"),
        ]

    def __str__(self) -> str:
        return f"{self.period:%Y-%m} {self.account}/{self.unix_user} {self.gpu_type} {self.gpu_seconds} GPU-s"


class PendingReprice(models.Model):
    """Re-pricing owed: the usage of ``gpu_type`` from ``since`` on is to be priced again because a
    rate starting that day was added (accounting.services.rate_create writes this row in the rate's
    transaction). The re-pricing (accounting.services.usage_reprice_pending) deletes the rows it
    covered; the sweeper (usage_reprice_sweep) re-enqueues those a lost task left. ``started_at`` is
    the lease of a run under way: the sweeper leaves the row alone while it is recent. The table only
    holds work not done yet (a few rows): no index beyond the key."""

    gpu_type = models.CharField(max_length=32)
    since = models.DateField()
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"re-price {self.gpu_type} from {self.since}"


# ---------------------------------------------------------------- bookings and quotas: an admin's decision


class AdminDecision(models.Model):
    """The admin's decision on a request (a booking, a quota): who decided and when, and when it
    was approved (kept when the row moves on: a booking cancelled, a quota superseded; a quota is
    in force from then). The decision services (``booking_approve``/``booking_reject``,
    ``quota_approve``/``quota_reject``) set them."""

    decided_by = portal_models.user_reference()
    decided_at = models.DateTimeField(null=True, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


# ---------------------------------------------------------------- bookings


class BookingStatus(models.TextChoices):
    """A booking's decision state. Whether it is upcoming, active or ended follows from its window
    (``Booking.phase``). Only APPROVED bookings hold capacity; REQUESTED ones are checked again when
    an admin approves them."""

    REQUESTED = "requested", "Awaiting approval"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"


class ReservationState(models.TextChoices):
    """The booking's Slurm reservation, as the booking tasks last left it."""

    NONE = "none", "None"  # not approved (yet)
    PENDING = "pending", "Being created"  # approved; booking_reserve is queued or retrying
    CREATING = "creating", "Creating"  # claimed by booking_reserve (the Slurm call runs)
    ACTIVE = "active", "In Slurm"
    FAILED = "failed", "Failed"  # Slurm refused it (reservation_error says why)
    DELETING = "deleting", "Being deleted"
    DELETED = "deleted", "Deleted"


class Booking(AdminDecision):
    """GPUs of one type booked by a team for a time window. Approved bookings become a Slurm
    reservation (``reservation_name``) for the team's account: on Slurm releases that cannot reserve
    GPU counts the reservation covers whole nodes (``nodes``) and ``gpus`` is a multiple of a node's
    GPUs. The capacity rule (peak of approved bookings ≤ GPUs of the type) lives in
    ``accounting.services.booking_create`` / ``booking_approve``."""

    objects = SnapshotManager(BOOKINGS)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey("portal.Team", on_delete=models.PROTECT, related_name="bookings")
    # the cluster whose GPUs it books (its reservation lives there); capacity is counted per cluster
    cluster = models.ForeignKey("portal.Cluster", on_delete=models.PROTECT, related_name="bookings",
                                default=portal_models.default_cluster_id)  # fmt: skip
    gpu_type = models.CharField(max_length=32)
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    start = models.DateTimeField()
    end = models.DateTimeField()
    note = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=BookingStatus.choices, default=BookingStatus.REQUESTED)
    auto_approved = models.BooleanField(default=False)
    created_by = portal_models.user_reference()
    created_at = models.DateTimeField(auto_now_add=True)
    decision_note = models.CharField(max_length=500, blank=True)
    cancelled_by = portal_models.user_reference()
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Slurm side
    reservation_name = models.CharField(max_length=64, unique=True)  # gpuportal-<first 12 hex of id>
    nodes = models.JSONField(default=list, blank=True)  # whole nodes reserved ([] with GPU-count reservations)
    reservation_state = models.CharField(max_length=16, choices=ReservationState.choices, default=ReservationState.NONE)
    reservation_error = models.TextField(blank=True)
    reservation_updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["start", "created_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(end__gt=models.F("start")), name="booking_end_after_start"),
            models.CheckConstraint(condition=models.Q(gpus__gte=1), name="booking_gpus_positive"),
        ]
        indexes = [
            # capacity check and availability: gpu_type=…, status='approved', start < …, end > …
            models.Index(fields=["gpu_type", "status", "start"], name="booking_type_status_start"),
            # booked_gpu_hours() and the team's list: team=…, status IN (…), start < …
            models.Index(fields=["team", "status", "start"], name="booking_team_status_start"),
            # booking_cleanup: reservation_state IN ('active', …), end <= now / status='cancelled'
            models.Index(fields=["reservation_state", "end"], name="booking_resv_state_end"),
        ]

    def __str__(self) -> str:
        return f"{self.reservation_name} {self.gpus}×{self.gpu_type} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}"

    @staticmethod
    def reservation_name_for(booking_id: uuid.UUID) -> str:
        return f"gpuportal-{booking_id.hex[:12]}"

    @property
    def hours(self) -> Decimal:
        return money.gpu_hours(Decimal((self.end - self.start).total_seconds()))

    @property
    def gpu_hours(self) -> Decimal:
        """The window's GPU-hours as shown (messages, the audit trail): hundredths, half up, from the exact
        GPU-seconds."""
        return money.display(money.gpu_hours(self.gpus * Decimal((self.end - self.start).total_seconds())))

    @property
    def held_until(self) -> dt.datetime | None:
        """End of the part of the window the booking held capacity (and is charged for): its end, or
        when it was cancelled if that was earlier; None when it never held capacity."""
        if self.approved_at is None or self.status not in (BookingStatus.APPROVED, BookingStatus.CANCELLED):
            return None
        if self.status == BookingStatus.CANCELLED:
            until = min(self.end, self.cancelled_at or self.start)
            return until if until > self.start else None
        return self.end

    def phase(self, now: dt.datetime) -> str:
        """upcoming / active / ended by the window (cancelled/rejected bookings have none)."""
        if now < self.start:
            return "upcoming"
        return "active" if now < self.end else "ended"


# ---------------------------------------------------------------- quotas


class QuotaState(models.TextChoices):
    """A quota's decision state. Only APPROVED quotas count; a newer approved quota for the same team,
    GPU type and period moves the older one to SUPERSEDED (history is kept: rows are never deleted)."""

    REQUESTED = "requested", "Awaiting approval"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    SUPERSEDED = "superseded", "Superseded"
    CANCELLED = "cancelled", "Cancelled"


# The largest cap on GPUs in use at once a quota may set (the column holds 2^31 - 1; no cluster has 100 000 GPUs).
QUOTA_MAX_GPUS = 100_000


class Quota(AdminDecision):
    """A team's GPU-hour budget for a period [period_start, period_end) (dates, billing time zone;
    a calendar month by default), for one GPU type or for any (``gpu_type=""``), with an optional cap
    on GPUs in use at once. Managers request, admins approve or reject (``accounting.services``);
    approved quotas are mirrored to the team's Slurm account (GrpTRESMins / GrpTRES)."""

    objects = SnapshotManager(QUOTAS)

    team = models.ForeignKey("portal.Team", on_delete=models.PROTECT, related_name="quotas")
    gpu_type = models.CharField(max_length=32, blank=True, help_text="Empty: every GPU type.")
    period_start = models.DateField()
    period_end = models.DateField(help_text="Exclusive: the day after the period's last day.")
    gpu_hours = models.DecimalField(max_digits=12, decimal_places=2, validators=[MinValueValidator(Decimal("0"))])
    max_gpus = models.PositiveIntegerField(null=True, blank=True, help_text="GPUs in use at once; empty: no cap.")
    state = models.CharField(max_length=16, choices=QuotaState.choices, default=QuotaState.REQUESTED)
    justification = models.TextField(blank=True)
    requested_by = portal_models.user_reference()
    requested_at = models.DateTimeField(auto_now_add=True)
    decision_comment = models.CharField(max_length=1000, blank=True)
    superseded_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    slurm_mirrored_at = models.DateTimeField(null=True, blank=True)  # last successful quota_limits_apply

    class Meta:
        ordering = ["-period_start", "team", "gpu_type", "-requested_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(period_end__gt=models.F("period_start")), name="quota_period_not_empty"),
            models.CheckConstraint(condition=models.Q(gpu_hours__gte=0), name="quota_gpu_hours_not_negative"),
            # at most one approved quota per team, GPU type and period (approval supersedes the older)
            models.UniqueConstraint(
                fields=["team", "gpu_type", "period_start", "period_end"],
                condition=models.Q(state="approved"),
                name="quota_one_approved_per_period",
            ),
        ]
        indexes = [
            # quotas_effective(): team=…, state='approved', period_start <= today (then period_end > today)
            models.Index(fields=["team", "state", "period_start"], name="quota_team_state_start"),
            # the admins' queue: state='requested'
            models.Index(fields=["state", "requested_at"], name="quota_state_requested"),
        ]

    def __str__(self) -> str:
        return f"{self.team} {self.gpu_type or 'any'} {self.period_label} {self.gpu_hours} GPU-h ({self.state})"

    @property
    def period_label(self) -> str:
        """"2026-12" for a calendar month, else "2026-12-01 – 2026-12-14" (inclusive last day)."""
        start, end = self.period_start, self.period_end
        if start.day == 1 and end == dt.date(start.year + (start.month == 12), start.month % 12 + 1, 1):
            return f"{start:%Y-%m}"
        return f"{start:%Y-%m-%d} – {end - dt.timedelta(days=1):%Y-%m-%d}"

    @property
    def slurm_tres(self) -> str:
        """The TRES this quota limits in Slurm: gres/gpu or gres/gpu:<type>."""
        return f"gres/gpu:{self.gpu_type}" if self.gpu_type else "gres/gpu"


class BudgetAlert(models.Model):
    """A team crossed ``threshold`` % of a quota (used + booked). One row per (quota, threshold): the
    unique constraint makes the alert fire once, whoever notices first. Delivery is recorded: each
    channel is claimed before it sends (accounting.services.alerts), so a sweep's repeat never sends
    twice."""

    quota = models.ForeignKey(Quota, on_delete=models.CASCADE, related_name="alerts")
    threshold = models.PositiveSmallIntegerField()  # percent: 80, 100
    consumed_gpu_hours = models.DecimalField(max_digits=14, decimal_places=2)
    budget_gpu_hours = models.DecimalField(max_digits=12, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)
    emailed_at = models.DateTimeField(null=True, blank=True)
    webhook_delivered_at = models.DateTimeField(null=True, blank=True)
    webhook_error = models.TextField(blank=True)
    # the webhook POST in flight: set by the claim of budget_alert_webhook (with one more attempt),
    # cleared when the POST fails; a claim older than its lease is a dead worker's, taken again
    webhook_claimed_at = models.DateTimeField(null=True, blank=True)
    webhook_attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["quota", "threshold"], name="budgetalert_unique_quota_threshold")]

    def __str__(self) -> str:
        return f"{self.quota_id} {self.threshold}%"


# ---------------------------------------------------------------- budget holds and running totals


class BudgetHold(models.Model):
    """What one portal job holds of its team's budget until its usage is known: placed in the
    transaction that stores the job (accounting.services.budget_holds_place), lowered as the job's
    usage is ingested (the ingested GPU-hours become "used"), released when the job ends without
    running, its submission fails or it is cancelled before it starts (budget_holds_release), or when
    its final usage record arrives. ``job_uuid`` is the jobs app's Job pk, with no foreign key:
    accounting imports nothing of jobs (import-linter); the usage ingestion finds a portal job's
    booking here (``booking``), and a hold that ran keeps holding until its usage is ingested."""

    job_uuid = models.UUIDField(primary_key=True)
    team = models.ForeignKey("portal.Team", on_delete=models.PROTECT, related_name="+")
    # the GPU types whose quotas the hold counts against besides the any-type quota, comma-separated
    # (gpu_types): the type the job asked for; for a job without a type every type it could land on
    # (narrowed to the types Slurm allocated once every task has run); "" = the any-type quota only
    gpu_type = models.CharField(max_length=255, blank=True)
    booking = models.ForeignKey(Booking, null=True, blank=True, on_delete=models.PROTECT, related_name="holds")
    estimated_gpu_hours = models.DecimalField(max_digits=16, decimal_places=6)
    estimated_cost = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    # an array holds per task: ``tasks`` still expected to run (its array tasks, less those the jobs app
    # saw cancelled before they ran), each holding ``task_gpu_hours`` until its final record arrives
    tasks = models.PositiveIntegerField(default=1)
    task_gpu_hours = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    # what the hold counts in the running totals now: per task not final, its estimate minus the
    # GPU-hours ingested for it so far (never below 0); 0 for a job covered by its booking
    # (BOOKING_CHARGE_MODE=reserved) and once released
    held_gpu_hours = models.DecimalField(max_digits=16, decimal_places=6)
    # the job in Slurm (set when the jobs app sees it start): running usage, whose Comment sacct
    # leaves empty until the job ends, is matched to the hold by cluster and job id, if Slurm took it
    # between the hold's creation and ``slurm_id_known_at`` (when the portal learnt the id; an id
    # Slurm reuses after losing its state is handed out later: portal.slurm.tags.record_is_job)
    slurm_cluster = models.CharField(max_length=64, blank=True)
    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    slurm_id_known_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(held_gpu_hours__gte=0), name="budgethold_held_not_negative"),
        ]
        indexes = [
            # seeding a running total: the team's unreleased holds (team=…, released_at IS NULL)
            models.Index(fields=["team", "created_at"], name="budgethold_open", condition=models.Q(released_at__isnull=True)),
            # usage ingestion: the open hold of a running record without its tag (slurm_cluster=…, slurm_job_id IN …)
            models.Index(fields=["slurm_cluster", "slurm_job_id"], name="budgethold_slurm_job",
                         condition=models.Q(released_at__isnull=True, slurm_job_id__isnull=False)),  # fmt: skip
        ]

    def __str__(self) -> str:
        return f"{self.job_uuid} {self.held_gpu_hours}/{self.estimated_gpu_hours} GPU-h"

    @staticmethod
    def types_of(gpu_type: str) -> tuple[str, ...]:
        """The GPU types a hold's ``gpu_type`` names ("a100,h100" -> ("a100", "h100"); "" -> ())."""
        return tuple(t for t in (gpu_type or "").split(",") if t)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return self.types_of(self.gpu_type)


class BudgetTotal(models.Model):
    """The running figures of one team's budget period and GPU type ("" = every type): the key of a
    quota (team, gpu_type, period), shared by a quota and the one that supersedes it. ``held`` is
    the sum of ``held_gpu_hours`` of the team's unreleased holds of that type placed before the
    period ends; ``used`` the GPU-hours ingested in the period (usage inside bookings left out when
    they charge their reserved hours), moved by every ingestion by what it changed (its exact
    GPU-seconds kept beside it: nothing drifts) and checked against the slices by
    budget_totals_check. The budget check of a job
    locks the team's rows (one statement), adds the new holds and compares — no aggregate over live
    jobs or usage under the lock. Built from the usage slices and the holds by the first placement
    that needs it (accounting.services.budget), once per team, type and period."""

    team = models.ForeignKey("portal.Team", on_delete=models.CASCADE, related_name="+")
    gpu_type = models.CharField(max_length=32, blank=True)
    period_start = models.DateField()
    period_end = models.DateField()
    ends_at = models.DateTimeField()  # 00:00 of period_end in the billing time zone
    held_gpu_hours = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    # the exact GPU-seconds ingested in the period, moved by what each ingestion changes
    # (accounting.services.budget.budget_used_change); used_gpu_hours is them in GPU-hours, stored
    used_gpu_seconds = models.DecimalField(max_digits=24, decimal_places=6, default=Decimal("0"))
    used_gpu_hours = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["team", "-period_start", "gpu_type"]
        constraints = [
            models.UniqueConstraint(fields=["team", "gpu_type", "period_start", "period_end"], name="budgettotal_unique_key"),
        ]
        indexes = [
            # the budget check: the team's totals of periods not over yet (team=…, ends_at > now)
            models.Index(fields=["team", "ends_at"], name="budgettotal_team_ends"),
        ]

    def __str__(self) -> str:
        return f"{self.team_id} {self.gpu_type or 'any'} {self.period_start}–{self.period_end}: held {self.held_gpu_hours}, used {self.used_gpu_hours}"


class IdleCancelSaving(models.Model):
    """What a cancel by the team's idle-GPU policy saved (issue 40 item 3): the job's GPUs × the time
    it would still have held them until its time limit, counted from the moment the portal decided to
    cancel it. Exact GPU-seconds (a whole number); money only when a report prices them (the rate
    book at the cancel's time). Written by jobs.services.cancel.job_idle_cancel through
    accounting.services.idle_saving_record, one row per job (no FK: it outlives a deleted job, as
    UsageRecord.portal_job_uuid)."""

    portal_job_uuid = models.UUIDField(unique=True)
    team = models.ForeignKey("portal.Team", on_delete=models.PROTECT, related_name="+")
    cluster = models.CharField(max_length=64, blank=True)
    gpu_type = models.CharField(max_length=32, blank=True)
    gpus = models.PositiveIntegerField()
    gpu_seconds = models.PositiveBigIntegerField()
    idle_since = models.DateTimeField()
    cancelled_at = models.DateTimeField()

    class Meta:
        # the report and the dashboard: a team's savings in a period
        indexes = [models.Index(fields=["team", "cancelled_at"], name="idlesaving_team_at")]

    def __str__(self) -> str:
        return f"idle cancel {self.portal_job_uuid}: {self.gpu_seconds} GPU-s"


class IssuedInvoice(models.Model):
    """A team's invoice for a closed month as it was issued (accounting.services.invoicing.invoice_issue):
    its figures and the PDF sent, never changed afterwards. Usage recorded after the issue (a late
    record, a re-pricing: the month's totals revised) is not billed again on it: the next invoice the
    team is issued carries the difference as an adjustment line (``adjustments``: [{"period":
    "YYYY-MM-DD", "amount": "…"}]), so every GPU-second is billed once and what was sent stays true."""

    team = models.ForeignKey("portal.Team", on_delete=models.PROTECT, related_name="issued_invoices")
    period = models.DateField(help_text="First day of the month (billing time zone).")
    number = models.CharField(max_length=64, unique=True)
    issued_at = models.DateTimeField()
    issued_by = portal_models.user_reference()
    currency = models.CharField(max_length=8)
    usage_cost = models.DecimalField(max_digits=18, decimal_places=2)  # as billed (rounded once, for display)
    bookings_cost = models.DecimalField(max_digits=18, decimal_places=2)
    adjustments_cost = models.DecimalField(max_digits=18, decimal_places=2, default=Decimal("0"))
    total = models.DecimalField(max_digits=18, decimal_places=2)
    adjustments = models.JSONField(default=list, blank=True)
    pdf = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "period"], name="issuedinvoice_team_period")]
        ordering = ["period"]

    def __str__(self) -> str:
        return f"{self.number} ({self.period:%Y-%m})"
