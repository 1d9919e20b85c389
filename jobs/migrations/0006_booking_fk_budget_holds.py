"""Job.booking becomes a foreign key to accounting.Booking (ids of bookings that no longer exist are
cleared), and the budget holds become accounting's rows: one BudgetHold per job that holds budget at
migration time (live, or ran and its final usage not ingested yet: what Job.accounted_at said) and a
released one per other job run in a booking (the usage ingestion finds a job's booking through its
hold). Job.accounted_at and its index go. The running totals (accounting.BudgetTotal) are built by
the first submission of each team's period from these holds and the usage slices."""

from decimal import Decimal

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import Q, Sum

LIVE = ["ACCEPTED", "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED"]


def build_holds(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    Booking = apps.get_model("accounting", "Booking")
    BudgetHold = apps.get_model("accounting", "BudgetHold")
    UsageRecord = apps.get_model("accounting", "UsageRecord")
    known = set(Booking.objects.values_list("pk", flat=True))
    Job.objects.filter(booking_id__isnull=False).exclude(booking_id__in=known).update(booking_id=None)
    holding = Q(state__in=LIVE) | (Q(started_at__isnull=False, accounted_at__isnull=True) & ~Q(state="SUBMIT_FAILED"))
    jobs = Job.objects.filter(holding | Q(booking_id__isnull=False)).values_list(
        "pk", "team_id", "gpu_type", "booking_id", "estimated_gpu_hours", "estimated_cost", "created_at", "state",
        "started_at", "accounted_at",
    )
    covered = settings.BOOKING_CHARGE_MODE == "reserved"
    batch: list = []
    for pk, team_id, gpu_type, booking_id, estimate, cost, created_at, state, started_at, accounted_at in jobs.iterator():
        open_ = state in LIVE or (started_at is not None and accounted_at is None and state != "SUBMIT_FAILED")
        batch.append(BudgetHold(
            job_uuid=pk, team_id=team_id, gpu_type=gpu_type, booking_id=booking_id, estimated_gpu_hours=estimate,
            estimated_cost=cost, held_gpu_hours=Decimal(0) if (not open_ or (booking_id and covered)) else estimate,
            created_at=created_at, released_at=None if open_ else (accounted_at or created_at),
        ))  # fmt: skip
        if len(batch) >= 2000:
            _save(batch, UsageRecord, BudgetHold)
            batch = []
    _save(batch, UsageRecord, BudgetHold)


def _save(batch, UsageRecord, BudgetHold):
    """Open holds keep their estimate minus what was ingested for the job so far (never below 0)."""
    if not batch:
        return
    ingested = dict(
        UsageRecord.objects.filter(portal_job_uuid__in=[h.job_uuid for h in batch if h.held_gpu_hours > 0])
        .values("portal_job_uuid").annotate(total=Sum("gpu_hours")).values_list("portal_job_uuid", "total").order_by()
    )  # fmt: skip
    for hold in batch:
        if hold.job_uuid in ingested:
            hold.held_gpu_hours = max(hold.held_gpu_hours - ingested[hold.job_uuid], Decimal(0))
    BudgetHold.objects.bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('accounting', '0005_budget_holds'),
        ('jobs', '0005_job_cluster'),
    ]

    operations = [
        migrations.RunPython(build_holds, migrations.RunPython.noop),
        migrations.RemoveIndex(
            model_name='job',
            name='job_unaccounted',
        ),
        migrations.RemoveField(
            model_name='job',
            name='accounted_at',
        ),
        # the column keeps its name and its values: booking_id → booking (FK, column booking_id)
        migrations.RenameField(model_name='job', old_name='booking_id', new_name='booking'),
        migrations.AlterField(
            model_name='job',
            name='booking',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='accounting.booking'),
        ),
    ]
