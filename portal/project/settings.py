"""gpuportal settings: one module, every value read from the environment through strict helpers
(``portal.env.Env``). Defaults make ``make demo`` work with nothing configured; production sets
DEBUG=0, SECRET_KEY, ALLOWED_HOSTS and DATABASE_URL (see docs/deploy.md)."""

from __future__ import annotations

import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from portal.env import Env
from portal.identity_settings import ldap_settings, oidc_settings, team_map
from portal.redis_client import sentinel_kwargs

env = Env()

BASE_DIR = Path(__file__).resolve().parent.parent.parent
RUN_DIR = Path(env.str("GPUPORTAL_RUN_DIR", str(BASE_DIR / ".run")))
# The demo's environment under the real one: `scripts/demo start` writes RUN_DIR/env (its database,
# broker and cache URLs with their passwords, SECRET_KEY, …), so `python manage.py …` in the checkout
# needs no `eval "$(scripts/demo env)"`; a variable set in the real environment always wins.
# Production has no such file; the tests never read it (Env.env_file).
env = env.with_file(env.env_file(RUN_DIR))
env.refuse_renamed()  # names another tool reads (SLURM_CLUSTERS: Slurm's --clusters): portal.env.RENAMED

DEBUG = env.bool("DEBUG", True)
SECRET_KEY = env.str("SECRET_KEY", required=not DEBUG)
if not SECRET_KEY:
    SECRET_KEY = "django-insecure-gpuportal-development-only-key-do-not-use-in-production"
elif not DEBUG and (len(SECRET_KEY) < 50 or SECRET_KEY.startswith("django-insecure")):
    raise ImproperlyConfigured(
        "Environment variable SECRET_KEY is invalid: expected at least 50 random characters when DEBUG=0."
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", [])
TIME_ZONE = env.str("TIME_ZONE", "UTC")
try:
    import zoneinfo

    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfigured(
        f"Environment variable TIME_ZONE={TIME_ZONE!r} is invalid: expected an IANA zone such as Asia/Shanghai."
    ) from None
USE_TZ = True
USE_I18N = True
LANGUAGE_CODE = "en-us"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "django_htmx",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "portal",
    "jobs",
    "accounting",
    "portal.project",  # the project layer: admin, commands (portal/project/apps.py)
]

MIDDLEWARE = [
    "portal.middleware.ApiErrorMiddleware",  # first: every answer under /api/ is JSON, 500s included
    "portal.middleware.NulQueryMiddleware",  # ?x=%00: a 400 naming x, not a database error
    "portal.middleware.SnapshotScopeMiddleware",  # the snapshots' versions: one cache read per request
    "django.middleware.security.SecurityMiddleware",
    "portal.middleware.ContentSecurityPolicyMiddleware",  # CONTENT_SECURITY_POLICY, a nonce per request
    # Static files from STATIC_ROOT (collectstatic) in every process, DEBUG or not (docs/deploy.md)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "portal.middleware.UserTimezoneMiddleware",
]

ROOT_URLCONF = "portal.project.urls"
WSGI_APPLICATION = "portal.project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.navigation",
                "portal.context_processors.csp",
            ],
        },
    },
]

# PostgreSQL only (portal.env.Env.database refuses other engines); the default is the database
# scripts/services creates, which `make demo` and `make test` use. A primary with standbys, any number in
# any order (docs/deploy.md "Settings for a site with failover"): libpq's multi-host URL,
# postgres://USER:PW@HOST1:5432,HOST2:5432/DB?target_session_attrs=read-write&connect_timeout=3 — HOST
# "HOST1,HOST2" and PORT "5432,5432" reach psycopg as they are; CONN_HEALTH_CHECKS (on) replaces a
# connection the failover killed at the next request.
DATABASES = {"default": env.database("DATABASE_URL", "postgres://gpuportal@127.0.0.1:5432/gpuportal")}
# Prepared statements (issue 38): Django's documented OPTIONS "server_side_binding" (the parameters
# travel apart from the statement) and psycopg's connect() parameter "prepare_threshold" (a statement
# run that many times on a connection is prepared: parsed and planned once per connection, not at
# every run; psycopg keeps at most 100 per connection, the least recently used deallocated). A
# single-job POST's PostgreSQL CPU fell by about a third (bench/results.md, nineteenth session).
# DATABASE_PREPARED_STATEMENTS=0 behind a pooler that cannot keep them (PgBouncer in transaction
# mode without max_prepared_statements).
if env.bool("DATABASE_PREPARED_STATEMENTS", True):
    DATABASES["default"]["OPTIONS"] |= {"server_side_binding": True, "prepare_threshold": 5}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Ways in: the portal's own passwords (ModelBackend: admins, the demo) always; LDAP when
