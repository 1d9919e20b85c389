# Issue 39: the job list's keyset pages (portal.paging) read an index in the list's order, the
# primary key last. Built and dropped CONCURRENTLY: a live jobs table is never locked against writes.

import django.contrib.postgres.operations
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0016_idle_policy'),
    ]

    operations = [
        django.contrib.postgres.operations.AddIndexConcurrently(
            model_name='job',
            index=models.Index(fields=['team', '-created_at', '-id'], name='job_team_created_id'),
        ),
        django.contrib.postgres.operations.AddIndexConcurrently(
            model_name='job',
            index=models.Index(fields=['-created_at', '-id'], name='job_created_id'),
        ),
        django.contrib.postgres.operations.AddIndexConcurrently(
            model_name='job',
            index=models.Index(fields=['submitter', '-created_at', '-id'], name='job_submitter_created_id'),
        ),
        django.contrib.postgres.operations.AddIndexConcurrently(
            model_name='job',
            index=models.Index(fields=['-ended_at', '-id'], name='job_ended_id'),
        ),
        django.contrib.postgres.operations.AddIndexConcurrently(
            model_name='job',
            index=models.Index(fields=['-started_at', '-id'], name='job_started_id'),
        ),
        django.contrib.postgres.operations.RemoveIndexConcurrently(model_name='job', name='job_team_created'),
        django.contrib.postgres.operations.RemoveIndexConcurrently(model_name='job', name='job_created'),
        django.contrib.postgres.operations.RemoveIndexConcurrently(model_name='job', name='job_submitter_created'),
    ]
