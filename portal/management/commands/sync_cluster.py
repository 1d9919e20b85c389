from django.core.management.base import BaseCommand, CommandError

from portal.management.clusters import cluster_names, for_each_cluster
from portal.services import cluster_sync


class Command(BaseCommand):
    help = (
        "Read partitions and nodes from Slurm now and record them, for every configured cluster or the one "
        "named (the periodic task does the same, one task per cluster)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--cluster", default="", help="Only this cluster (a name of GPUPORTAL_CLUSTERS).")

    def handle(self, *args, **options):
        names = cluster_names(options["cluster"])

        def sync(name: str) -> None:
            counts = cluster_sync(cluster=name)
            prefix = f"{name}: " if len(names) > 1 else ""
            self.stdout.write(f"{prefix}Recorded {counts['partitions']} partitions and {counts['nodes']} nodes.")

        failed = for_each_cluster(self, names, sync)
        if failed:
            raise CommandError(f"Slurm did not answer for {', '.join(failed)} (the others were recorded).")
