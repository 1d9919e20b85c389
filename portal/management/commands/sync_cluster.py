from django.core.management.base import BaseCommand, CommandError

from portal.services import cluster_sync
from portal.slurm import SlurmError, configured_clusters


class Command(BaseCommand):
    help = (
        "Read partitions and nodes from Slurm now and record them, for every configured cluster or the one "
        "named (the periodic task does the same, one task per cluster)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--cluster", default="", help="Only this cluster (a name of SLURM_CLUSTERS).")

    def handle(self, *args, **options):
        names = [c.name for c in configured_clusters()]
        if options["cluster"]:
            if options["cluster"] not in names:
                raise CommandError(f"Unknown cluster {options['cluster']!r}: configured are {', '.join(names)}.")
            names = [options["cluster"]]
        failed = []
        for name in names:
            try:
                counts = cluster_sync(cluster=name)
            except SlurmError as exc:
                if len(names) == 1:
                    raise CommandError(f"Slurm: {exc}") from exc
                self.stderr.write(f"{name}: Slurm: {exc}")
                failed.append(name)
                continue
            prefix = f"{name}: " if len(names) > 1 else ""
            self.stdout.write(f"{prefix}Recorded {counts['partitions']} partitions and {counts['nodes']} nodes.")
        if failed:
            raise CommandError(f"Slurm did not answer for {', '.join(failed)} (the others were recorded).")
