from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0010_team_budget_version"),
    ]

    operations = [
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("holder", models.CharField(blank=True, max_length=200)),
                ("expires_at", models.DateTimeField()),
                ("acquired_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
    ]
