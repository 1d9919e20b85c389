"""The foreign keys Job.team, Job.submitter and JobEvent.job lose their own indexes: job_team_created_id,
job_submitter_created_id and jobevent_job_at begin with the same column and serve every lookup by it
(the foreign keys' checks and PROTECT/CASCADE included). Each was one more index write per submission
and per event, and space: built fresh on a million rows, 14 MB per million events (the largest table,
several per job) and 7 MB per million jobs for each of the two others (more when built row by row).

Only the indexes go, each by DROP INDEX CONCURRENTLY: a live site's writes go on meanwhile. Django's
own AlterField would drop and re-add the foreign key constraints, which re-validates every row of
jobs_job and jobs_jobevent under a lock that blocks writes — minutes on a year of jobs."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# Django's names for the foreign keys' indexes (a hash of table and column: the same on every site)
INDEXES = [
    ("jobs_job", "submitter_id", "jobs_job_submitter_id_af120c41"),
    ("jobs_job", "team_id", "jobs_job_team_id_c38d3640"),
    ("jobs_jobevent", "job_id", "jobs_jobevent_job_id_79067df7"),
]


class Migration(migrations.Migration):
    atomic = False  # CREATE/DROP INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("jobs", "0023_jobarraytask_cancel_owed"),
        ("portal", "0011_lease"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="submitter",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="jobs",
                                            to=settings.AUTH_USER_MODEL),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="team",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="jobs",
                                            to="portal.team"),
                ),
                migrations.AlterField(
                    model_name="jobevent",
                    name="job",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="events",
                                            to="jobs.job"),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{table}" ("{column}")',
                )
                for table, column, name in INDEXES
            ],
        ),
    ]
