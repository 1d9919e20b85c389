"""Job.end_notified_at: the job-end e-mail was dealt with (jobs.services.notify claims it before
sending; the sweeper re-enqueues ended jobs without it). Jobs that ended before this migration had
their notice dealt with by the old task: they are marked (at their end), so the sweeper sends them
nothing; the partial index is built after, over what is owed (none)."""

from django.db import migrations, models
from django.db.models.functions import Coalesce, Now

TERMINAL = ['BOOT_FAIL', 'CANCELLED', 'COMPLETED', 'DEADLINE', 'FAILED', 'NODE_FAIL', 'OUT_OF_MEMORY', 'PREEMPTED',
            'SUBMIT_FAILED', 'TIMEOUT']


def mark_ended(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    Job.objects.filter(state__in=TERMINAL, end_notified_at__isnull=True).update(end_notified_at=Coalesce("ended_at", Now()))


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0006_booking_fk_budget_holds'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='end_notified_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(mark_ended, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('end_notified_at__isnull', True), ('slurm_job_id__isnull', False), ('state__in', TERMINAL)), fields=['ended_at'], name='job_end_notice_owed'),
        ),
    ]
