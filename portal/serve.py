"""The web server: granian (HTTP in Rust, the portal as a WSGI application), configured from the
environment through the portal's strict readers (a bad value stops start-up naming the variable).
The demo (scripts/demo) and production (docs/deploy.md) start it the same way:

    python -m portal.serve            # serve
    python -m portal.serve --check    # read the environment, print the configuration, exit (0 or 1)

WEB_BIND          127.0.0.1:8000 (host:port; [::1]:8000 for IPv6)
WEB_WORKERS       one process per core, at least 2 (a worker restarting leaves one serving), at most 8
WEB_THREADS       4 per worker: the threads that run Django (a single-job POST is mostly Python, with
                  ~1 ms of waiting on PostgreSQL and Redis, so more only switch between each other)
WEB_LIFETIME      6 h: each worker is replaced after this long (a slow leak cannot grow for ever);
                  0 keeps workers as long as they live
WEB_MAX_RSS       0: no limit; else a worker above this many MiB is replaced
WEB_BACKLOG       1024 connections waiting to be accepted
WEB_ACCESS_LOG    1: one line per request on stdout (scripts/demo: .run/log/web.log; systemd: the journal)

Why granian rather than gunicorn (which still works: deploy/gunicorn.conf.py reads the same
variables): on 2 cores its HTTP side costs ~1.5 ms less CPU per request (bench/results.md, the ninth
session), which is what the single-job POST is made of. What it does not have is gunicorn's
watchdog that kills a worker whose threads all hang; here nothing in a request waits without a
bound for long (PostgreSQL and Redis calls fail when their server goes), and a worker that exits
is started again (respawn)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from portal.env import Env


@dataclass(frozen=True)
class WebSettings:
    host: str
    port: int
    workers: int
    threads: int
    lifetime: int  # seconds, 0: none
    max_rss: int  # MiB, 0: none
    backlog: int
    access_log: bool
    timeout: int  # gunicorn only: a worker silent this long is killed

    @property
    def bind(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _legacy(env: Env, name: str) -> str:
    """WEB_X, or GUNICORN_X where a site set that before (the variables the gunicorn config read)."""
    if env._raw(name) is None and env._raw(name.replace("WEB_", "GUNICORN_", 1)) is not None:
        return name.replace("WEB_", "GUNICORN_", 1)
    return name


def web_settings(environ=None) -> WebSettings:
    env = Env(environ)
    bind_name = _legacy(env, "WEB_BIND")
    bind = env.str(bind_name, "127.0.0.1:8000")
    host, sep, port_text = bind.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Env._fail(bind_name, bind, "host:port, e.g. 127.0.0.1:8000 or [::1]:8000")
    cores = os.cpu_count() or 1
    lifetime = env.int("WEB_LIFETIME", 6 * 3600, minimum=0)
    if 0 < lifetime < 60:  # granian's own bound (workers_lifetime >= 60)
        raise Env._fail("WEB_LIFETIME", str(lifetime), "0 (no replacement) or at least 60 seconds")
    return WebSettings(
        host=host,
        port=int(port_text),
        workers=env.int(_legacy(env, "WEB_WORKERS"), min(max(cores, 2), 8), minimum=1, maximum=64),
        threads=env.int(_legacy(env, "WEB_THREADS"), 4, minimum=1, maximum=256),
        lifetime=lifetime,
        max_rss=env.int("WEB_MAX_RSS", 0, minimum=0),
        backlog=env.int("WEB_BACKLOG", 1024, minimum=128),
        access_log=env.bool("WEB_ACCESS_LOG", True),
        timeout=env.int(_legacy(env, "WEB_TIMEOUT"), 60, minimum=5),
    )


def without_process_environment(app):
    """``app`` behind a filter of what granian adds to every WSGI environ: a copy of the process's
    environment (os.environ — SECRET_KEY, DATABASE_URL with its password, …), which would otherwise
    sit in every request's META, in debug pages and error reports. A key whose value is the
    process's own is removed; HTTP_PROXY always (a "Proxy:" request header, httpoxy)."""
    process = tuple(os.environ.items())

    def application(environ, start_response):
        for key, value in process:
            if environ.get(key) == value:
                del environ[key]
        environ.pop("HTTP_PROXY", None)
        return app(environ, start_response)

    return application


# A worker's heap once Django, DRF and the portal are loaded and have served their first requests:
# ~100 000-125 000 objects that live as long as the process. Python's cyclic collector walks all of
# them in every full (generation 2) collection, with the GIL held: 76-193 ms in which none of the
# worker's threads ran, on 2 busy cores (the open loop's 100-300 ms stalls, bench/results.md, the
# ninth session). gc.freeze() moves what exists out of the collector's reach: once when the worker
# has loaded the application (after a collection, so no garbage is kept), and once more after its
# first GC_FREEZE_AFTER_REQUESTS requests (what the first requests of each kind built: URL
# resolvers, serializers' fields, the ORM's and the snapshots' caches), without one.
GC_FREEZE_AFTER_REQUESTS = 200


def gc_settled(app, after: int = GC_FREEZE_AFTER_REQUESTS):
    """``app`` that freezes the collector's heap after its first ``after`` requests (above)."""
    import gc
    import threading

    left = [after]
    lock = threading.Lock()

    def application(environ, start_response):
        if left[0]:
            with lock:
                if left[0]:
                    left[0] -= 1
                    if not left[0]:
                        gc.freeze()
        return app(environ, start_response)

    return application


def wsgi_application():
    """granian's factory target: the portal's WSGI application, its URL patterns loaded and the heap
    frozen (above), filtered (without_process_environment)."""
    import gc

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.urls import get_resolver

    from portal.wsgi import application

    get_resolver().url_patterns  # noqa: B018 — imports every view module now, not in a first request
    gc.collect()
    gc.freeze()
    return without_process_environment(gc_settled(application))


# granian's access line (logging's %-style over granian's fields): client, request, status, milliseconds
ACCESS_FORMAT = '%(addr)s "%(method)s %(path)s %(protocol)s" %(status)d %(dt_ms).1fms'


def server(settings: WebSettings):
    from granian import Granian
    from granian.constants import Interfaces
    from granian.log import LogLevels

    return Granian(
        "portal.serve:wsgi_application",
        factory=True,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.WSGI,
        workers=settings.workers,
        blocking_threads=settings.threads,
        backlog=settings.backlog,
        websockets=False,
        log_level=LogLevels.info,
        log_access=settings.access_log,
        log_access_format=ACCESS_FORMAT,
        respawn_failed_workers=True,
        respawn_interval=1.0,
        workers_lifetime=settings.lifetime or None,
        workers_max_rss=settings.max_rss or None,
        workers_kill_timeout=30,
    )


def main(argv: list[str] | None = None) -> int:
    from django.core.exceptions import ImproperlyConfigured

    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--check"]):
        print("usage: python -m portal.serve [--check]", file=sys.stderr)
        return 2
    try:
        settings = web_settings()
    except ImproperlyConfigured as error:
        print(f"gpuportal web: {error}", file=sys.stderr)
        return 1
    if argv == ["--check"]:
        print(f"gpuportal web: granian on {settings.bind}, {settings.workers} workers × {settings.threads} threads, "
              f"lifetime {settings.lifetime or 'unbounded'} s, access log {'on' if settings.access_log else 'off'}")  # fmt: skip
        return 0
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    server(settings).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
