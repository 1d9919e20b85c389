# Issue 38 (one job <-> Slurm record matcher, portal.slurm.tags.record_is_job): a budget hold that knows
# its job's Slurm id also knows when the portal learnt it (accounting 0012), so the usage ingestion does
# not take a job that reuses the id after Slurm lost its state for the hold's. Holds identified before
# get the time from their job (Job.submitted_at), here in the jobs app, which may read accounting's
# tables (the other direction may not).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0017_job_list_keyset_indexes"),
        ("accounting", "0012_budgethold_slurm_id_known_at"),
    ]

    operations = [
        migrations.RunSQL(
            "UPDATE accounting_budgethold h SET slurm_id_known_at = j.submitted_at FROM jobs_job j "
            "WHERE h.job_uuid = j.id AND h.slurm_job_id IS NOT NULL AND h.slurm_id_known_at IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
