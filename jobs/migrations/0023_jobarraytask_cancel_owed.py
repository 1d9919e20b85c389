# jobs_sweep reads the array tasks whose cancel was asked for and is not done yet: a partial index
# holds just those (a handful), so the sweep does not read a year's millions of tasks every minute.
# Built CONCURRENTLY: a live table is never locked against writes.

import django.contrib.postgres.operations
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0022_jobarraytask_cancel_requested_at'),
    ]

    operations = [
        django.contrib.postgres.operations.AddIndexConcurrently(
            model_name='jobarraytask',
            index=models.Index(
                condition=models.Q(('cancel_requested_at__isnull', False), models.Q(('state__in', ['BOOT_FAIL', 'CANCELLED', 'COMPLETED', 'DEADLINE', 'FAILED', 'NODE_FAIL', 'OUT_OF_MEMORY', 'PREEMPTED', 'SUBMIT_FAILED', 'TIMEOUT']), _negated=True)),
                fields=['cancel_requested_at'], name='jobarraytask_cancel_owed',
            ),
        ),
    ]
