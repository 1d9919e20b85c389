"""gunicorn settings for gpuportal: the demo (scripts/demo) and production (docs/deploy.md) use this file.

    gunicorn -c deploy/gunicorn.conf.py portal.wsgi

Threaded workers (gthread), one process per core with 4 threads each: a single-job POST is ~2.8 ms
of Python and ~1 ms of waiting on PostgreSQL and Redis, so more processes than cores only switch
between each other. Measured on 2 cores (bench/bench_demo.py, 500 POSTs from 8 clients, 2026-12-01):
5 processes × 2 threads (the old 2 × cores + 1) accepted 139 POSTs/s at 5.3 ms of gunicorn CPU per
POST; 3 × 2: 238/s; 2 × 4: 280/s at 2.8 ms. Read from the environment through the portal's strict
readers (a bad value stops start-up naming the variable):

GUNICORN_BIND     127.0.0.1:8000
GUNICORN_WORKERS  one per core, at least 2 (a worker restarting leaves one serving), at most 8
GUNICORN_THREADS  4 per worker
GUNICORN_TIMEOUT  60 s (a worker silent this long is killed and replaced)
"""

import os

from portal.env import Env

env = Env()

bind = env.str("GUNICORN_BIND", "127.0.0.1:8000")
workers = env.int("GUNICORN_WORKERS", min(max(os.cpu_count() or 1, 2), 8), minimum=1)
threads = env.int("GUNICORN_THREADS", 4, minimum=1)
worker_class = "gthread"
timeout = env.int("GUNICORN_TIMEOUT", 60, minimum=5)
graceful_timeout = 30
keepalive = 5
# Replace workers now and then so that a slow leak cannot grow for ever; jitter keeps them apart.
# Not too often: a new worker costs ~1.5 s of CPU to start (Django, the app, its warm copies), and at
# 2000 requests a worker under 200 POSTs/s was replaced every ~20 s (bench/bench_demo.py counted a
# restart's CPU in the middle of its 500 POSTs); at 20000 that is every few minutes at full load.
max_requests = 20000
max_requests_jitter = 2000
# Access log to stdout, errors to stderr: scripts/demo sends both to .run/log/web.log, systemd to the journal.
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
