"""PendingReprice: re-pricing owed after a new rate (accounting.services.rate_create writes it with
the rate, the re-pricing deletes it, usage_reprice_sweep re-enqueues what a lost task left)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounting', '0005_budget_holds'),
    ]

    operations = [
        migrations.CreateModel(
            name='PendingReprice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('gpu_type', models.CharField(max_length=32)),
                ('since', models.DateField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['created_at'],
            },
        ),
    ]
