from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal: teams, users and the cluster"

    def ready(self) -> None:
        # Make the Celery app current so that shared_task(...).delay() uses its broker settings.
        from portal.celery import app  # noqa: F401
