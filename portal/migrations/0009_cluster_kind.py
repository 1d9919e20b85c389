from django.db import migrations, models


class Migration(migrations.Migration):
    """Issue 41: a cluster's kind (slurm or kubernetes) and a Kubernetes cluster's kubeconfig."""

    dependencies = [("portal", "0008_team_idle_policy")]

    operations = [
        migrations.AddField(model_name="cluster", name="kind", field=models.CharField(default="slurm", max_length=16)),
        migrations.AddField(model_name="cluster", name="kubeconfig", field=models.CharField(blank=True, max_length=1024)),
    ]