# LDAP_SERVER_URI is set, OpenID Connect when OIDC_RP_CLIENT_ID is (portal/identity_settings.py).
# Each returns its library's settings (AUTH_LDAP_*, OIDC_*), or {} when not configured.
_ldap, _oidc = ldap_settings(env), oidc_settings(env)
OIDC_RP_CLIENT_ID = ""  # empty: OIDC off (its URLs answer 404)
globals().update(_ldap | _oidc)
DIRECTORY_TEAM_MAP = team_map(env)  # directory group → (team, role), for LDAP groups and OIDC claims
AUTHENTICATION_BACKENDS = [
    *(["portal.auth_ldap.LdapBackend"] if _ldap else []),
    *(["portal.auth_oidc.OidcBackend"] if _oidc else []),
    "django.contrib.auth.backends.ModelBackend",
]
# Unix accounts: 1 = every Unix user belongs to the directory (never useradd any; see portal/unix.py)
UNIX_USERS_FROM_DIRECTORY = env.bool("UNIX_USERS_FROM_DIRECTORY", False)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

STATIC_URL = "static/"
STATIC_ROOT = RUN_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "portal" / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Security (check --deploy clean when DEBUG=0)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Every page's Content-Security-Policy (portal.middleware.ContentSecurityPolicyMiddleware; "" sends
# none). Scripts only from the portal's own static files, inline ones only with this response's
# nonce ({nonce}: templates write nonce="{{ csp_nonce }}"); styles may be inline (style="…"
# attributes, htmx's indicator style); no plugins, no framing, no <base> elsewhere.
CONTENT_SECURITY_POLICY = env.str(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self' 'nonce-{nonce}'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'self'; frame-ancestors 'none'",
)
X_FRAME_OPTIONS = "DENY"
if env.bool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Reverse proxies whose X-Forwarded-For is believed (portal.proxies.client_address): addresses or
# CIDR networks, e.g. 127.0.0.1 for nginx on the same host. Empty: REMOTE_ADDR is the client.
TRUSTED_PROXIES = env.networks("TRUSTED_PROXIES", [])

# Redis with failover (docs/deploy.md "Settings for a site with failover"): CACHE_URL and CELERY_BROKER_URL
# may each be the Sentinels of one master, sentinel://H1:26379/1;sentinel://H2:26379/1;… (Celery's/kombu's
# form, any number of Sentinels), instead of one redis:// server. This is the master's name the Sentinels
# know it by (`sentinel monitor NAME …`): Celery's transport option master_name, and what the cache, the
# throttle and the outbox's flags ask the Sentinels for (portal/redis_client.py, their one way to Redis).
REDIS_SENTINEL_MASTER = env.str("REDIS_SENTINEL_MASTER", "gpuportal")
# The Sentinels' own password (their requirepass), when they have one; or REDIS_SENTINEL_PASSWORD_FILE.
# The Redis master's password is the URL's (sentinel://:PASSWORD@H1:26379/0;…).
REDIS_SENTINEL_PASSWORD = env.secret("REDIS_SENTINEL_PASSWORD")
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", REDIS_SENTINEL_MASTER):
    raise ImproperlyConfigured(f"Environment variable REDIS_SENTINEL_MASTER={REDIS_SENTINEL_MASTER!r} is invalid: "
                               "expected the master's name in the Sentinels' configuration (letters, digits, . _ -).")  # fmt: skip

# Cache (throttles, idempotency): Redis, shared by every web process. LOCATION is a list of one URL
# (Django splits a string at ; and , into servers it reads from at random: a Sentinel URL is one
# master), and the pool comes from portal.redis_client (Django's documented OPTIONS["pool_class"]),
# which follows a Sentinel failover; for a redis:// URL it is redis-py's own ConnectionPool.from_url.
CACHE_URL = env.redis_url("CACHE_URL", "redis://127.0.0.1:6379/1")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": [CACHE_URL],
        "OPTIONS": {"pool_class": "portal.redis_client.UrlConnectionPool"},
        "KEY_PREFIX": "gpuportal",
    }
}

