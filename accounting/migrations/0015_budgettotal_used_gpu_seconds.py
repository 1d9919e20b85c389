"""The running totals keep their used figure's exact GPU-seconds (issue 39: an ingestion moves each
total by what it changed instead of summing the period's slices again).

The GPU-seconds of a stored total are its six-place GPU-hours × 3600, rounded to the second: the
slices' GPU-seconds are whole numbers (GPUs × whole seconds: sacct's times are whole seconds, and so
are the billing midnights that cut them), and six places of an hour are 0.0036 s, so the rounding
gives back the exact sum the hours were stored from. A total whose figure was stale is corrected from
the slices by accounting.services.budget.budget_totals_check, which beat runs (and logs what it
corrects)."""

from decimal import Decimal

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("accounting", "0014_issued_invoice")]

    operations = [
        migrations.AddField(
            model_name="budgettotal",
            name="used_gpu_seconds",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=24),
        ),
        migrations.RunSQL(
            "UPDATE accounting_budgettotal SET used_gpu_seconds = round(used_gpu_hours * 3600)",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
