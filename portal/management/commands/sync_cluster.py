from django.core.management.base import BaseCommand, CommandError

from portal.services import cluster_sync
from portal.slurm import SlurmError


class Command(BaseCommand):
    help = "Read partitions and nodes from Slurm now and record them (the periodic task does the same)."

    def handle(self, *args, **options):
        try:
            counts = cluster_sync()
        except SlurmError as exc:
            raise CommandError(f"Slurm: {exc}") from exc
        self.stdout.write(f"Recorded {counts['partitions']} partitions and {counts['nodes']} nodes.")
