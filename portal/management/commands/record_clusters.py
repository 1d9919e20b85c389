from django.core.management.base import BaseCommand

from portal.services import clusters_record


class Command(BaseCommand):
    help = "Record the configured clusters (GPUPORTAL_CLUSTERS) as the portal's Cluster rows (migrate does it too)."

    def handle(self, *args, **options):
        for row in clusters_record():
            self.stdout.write(f"{row.name}: backend {row.backend}, SLURM_CONF {row.slurm_conf or '(default)'}"
                              + (" (default)" if row.is_default else ""))  # fmt: skip
