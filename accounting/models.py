"""Accounting: GPU-hour rates (effective-dated), ingested usage records (one per Slurm job
allocation) and their calendar-month slices with cost."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models


class Rate(models.Model):
    """Price of one GPU-hour of a GPU type, from ``effective_from`` (a date; the rate starts at 00:00
    UTC of that day) until the next row of the same (gpu_type, partition). Rows are never edited:
    a price change is a new row, so history is kept. ``partition=""`` is the generic rate; a
    partition-specific rate wins over it."""

    gpu_type = models.CharField(max_length=32, help_text="Slurm GRES type, e.g. a100.")
    partition = models.CharField(max_length=64, blank=True, help_text="Empty: every partition.")
    price_per_gpu_hour = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(Decimal("0"))]
    )
    currency = models.CharField(max_length=3, default="CNY")
    effective_from = models.DateField()
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

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
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    partition = models.CharField(max_length=64, blank=True)
    num_nodes = models.PositiveIntegerField(default=1)
    comment = models.CharField(max_length=500, blank=True)
    # the portal's jobs.Job pk when the comment carries "gpuportal:<uuid>"; no FK so that usage outlives
    # deleted jobs and does not depend on the jobs app's migrations (see accounting.selectors.jobs_by_uuid)
    portal_job_uuid = models.UUIDField(null=True, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=32, blank=True)
    elapsed_seconds = models.PositiveBigIntegerField(default=0)
    time_limit_minutes = models.PositiveIntegerField(null=True, blank=True)  # None = unlimited
    gpu_seconds = models.PositiveBigIntegerField(default=0)  # exact: gpus × (end or now − start)
    gpu_hours = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    requested_gpu_hours = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    provisional = models.BooleanField(default=False)  # still running: figures grow until it ends
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
