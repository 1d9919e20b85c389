"""The web server's settings and application: what ``deploy/gunicorn.conf.py`` runs (the demo,
scripts/demo, and production, docs/deploy.md):

    gunicorn -c deploy/gunicorn.conf.py          # serves portal.project.serve:wsgi_application()
    gunicorn --check-config -c deploy/gunicorn.conf.py

Read from the environment through the portal's strict readers (a bad value stops start-up naming
the variable):

WEB_BIND          127.0.0.1:8000 (host:port; [::1]:8000 for IPv6)
WEB_WORKERS       one process per core, at least 2 (a worker restarting leaves one serving), at most 8
WEB_THREADS       4 per worker: a single-job POST is mostly Python with ~1 ms of waiting on PostgreSQL
                  and Redis, so more processes than cores only switch between each other
WEB_TIMEOUT       60 s: a worker silent this long is killed and replaced
WEB_ACCESS_LOG    1: one line per request on stdout (scripts/demo: .run/log/web.log; systemd: the journal)

GUNICORN_BIND, GUNICORN_WORKERS, GUNICORN_THREADS, GUNICORN_TIMEOUT (what earlier releases read) are
still read where the WEB_ variable is unset."""

from __future__ import annotations

import os
from dataclasses import dataclass

from portal.env import Env


@dataclass(frozen=True)
class WebSettings:
    host: str
    port: int
    workers: int
    threads: int
    timeout: int
    access_log: bool

    @property
    def bind(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _name(env: Env, name: str) -> str:
    """WEB_X, or GUNICORN_X where a site set that before and not WEB_X."""
    legacy = name.replace("WEB_", "GUNICORN_", 1)
    return legacy if env._raw(name) is None and env._raw(legacy) is not None else name


def web_settings(environ=None) -> WebSettings:
    env = Env(environ)
    bind_name = _name(env, "WEB_BIND")
    bind = env.str(bind_name, "127.0.0.1:8000")
    host, sep, port_text = bind.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Env._fail(bind_name, bind, "host:port, e.g. 127.0.0.1:8000 or [::1]:8000")
    return WebSettings(
        host=host,
        port=int(port_text),
        workers=env.int(_name(env, "WEB_WORKERS"), min(max(os.cpu_count() or 1, 2), 8), minimum=1, maximum=64),
        threads=env.int(_name(env, "WEB_THREADS"), 4, minimum=1, maximum=256),
        timeout=env.int(_name(env, "WEB_TIMEOUT"), 60, minimum=5),
        access_log=env.bool("WEB_ACCESS_LOG", True),
    )


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
    """The application a web worker serves (gunicorn's ``portal.project.serve:wsgi_application()``): the
    portal's WSGI application with its URL patterns loaded and the heap frozen (above)."""
    import gc

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")
    from django.urls import get_resolver

    from portal.project.wsgi import application

    get_resolver().url_patterns  # noqa: B018 — imports every view module now, not in a first request
    gc.collect()
    gc.freeze()
    return gc_settled(application)
