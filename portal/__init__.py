"""gpuportal's core app. The Celery app (portal/celery.py) is loaded by PortalConfig.ready(), not
here, so that the `gpuportal` CLI (portal/cli) starts without importing Django or Celery."""
