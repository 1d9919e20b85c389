# Issue 42 (the site test's forgotten running jobs): when the jobs sync first missed a started job
# whose accounting record has no end, so that it ends the job once the miss has lasted
# JOB_LOST_AFTER_SECONDS. Nullable, no default: adding it rewrites nothing.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0018_budget_holds_slurm_id_known_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="gone_from_queue_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