# Email: budget alerts and job-end emails. SMTP as soon as EMAIL_HOST is set, else the console (demo).
EMAIL_HOST = env.str("EMAIL_HOST", "")
EMAIL_BACKEND = env.str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = EMAIL_HOST or "localhost"
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", False)  # STARTTLS, usually port 587
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", False)  # implicit TLS, usually port 465
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("Environment variables EMAIL_USE_TLS and EMAIL_USE_SSL are both on: set one.")
EMAIL_PORT = env.int("EMAIL_PORT", 465 if EMAIL_USE_SSL else 587 if EMAIL_USE_TLS else 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env.secret("EMAIL_HOST_PASSWORD")  # or EMAIL_HOST_PASSWORD_FILE
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", 30, minimum=1)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "gpuportal@localhost")
SERVER_EMAIL = env.str("SERVER_EMAIL", DEFAULT_FROM_EMAIL)

# Celery — schedules live in portal/project/celery.py
CELERY_BROKER_URL = env.redis_url("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0", also=("memory",))
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", 60, minimum=1)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", 90, minimum=1)
CELERY_TASK_IGNORE_RESULT = True
# master_name and sentinel_kwargs: which master a sentinel:// broker URL's Sentinels are asked for, and how
# each Sentinel is reached (kombu's transport options, the same as portal.redis_client's; a redis:// broker
# ignores them). Given always, so that a process pointed at another broker finds them.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", 300, minimum=10),
    "master_name": REDIS_SENTINEL_MASTER,
    "sentinel_kwargs": sentinel_kwargs(REDIS_SENTINEL_PASSWORD),
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TIMEZONE = "UTC"
# Beat runs on every portal host, and only the holder of a lease in the database sends (portal/beat.py):
# a holder that dies is replaced within BEAT_LEASE_SECONDS plus a third of it (it renews every third).
CELERY_BEAT_SCHEDULER = "portal.beat.LeaderScheduler"
BEAT_LEASE_SECONDS = env.float("BEAT_LEASE_SECONDS", 30.0, minimum=1.5)

# Slurm
SLURM_BACKEND = env.choice("SLURM_BACKEND", "auto", ("auto", "cli", "pyslurm"))
SLURM_CLUSTER = env.str("SLURM_CLUSTER", "gpuportal")
SLURM_TIMEOUT = env.int("SLURM_TIMEOUT", 15, minimum=1, maximum=600)
_local_cluster_conf = Path(env.str("GPUPORTAL_CLUSTER_DIR", "/var/lib/gpuportal-cluster")) / "etc" / "slurm.conf"
SLURM_CONF = env.str("SLURM_CONF", str(_local_cluster_conf) if _local_cluster_conf.exists() else "")
SLURM_BIN_DIR = env.str("SLURM_BIN_DIR", "")
SLURM_LIB_DIR = env.str("SLURM_LIB_DIR", "")
# The clusters this portal serves (portal/slurm/clusters.py); the first is the default. Unset (empty):
# one cluster, the one the variables above describe (portal.slurm.configured_clusters() reads them
# when asked), so a one-cluster site configures nothing new. Not SLURM_CLUSTERS: that is Slurm's own
# (--clusters for sinfo, squeue, sbatch, …), refused above.
GPUPORTAL_CLUSTERS = env.clusters("GPUPORTAL_CLUSTERS", [])
# /healthz calls Slurm down when the workers have not read it successfully for this long
SLURM_HEALTH_MAX_AGE = env.int("SLURM_HEALTH_MAX_AGE", 120, minimum=5)
# Unix users jobs run as: the portal submits as root with --uid/--gid (see docs/deploy.md)
SLURM_SUBMIT_AS_USER = env.bool("SLURM_SUBMIT_AS_USER", True)
# MaxArraySize until the inventory sync has read the cluster's own (scontrol show config; Slurm's default 1001):
# array indexes run 0 .. this - 1.
SLURM_MAX_ARRAY_SIZE = env.int("SLURM_MAX_ARRAY_SIZE", 1001, minimum=1)
# How far past its time limit Slurm may run (and charge) a job, until the inventory sync has read the
# cluster's OverTimeLimit and KillWait (jobs.inventory.overrun_seconds): with Slurm's defaults (0 min,
# 30 s) a job ends at most 30 s (slurmctld's time-limit check) + 30 s past its limit.
SLURM_OVERRUN_SECONDS_UNREAD = env.int("SLURM_OVERRUN_SECONDS_UNREAD", 60, minimum=0)

