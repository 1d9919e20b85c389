# One task of an array cancelled alone is a row first (its cancel asked for) and a Celery task second
# (jobs.services.cancel.job_array_task_cancel_relay_run), as a whole job's cancel is: the web process
# does not talk to the scheduler, and on Kubernetes the worker keeps the task's log before it deletes
# the task's Job.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0021_job_log_copy_per_task'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobarraytask',
            name='cancel_requested_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
