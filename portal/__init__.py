"""gpuportal's core app. The Celery app (portal/project/celery.py) is loaded by ProjectConfig.ready(), not
here, so that nothing but the server pays for Django or Celery (the `gpuportal` CLI lives in cli/)."""