# Kubernetes (issue 41): the kubeconfig the portal reaches its Kubernetes GPU cluster with — for the local
# one (scripts/k8s up) its service account's, which holds only the rights the portal needs (RBAC). Not
# KUBECONFIG: kubectl and the kubernetes client read that one from the user's shell. Empty: none.
_local_k8s_kubeconfig = Path(env.str("GPUPORTAL_K8S_DIR", "/var/lib/gpuportal-k8s")) / "etc" / "portal.kubeconfig"
GPUPORTAL_K8S_KUBECONFIG = env.str(
    "GPUPORTAL_K8S_KUBECONFIG", str(_local_k8s_kubeconfig) if _local_k8s_kubeconfig.exists() else ""
)
# A Kubernetes cluster (GPUPORTAL_CLUSTERS, kind=kubernetes) runs a job's script in this image (the
# site's default; the local cluster's emulated nodes run the command on the host whatever it names),
# on the nodes whose GPU_TYPE_LABEL is the job's GPU type (the local node agent's label).
GPUPORTAL_K8S_IMAGE = env.str("GPUPORTAL_K8S_IMAGE", "docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04")
GPUPORTAL_K8S_GPU_TYPE_LABEL = env.str("GPUPORTAL_K8S_GPU_TYPE_LABEL", "gpuportal.io/gpu-type")
# The other images a user may name for a job on a Kubernetes cluster (the job's ``image`` field;
# comma-separated, as written in a pod spec); GPUPORTAL_K8S_IMAGE is always allowed. Empty: only it.
GPUPORTAL_K8S_IMAGES = env.list("GPUPORTAL_K8S_IMAGES", [])
# A finished Job (and its pod, with its log: the job's output) is deleted from Kubernetes this long after
# it ended, once the portal has recorded its final usage (the jobs sync, in bulk). 0: never deleted.
GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = env.int("GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS", 3600, minimum=0)
# Before it deletes a finished Job the sync keeps its pod's log (the job's output there) in the database,
# its first this many bytes (a longer log's copy says it was cut): the job page, the API and `gpuportal
# logs` serve it once the pod is gone (jobs.models.JobLogCopy). 1 MiB: one read of output. 0: none kept.
GPUPORTAL_K8S_LOG_COPY_MAX_BYTES = env.int("GPUPORTAL_K8S_LOG_COPY_MAX_BYTES", 1024 * 1024, minimum=0, maximum=256 * 1024 * 1024)

# Jobs
# Where a job is submitted from when the request names no directory (jobs/workdirs.py): a template
# with {user} (the cluster user name), {home} (that user's home), {team} (slug), {job} (the job's id);
# created by the relay when missing, as the user. Never a shared directory such as /tmp.
JOB_DEFAULT_WORKDIR = env.str("JOB_DEFAULT_WORKDIR", "{home}")
try:
    _workdir_sample = JOB_DEFAULT_WORKDIR.format(user="u", home="/home/u", team="t", job="j")
except (KeyError, IndexError, ValueError) as _exc:
    raise ImproperlyConfigured(f"Environment variable JOB_DEFAULT_WORKDIR={JOB_DEFAULT_WORKDIR!r} is invalid: "
                               f"placeholders are {{user}}, {{home}}, {{team}}, {{job}} ({_exc}).") from None  # fmt: skip
if not _workdir_sample.startswith("/"):
    raise ImproperlyConfigured(f"Environment variable JOB_DEFAULT_WORKDIR={JOB_DEFAULT_WORKDIR!r} is invalid: "
                               "expected an absolute path such as {home} or /scratch/{user}.")  # fmt: skip
# The job's output where the script names none, in its working directory: sbatch's own default
# (slurm-%j.out, stderr in the same file; with {stream}: .out and .err apart).
JOB_OUTPUT_PATTERN = env.str("JOB_OUTPUT_PATTERN", "{workdir}/slurm-{slurm_job_id}.out")
JOB_ACCEPTED_SWEEP_SECONDS = env.int("JOB_ACCEPTED_SWEEP_SECONDS", 30, minimum=1)
# A job whose Slurm id the controller's queue and accounting no longer know (never started) this long
# after the portal learnt the id was lost in a controller takeover: sent again (jobs.services.sync)
JOB_LOST_AFTER_SECONDS = env.int("JOB_LOST_AFTER_SECONDS", 60, minimum=10)
JOB_SYNC_INTERVAL_SECONDS = env.float("JOB_SYNC_INTERVAL_SECONDS", 5.0, minimum=0.5)
# A script's --begin may defer a job by at most this many days: the job's budget hold is taken at
# submission and kept while it waits (the reason --hold is refused), so a far-future --begin would
# park budget for as long. A week covers "start it after the weekend"; a site may allow more.
JOB_BEGIN_MAX_DAYS = env.int("JOB_BEGIN_MAX_DAYS", 7, minimum=0, maximum=366)
# The relay drain (group commit of single-job submissions, jobs.tasks.job_relay_drain): at most this
# many ACCEPTED jobs per claim; sbatch calls for them run in parallel, their outcomes are one bulk write.
JOB_RELAY_DRAIN_BATCH = env.int("JOB_RELAY_DRAIN_BATCH", 100, minimum=1, maximum=1000)

