from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The project layer as an installed app (no models): Django finds its admin module and its
    management commands."""

    name = "portal.project"
    label = "portal_project"
    verbose_name = "Portal: the project (settings, URLs, admin, commands)"

    def ready(self) -> None:
        # Make the Celery app current so that shared_task(...).delay() uses its broker settings.
        from portal.project.celery import app  # noqa: F401
