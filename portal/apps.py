from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _record_clusters(sender, using="default", apps=None, **kwargs) -> None:
    """After every migrate (and test database flush): the configured clusters as Cluster rows. Not a
    business rule: the rows mirror settings (portal.services.clusters_record). Skipped when the
    migration state has no Cluster (migrating back before it)."""
    from portal.services import clusters_record

    if using != "default":
        return
    try:
        if apps is not None:
            apps.get_model("portal", "Cluster")
    except LookupError:
        return
    clusters_record()


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal: teams, users and the cluster"

    def ready(self) -> None:
        post_migrate.connect(_record_clusters, sender=self, dispatch_uid="portal-record-clusters")