# The outbox's sweepers (portal/outbox.py; schedules in portal/project/celery.py): how often each looks for
# work whose enqueue was lost. Re-pricing after a new rate (accounting.services.usage_reprice_sweep),
# job-end e-mails (jobs.services.job_end_notify_sweep) and budget-alert webhooks
# (accounting.services.budget_alert_webhook_sweep) wait 5 minutes for their own task first.
USAGE_REPRICE_SWEEP_SECONDS = env.int("USAGE_REPRICE_SWEEP_SECONDS", 300, minimum=10)
JOB_END_NOTIFY_SWEEP_SECONDS = env.int("JOB_END_NOTIFY_SWEEP_SECONDS", 300, minimum=10)
BUDGET_ALERT_WEBHOOK_SWEEP_SECONDS = env.int("BUDGET_ALERT_WEBHOOK_SWEEP_SECONDS", 300, minimum=10)
# Budget holds whose final usage never comes (jobs.services.budget_holds_sweep): a job that ended this
# many hours ago without a final usage record, a job row deleted, a job left on a cluster no longer
# configured. Final records normally arrive within a minute or two of the end (usage-ingest runs
# every minute); a slurmdbd outage delays them until it is back (slurmctld keeps them). 24 h covers
# an outage through a night; past that the hold only blocks the team's budget. Releasing early never
# charges twice nor loses a charge: "used" comes from the usage slices, so a record arriving later is
# still counted. BUDGET_HOLD_SWEEP_SECONDS: how often the sweep runs.
BUDGET_HOLD_RELEASE_AFTER_HOURS = env.int("BUDGET_HOLD_RELEASE_AFTER_HOURS", 24, minimum=1, maximum=24 * 31)
BUDGET_HOLD_SWEEP_SECONDS = env.int("BUDGET_HOLD_SWEEP_SECONDS", 3600, minimum=60)

