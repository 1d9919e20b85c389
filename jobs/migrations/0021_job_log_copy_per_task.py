# Issue 41: one copy of a Kubernetes job's log per array task (each task is a Job and a pod of its own),
# so JobLogCopy's key is its own id, with (job, task) unique — task null for a job that is not an array.
# The job column is no longer the primary key (its primary key constraint dropped first, then the id
# added: PostgreSQL numbers the rows already there).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0020_job_log_copy'),
    ]

    operations = [
        migrations.AlterField(
            model_name='joblogcopy',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='log_copies', to='jobs.job'),
        ),
        migrations.AddField(
            model_name='joblogcopy',
            name='id',
            field=models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID'),
        ),
        migrations.AddField(
            model_name='joblogcopy',
            name='task',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name='joblogcopy',
            constraint=models.UniqueConstraint(fields=('job', 'task'), name='joblogcopy_one_per_task', nulls_distinct=False),
        ),
    ]
