"""BudgetAlert.webhook_claimed_at / webhook_attempts: the webhook is claimed before it is POSTed
(accounting.services.budget_alert_webhook), at most WEBHOOK_ATTEMPTS times; budget_alert_webhook_sweep
re-enqueues the webhooks a lost task left owed."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounting', '0006_pending_reprice'),
    ]

    operations = [
        migrations.AddField(
            model_name='budgetalert',
            name='webhook_attempts',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='budgetalert',
            name='webhook_claimed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