# GPU monitoring (portal/prometheus.py, jobs.services.gpu_usage): what the GPUs did, from the site's
# Prometheus (HTTP API only). Empty PROMETHEUS_URL: off (no figures, no alerts). The metric and label
# names are the GPU exporter's: dcgm-exporter's by default (--hpc-job-mapping-dir gives hpc_job; its
# releases after 4.8.2 call the host label "hostname"); nvidia_gpu_exporter: GPU_METRIC_UTIL=
# nvidia_smi_utilization_gpu_ratio GPU_METRIC_UTIL_SCALE=100 GPU_METRIC_MEMORY=nvidia_smi_memory_used_bytes
# GPU_METRIC_MEMORY_SCALE=0.00000095367431640625 and its job/host/GPU labels (from relabelling).
PROMETHEUS_URL = env.url("PROMETHEUS_URL", "", schemes=("http", "https")) if env.str("PROMETHEUS_URL") else ""
PROMETHEUS_TIMEOUT = env.int("PROMETHEUS_TIMEOUT", 10, minimum=1, maximum=120)
GPU_METRIC_UTIL = env.str("GPU_METRIC_UTIL", "DCGM_FI_DEV_GPU_UTIL")
GPU_METRIC_UTIL_SCALE = env.float("GPU_METRIC_UTIL_SCALE", 1.0, minimum=0)  # x this = %
GPU_METRIC_MEMORY = env.str("GPU_METRIC_MEMORY", "DCGM_FI_DEV_FB_USED")
GPU_METRIC_MEMORY_SCALE = env.float("GPU_METRIC_MEMORY_SCALE", 1.0, minimum=0)  # x this = MiB
GPU_LABEL_JOB = env.str("GPU_LABEL_JOB", "hpc_job")  # the Slurm job id (an array task's own id)
GPU_LABEL_HOST = env.str("GPU_LABEL_HOST", "Hostname")
GPU_LABEL_GPU = env.str("GPU_LABEL_GPU", "gpu")
GPU_LABEL_MODEL = env.str("GPU_LABEL_MODEL", "modelName")
# The Slurm cluster's name (ClusterName) on every series, from the scrape configuration; empty: one
# cluster, or job ids that never collide between clusters.
GPU_LABEL_CLUSTER = env.str("GPU_LABEL_CLUSTER", "cluster")
# The sync (one range query a cycle for every running job; schedule in portal/project/celery.py): every
# GPU_USAGE_SYNC_SECONDS, points read a GPU_USAGE_STEP_SECONDS step apart (each the mean over it).
GPU_USAGE_SYNC_SECONDS = env.int("GPU_USAGE_SYNC_SECONDS", 60, minimum=1)
GPU_USAGE_STEP_SECONDS = env.int("GPU_USAGE_STEP_SECONDS", 60, minimum=1)
# After an outage the sync catches up at most this far back (Prometheus keeps the data meanwhile)
GPU_USAGE_MAX_CATCHUP_HOURS = env.int("GPU_USAGE_MAX_CATCHUP_HOURS", 6, minimum=1, maximum=24 * 14)
# A GPU under this utilisation is idle; a running job whose GPUs all stayed idle this long alerts
# its submitter once (e-mail, the team's webhook): the window must be full, so no job alerts in its first minutes.
GPU_IDLE_THRESHOLD_PERCENT = env.float("GPU_IDLE_THRESHOLD_PERCENT", 5.0, minimum=0)
GPU_IDLE_ALERT_MINUTES = env.int("GPU_IDLE_ALERT_MINUTES", 30, minimum=1)
# The idle-GPU policy (issue 40 item 3; README "Idle-GPU policy"): each team's managers may turn one on
# (off by default) within these site-wide bounds, which the admin sets here: a GPU under at most
# GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT counts as idle; the warning comes after at least
# GPU_IDLE_POLICY_MIN_WARN_MINUTES of idle GPUs and the cancel at least GPU_IDLE_POLICY_MIN_CANCEL_MINUTES
# after the warning (both at most GPU_IDLE_POLICY_MAX_MINUTES). A team's policy outside bounds changed
# later is applied clamped into them. Minutes may have a fraction.
GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT = env.float("GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT", 10.0, minimum=0.01)
GPU_IDLE_POLICY_MIN_WARN_MINUTES = env.float("GPU_IDLE_POLICY_MIN_WARN_MINUTES", 15.0, minimum=0.01)
GPU_IDLE_POLICY_MIN_CANCEL_MINUTES = env.float("GPU_IDLE_POLICY_MIN_CANCEL_MINUTES", 15.0, minimum=0.01)
GPU_IDLE_POLICY_MAX_MINUTES = env.float("GPU_IDLE_POLICY_MAX_MINUTES", 7 * 24 * 60.0, minimum=1)
# A pending job's expected start (Slurm's backfill estimate, jobs_sync) that moves by more than this
# is noted on its page and in its history ("expected start moved from X to Y").
START_ESTIMATE_MOVE_MINUTES = env.int("START_ESTIMATE_MOVE_MINUTES", 30, minimum=1)
# The idle alerts' own sweeper (jobs.services.gpu_idle_alerts_sweep): raises the alerts the recorded
# rows call for and re-sends the deliveries whose task was lost, whatever happened to the sync.
GPU_IDLE_ALERT_SWEEP_SECONDS = env.int("GPU_IDLE_ALERT_SWEEP_SECONDS", 300, minimum=10)
# A job's stored GPU series (jobs.gpu_summary, written at its end): at most 240 points per GPU, and
# buckets of at least this many seconds (the raw points stay in Prometheus).
GPU_SERIES_MIN_BUCKET_SECONDS = env.int("GPU_SERIES_MIN_BUCKET_SECONDS", 300, minimum=1, maximum=86400)

# Retention (jobs.services.retention_apply, Celery beat "retention"; README "Retention"): how many days
# after a job's end its detail is kept; 0 keeps it for ever. Never touches what accounting charged
# (usage records, slices, invoices and reports read those only).
RETENTION_SWEEP_SECONDS = env.int("RETENTION_SWEEP_SECONDS", 3600, minimum=60)
RETENTION_BATCH = env.int("RETENTION_BATCH", 5000, minimum=100, maximum=100000)
# the per-GPU working rows (JobGpuUsage) once the job's summary is stored; and legacy raw points
RETENTION_GPU_ROWS_DAYS = env.int("RETENTION_GPU_ROWS_DAYS", 7, minimum=1, maximum=36500)
# the job's GPU summary and its downsampled series (the chart after Prometheus forgot)
RETENTION_GPU_SUMMARY_DAYS = env.int("RETENTION_GPU_SUMMARY_DAYS", 0, minimum=0, maximum=36500)
if RETENTION_GPU_SUMMARY_DAYS and RETENTION_GPU_SUMMARY_DAYS < RETENTION_GPU_ROWS_DAYS:
    raise ImproperlyConfigured("Environment variable RETENTION_GPU_SUMMARY_DAYS is shorter than RETENTION_GPU_ROWS_DAYS: "
                               "the working rows expire only once their job's summary is stored; set it 0 or at least as long.")
