"""The benchmark's own places and names, and the environment of its processes.

Imported first (through ``common`` or any other bench module): it points DATABASE_URL,
CELERY_BROKER_URL and CACHE_URL at the benchmark's own database and Redis databases before Django
is set up, and makes the repository importable.

Environment:
    DATABASE_URL    any database on the PostgreSQL server to use (as `scripts/services up` prints);
                    only its server and credentials are used
    BENCH_DB        name of the benchmark's own database (default gpuportal_bench)
    BENCH_REDIS_DB  first of two Redis databases the benchmark owns: broker, then cache (default 12)
    BENCH_PORT      the port of the benchmark's gunicorn (default 8765)
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get("BENCH_DB", "gpuportal_bench")
if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", BENCH_DB):
    sys.exit(f"BENCH_DB={BENCH_DB!r}: use lower-case letters, digits and '_'")
_SERVER_URL = os.environ.get("DATABASE_URL", "postgres://gpuportal@127.0.0.1:5432/gpuportal")
if not _SERVER_URL.startswith(("postgres://", "postgresql://")):
    sys.exit(
        'The benchmarks run on PostgreSQL: set DATABASE_URL=postgres://… (eval "$(scripts/services up)")'
    )
SERVER = urlsplit(_SERVER_URL)  # the PostgreSQL server (host, port, credentials) the benchmark's database is on
BENCH_DATABASE_URL = urlunsplit((SERVER.scheme, SERVER.netloc, "/" + BENCH_DB, "", ""))

_broker = urlsplit(os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
_redis_db = int(os.environ.get("BENCH_REDIS_DB", "12"))
BENCH_BROKER_URL = urlunsplit((_broker.scheme, _broker.netloc, f"/{_redis_db}", "", ""))
BENCH_CACHE_URL = urlunsplit((_broker.scheme, _broker.netloc, f"/{_redis_db + 1}", "", ""))

# The benchmark's own names in the portal, on the host and in Slurm.
BENCH_TEAM = "gpbench"  # team slug and Slurm account
BENCH_USER = "gpbench"  # portal login and Unix user
BENCH_WORKDIR = "/tmp/gpuportal-bench"  # jobs' working directory (their output files land here)
BENCH_PORT = int(os.environ.get("BENCH_PORT", "8765"))
RUN_DIR = ROOT / ".run" / "bench"

os.environ["DATABASE_URL"] = BENCH_DATABASE_URL
os.environ["CELERY_BROKER_URL"] = BENCH_BROKER_URL
os.environ["CACHE_URL"] = BENCH_CACHE_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")
# No defaults from the demo's .run/env (portal.env.Env.env_file): the benchmark's processes take their
# settings from this module and the caller's environment only, whether or not `make demo` ran here.
os.environ["GPUPORTAL_ENV_FILE"] = ""
os.environ.setdefault("LOG_LEVEL", "WARNING")
# In this (driver) process services that enqueue (team_create, membership_set) run their task inline.
os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"
# Production-like settings here as in the web and worker processes (pages timed in this process).
PRODUCTION_LIKE = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(48), "SECURE_SSL_REDIRECT": "0",
                   "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0"}  # fmt: skip
os.environ.update(PRODUCTION_LIKE)
# The submit throttle counts (its cost is in every figure) but never refuses: the benchmarks POST
# thousands of jobs a minute as one user, in gunicorn and in this process (same cache).
os.environ["THROTTLE_SUBMIT"] = "1000000/min"


def service_env(**extra: str) -> dict[str, str]:
    """Environment of the web and worker processes: the benchmark's database, broker and cache;
    production-like settings (DEBUG=0) without TLS redirects; quiet logs."""
    return (
        os.environ
        | {
            "DATABASE_URL": BENCH_DATABASE_URL,
            "CELERY_BROKER_URL": BENCH_BROKER_URL,
            "CACHE_URL": BENCH_CACHE_URL,
            "DJANGO_SETTINGS_MODULE": "portal.project.settings",
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "LOG_LEVEL": "WARNING",
        }
        | PRODUCTION_LIKE
        | extra
    )
