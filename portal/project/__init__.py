"""The project layer: settings, URLs, the Celery app and its schedules, the admin, the pages and
checks that read several apps, the commands that compose them. It imports jobs and accounting; they
import only the core (the rest of portal/). The layers are a contract: pyproject.toml [tool.importlinter]."""