# the job's state history (JobEvent)
RETENTION_JOB_EVENTS_DAYS = env.int("RETENTION_JOB_EVENTS_DAYS", 0, minimum=0, maximum=36500)
# the job page's references to its output files (shown no more after this; the files are the user's)
RETENTION_JOB_OUTPUT_DAYS = env.int("RETENTION_JOB_OUTPUT_DAYS", 0, minimum=0, maximum=36500)
# the audit trail (AuditEvent), by its age
RETENTION_AUDIT_DAYS = env.int("RETENTION_AUDIT_DAYS", 0, minimum=0, maximum=36500)

# Accounting
DEFAULT_CURRENCY = env.str("DEFAULT_CURRENCY", "CNY")
# Quotas (accounting.services.budget_holds_place): a team without an approved quota for the current
# period is "blocked" (jobs refused with a 409 asking for a quota) or "unlimited".
QUOTA_NO_QUOTA_POLICY = env.choice("QUOTA_NO_QUOTA_POLICY", "blocked", ("blocked", "unlimited"))

# API tokens: 0 = a token may live for ever (each may still be given an expiry); N = at most N days
API_TOKEN_MAX_DAYS = env.int("API_TOKEN_MAX_DAYS", 0, minimum=0, maximum=3650)

# Read-mostly rows (inventory, rate book) kept per process, re-read when their writer moves the
# version in the cache, and at least this often (portal/snapshots.py). 0: read them every time.
SNAPSHOT_MAX_AGE_SECONDS = env.int("SNAPSHOT_MAX_AGE_SECONDS", 300, minimum=0, maximum=86400)
# A token's lookup (token -> user) kept in the cache this long (portal/authentication.py). Revoking a
# token in the portal and its expiry take effect at once; a user made inactive, or a token deleted
# outside the portal's services, within this many seconds. 0: look it up on every request.
API_TOKEN_CACHE_SECONDS = env.int("API_TOKEN_CACHE_SECONDS", 30, minimum=0, maximum=3600)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: unauthenticated API requests get 401 with WWW-Authenticate: Token
        "portal.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],  # bodies are JSON; anything else: 415
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "portal.schema.PortalAutoSchema",  # documents every error status (portal/schema.py)
    "EXCEPTION_HANDLER": "portal.exceptions.api_exception_handler",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_THROTTLE_RATES": {
        "login": env.str("THROTTLE_LOGIN", "20/min"),
        # per user; protects the portal, not Slurm: above what one portal sustains (bench/bench_demo.py:
        # 280 single-job POSTs/s accepted from 8 clients on 2 cores), so that one user's script is
        # limited by the portal's speed, not by this; bursts of up to the whole minute's allowance
        # (portal.throttles.CellRateThrottle); a batch POST (up to 100 jobs) counts once
        "submit": env.str("THROTTLE_SUBMIT", "30000/min"),
    },
}

SPECTACULAR_SETTINGS = {
    "TITLE": "gpuportal API",
    "DESCRIPTION": "Submit GPU jobs to Slurm, book GPU quotas and read what they cost.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "weasyprint": {"level": "WARNING"}, "fontTools": {"level": "WARNING"}},
}

