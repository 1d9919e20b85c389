"""gpuportal's core app. The Celery app (portal/celery.py) is loaded by PortalConfig.ready(), not
here, so that nothing but the server pays for Django or Celery (the `gpuportal` CLI lives in cli/)."""
