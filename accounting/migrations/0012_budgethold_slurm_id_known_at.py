# Issue 38: when the portal learnt a budget hold's Slurm id (portal.slurm.tags.record_is_job); filled for
# holds identified before by jobs 0018 (accounting 0012).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounting', '0011_team_budget_version_triggers'),
    ]

    operations = [
        migrations.AddField(
            model_name='budgethold',
            name='slurm_id_known_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
