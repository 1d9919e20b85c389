"""gunicorn settings for gpuportal, for a site that keeps gunicorn: the demo and the documented
production setup run granian (``python -m portal.serve``, portal/serve.py), which costs ~1.5 ms less
CPU per request on 2 cores. Both read the same variables through the same reader (WEB_BIND,
WEB_WORKERS, WEB_THREADS; WEB_TIMEOUT here only; GUNICORN_BIND, … where WEB_… is not set):

    gunicorn -c deploy/gunicorn.conf.py

The application is granian's too: ``portal.serve:wsgi_application()`` (URL patterns loaded and the
heap frozen for the cyclic collector once a worker has started; the environment filter it adds is a
few microseconds of nothing here, gunicorn does not copy os.environ into requests).

Threaded workers (gthread), one process per core with 4 threads each: a single-job POST is mostly
Python with ~1 ms of waiting on PostgreSQL and Redis, so more processes than cores only switch
between each other (on 2 cores, 5 × 2 accepted half the POSTs/s of 2 × 4, bench/results.md).
"""

from portal.serve import web_settings

_web = web_settings()

wsgi_app = "portal.serve:wsgi_application()"

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
