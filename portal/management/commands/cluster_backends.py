from django.core.management.base import BaseCommand

from portal.slurm import SlurmError, configured_clusters, get_gateway, relay_backend


class Command(BaseCommand):
    help = ("Each configured cluster's Slurm version, the backend a worker started now relays its jobs through "
            "(pyslurm or sbatch: get_gateway's choice; kubernetes: batch/v1 Jobs) and whether its controller (or API "
            "server) answers.")  # fmt: skip

    def handle(self, *args, **options):
        for config in configured_clusters():
            gateway = get_gateway(config.name)
            try:
                version = gateway.version()
            except SlurmError as exc:
                version = f"unknown ({exc.message})"
            try:
                health = "up" if gateway.ping() else "down"
            except SlurmError as exc:
                health = f"down ({exc.message})"
            relay = relay_backend(gateway)
            scheduler = "Kubernetes" if config.is_kubernetes else "Slurm"
            self.stdout.write(f"cluster {config.name:12} {scheduler} {version:10} relay {relay:8} {health}")
