"""gunicorn settings for gpuportal: the demo (scripts/demo) and production (docs/deploy.md) use this file.

    gunicorn -c deploy/gunicorn.conf.py portal.wsgi

Threaded workers (gthread): requests wait on PostgreSQL, Redis and each other's team locks, not on
the CPU, so a few processes with a few threads each keep the cores busy. Read from the environment
through the portal's strict readers (a bad value stops start-up naming the variable):

GUNICORN_BIND     127.0.0.1:8000
GUNICORN_WORKERS  2 × cores + 1, at most 8 (5 on 2 cores)
GUNICORN_THREADS  2 per worker
GUNICORN_TIMEOUT  60 s (a worker silent this long is killed and replaced)
"""

import os

from portal.env import Env

env = Env()

bind = env.str("GUNICORN_BIND", "127.0.0.1:8000")
workers = env.int("GUNICORN_WORKERS", min(2 * (os.cpu_count() or 1) + 1, 8), minimum=1)
threads = env.int("GUNICORN_THREADS", 2, minimum=1)
worker_class = "gthread"
timeout = env.int("GUNICORN_TIMEOUT", 60, minimum=5)
graceful_timeout = 30
keepalive = 5
# Replace workers now and then so that a slow leak cannot grow for ever; jitter keeps them apart.
max_requests = 2000
max_requests_jitter = 200
# Access log to stdout, errors to stderr: scripts/demo sends both to .run/log/web.log, systemd to the journal.
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