# Accounting: usage ingestion (accounting.services.usage_ingest) and own-cluster-vs-cloud figures
ACCOUNTING_INGEST_OVERLAP_SECONDS = env.int("ACCOUNTING_INGEST_OVERLAP_SECONDS", 600, minimum=0)
ACCOUNTING_INGEST_BACKFILL_DAYS = env.int("ACCOUNTING_INGEST_BACKFILL_DAYS", 35, minimum=1)
ACCOUNTING_INGEST_WINDOW_DAYS = env.int("ACCOUNTING_INGEST_WINDOW_DAYS", 7, minimum=1)
# How far each cluster's slurmdbd has rolled usage up (accounting.services.rollup_record, every
# ACCOUNTING_ROLLUP_CHECK_SECONDS per cluster): stale after this many minutes (it rolls up every full
# hour), looked for this many hours back.
ACCOUNTING_ROLLUP_STALE_MINUTES = env.int("ACCOUNTING_ROLLUP_STALE_MINUTES", 70, minimum=61)
ACCOUNTING_ROLLUP_SEARCH_HOURS = env.int("ACCOUNTING_ROLLUP_SEARCH_HOURS", 48, minimum=1)
ACCOUNTING_ROLLUP_CHECK_SECONDS = env.int("ACCOUNTING_ROLLUP_CHECK_SECONDS", 300, minimum=10)
ACCOUNTING_PROVISIONAL_MAX_AGE_DAYS = env.int("ACCOUNTING_PROVISIONAL_MAX_AGE_DAYS", 3, minimum=1)
# Closed months' totals (accounting.services.usage_rollup): a month closes this many days after its end
# and is rolled up by the periodic task every USAGE_ROLLUP_SECONDS (a late record re-opens it).
USAGE_MONTH_CLOSE_DAYS = env.int("USAGE_MONTH_CLOSE_DAYS", 3, minimum=0, maximum=27)
USAGE_ROLLUP_SECONDS = env.int("USAGE_ROLLUP_SECONDS", 3600, minimum=60)
# Each running budget total's used figure moves by what each ingestion changes
# (accounting.services.budget); every BUDGET_TOTALS_CHECK_SECONDS the totals of periods not over
# yet are checked against the usage slices and a stale one corrected (logged).
BUDGET_TOTALS_CHECK_SECONDS = env.int("BUDGET_TOTALS_CHECK_SECONDS", 3600, minimum=60)
# An invoice lists its jobs one per line up to this many (above: the lines per user, GPU type and
# rate, and the jobs as a CSV download: accounting.invoices)
INVOICE_JOB_LINES_MAX = env.int("INVOICE_JOB_LINES_MAX", 500, minimum=0)
# "type=price per GPU-hour,…" in DEFAULT_CURRENCY; parsed strictly by accounting.reports.cloud_gpu_hour_prices
CLOUD_GPU_HOUR_PRICES = env.str("CLOUD_GPU_HOUR_PRICES", "a100=8,h100=20")
CLUSTER_PURCHASE_COST = env.float("CLUSTER_PURCHASE_COST", 1800000.0, minimum=0)  # DEFAULT_CURRENCY
CLUSTER_DEPRECIATION_MONTHS = env.int("CLUSTER_DEPRECIATION_MONTHS", 48, minimum=1)
CLUSTER_MONTHLY_OPEX = env.float("CLUSTER_MONTHLY_OPEX", 20000.0, minimum=0)  # power, cooling, staff share

# Bookings (accounting.services.booking_create): bookings up to this many GPU-hours are approved at
# once, larger ones wait for an admin; "reserved" charges every reserved GPU-hour (usage inside the
# booking's reservation is then free), "used" charges only usage (the booking itself costs nothing).
BOOKING_AUTO_APPROVE_GPU_HOURS = env.int("BOOKING_AUTO_APPROVE_GPU_HOURS", 32, minimum=0)
BOOKING_CHARGE_MODE = env.choice("BOOKING_CHARGE_MODE", "reserved", ("reserved", "used"))
BOOKING_MAX_DAYS = env.int("BOOKING_MAX_DAYS", 31, minimum=1)
BOOKING_MIN_MINUTES = env.int("BOOKING_MIN_MINUTES", 10, minimum=1)

# Metrics: GET /metrics for Prometheus (portal.project.metrics). Every configured check must pass: the
# bearer token when set, REMOTE_ADDR in the allow-list when it is not empty (proxied requests are
# never admitted by address). Neither configured: the endpoint refuses everything. No address is
# allowed by default: loopback would admit every job on a host that is also a compute node (the
# demo: every node is this host), and the figures are every team's; scrape with the token, or list
# the Prometheus host's address where no job runs.
METRICS_TOKEN = env.str("METRICS_TOKEN", "")
METRICS_ALLOWED_IPS = env.networks("METRICS_ALLOWED_IPS", [])
# The relay-latency and queue-wait histograms cover the jobs of this many last hours
METRICS_HISTOGRAM_WINDOW_HOURS = env.int("METRICS_HISTOGRAM_WINDOW_HOURS", 24, minimum=1, maximum=24 * 31)
