"""gunicorn settings for gpuportal: the demo (scripts/demo) and production (docs/deploy.md) use this file.

    gunicorn -c deploy/gunicorn.conf.py
    gunicorn --check-config -c deploy/gunicorn.conf.py

The settings come from portal/project/serve.py (WEB_BIND, WEB_WORKERS, WEB_THREADS, WEB_TIMEOUT,
WEB_ACCESS_LOG; GUNICORN_… where a site still sets those), read strictly: a bad value stops
start-up naming the variable. The application is ``portal.project.serve:wsgi_application()``: the portal's,
its URL patterns loaded and its heap frozen for Python's cyclic collector once a worker has started.

Threaded workers (gthread), one process per core with 4 threads each: a single-job POST is mostly
Python with ~1 ms of waiting on PostgreSQL and Redis, so more processes than cores only switch
between each other (on 2 cores, 5 × 2 accepted half the POSTs/s of 2 × 4, bench/results.md).
"""

from portal.project.serve import web_settings

_web = web_settings()

wsgi_app = "portal.project.serve:wsgi_application()"
bind = _web.bind
workers = _web.workers
threads = _web.threads
worker_class = "gthread"
timeout = _web.timeout  # a worker silent this long is killed and replaced
graceful_timeout = 30
keepalive = 5
# Replace workers now and then so that a slow leak cannot grow for ever; jitter keeps them apart.
# Not too often: a new worker costs ~1.5 s of CPU to start (Django, the app, its warm copies), and at
# 2000 requests a worker under 200 POSTs/s was replaced every ~20 s (bench/bench_demo.py counted a
# restart's CPU in the middle of its 500 POSTs); at 20000 that is every few minutes at full load.
max_requests = 20000
max_requests_jitter = 2000
# Access log to stdout, errors to stderr: scripts/demo sends both to .run/log/web.log, systemd to the journal.
accesslog = "-" if _web.access_log else None
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
