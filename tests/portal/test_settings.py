"""Settings read the environment strictly: a bad value stops start-up naming the variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import TCP_DEFAULTS, Env

ROOT = Path(__file__).resolve().parents[2]


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY")} | env
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SLURM_BACKEND", "slurmrestd"),
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://x@y/z"),
        ("CELERY_BROKER_URL", "amqp://guest@localhost//"),
        ("TIME_ZONE", "Mars/Olympus"),
        ("SLURM_TIMEOUT", "soon"),
    ],
)
def test_bad_environment_value_stops_startup_naming_the_variable(variable, value):
    result = _manage("check", **{variable: value})
    assert result.returncode != 0
    assert f"Environment variable {variable}=" in result.stderr
    assert "ImproperlyConfigured" in result.stderr


def test_secret_key_is_required_when_debug_is_off():
    result = _manage("check", DEBUG="0")
    assert result.returncode != 0
    assert "Environment variable SECRET_KEY is required" in result.stderr


def test_check_deploy_is_clean_with_production_settings():
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DEBUG="0",
        SECRET_KEY="k" * 20 + "production-secret-value-1234567890-abcdefghijklmn",
        ALLOWED_HOSTS="portal.example.org",
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_database_url_parses_postgres():
    pg = Env({"DATABASE_URL": "postgres://u:p%40ss@db.example:6543/gp"}).database("DATABASE_URL", "")
    assert (pg["ENGINE"], pg["NAME"], pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"]) == (
        "django.db.backends.postgresql", "gp", "u", "p@ss", "db.example", "6543",
    )
    assert pg["OPTIONS"] == {"options": "-c jit=off", **TCP_DEFAULTS}
    assert TCP_DEFAULTS["tcp_user_timeout"] == "10000"  # a cut link fails a query in 10 s (docs/deploy.md)
    own = Env({"DATABASE_URL": "postgres://u@h/gp?sslmode=require&options=-c%20work_mem%3D64MB"}).database("DATABASE_URL", "")
    assert own["OPTIONS"] == {"sslmode": "require", "options": "-c work_mem=64MB", **TCP_DEFAULTS}
    mine = Env({"DATABASE_URL": "postgres://u@h/gp?tcp_user_timeout=3000"}).database("DATABASE_URL", "")
    assert mine["OPTIONS"]["tcp_user_timeout"] == "3000"  # the URL's win
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        Env({"DATABASE_URL": "postgres://host:5432/"}).database("DATABASE_URL", "")


def test_a_multi_host_database_url_lists_every_host_for_psycopg():
    """libpq's multi-host URL (docs/deploy.md "Settings for a site with failover"): HOST and PORT as
    the comma-separated lists Django's backend hands to psycopg.connect; the query string as OPTIONS."""
    url = "postgres://gp:s%3Acret@db-a:5432,db-b:5433,[fd00::3]/gpuportal?target_session_attrs=read-write&connect_timeout=3"
    pg = Env({"DATABASE_URL": url}).database("DATABASE_URL", "")
    assert (pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"], pg["NAME"]) == (
        "gp", "s:cret", "db-a,db-b,fd00::3", "5432,5433,5432", "gpuportal",
    )  # fmt: skip
    assert pg["OPTIONS"] == {
        "target_session_attrs": "read-write", "connect_timeout": "3", "options": "-c jit=off", **TCP_DEFAULTS,
    }  # fmt: skip
    assert pg["CONN_HEALTH_CHECKS"] is True  # a connection the failover killed is replaced at the next request
    no_ports = Env({"DATABASE_URL": "postgres://gp@db-a,db-b/gpuportal"}).database("DATABASE_URL", "")
    assert (no_ports["HOST"], no_ports["PORT"]) == ("db-a,db-b", "")  # libpq's default port for each
    socket = Env({"DATABASE_URL": "postgres:///gpuportal"}).database("DATABASE_URL", "")
    assert (socket["HOST"], socket["PORT"], socket["NAME"]) == ("", "", "gpuportal")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgres://gp@db-a:5432,:5432/gp", "a host for every entry"),
        ("postgres://gp@db-a:5432,db-b:54x2/gp", "a numeric port"),
        ("postgres://gp@db-a:99999/gp", "a numeric port"),
        ("postgres://gp@db-a,db-b/gp?connect_timeout=soon", "connect_timeout as whole seconds"),
        ("postgres://gp@db-a,db-b/", "a database name"),
    ],
    ids=["empty-host", "bad-port", "port-too-big", "bad-timeout", "no-name"],
)
def test_a_malformed_multi_host_database_url_names_the_variable(url, says):
    with pytest.raises(ImproperlyConfigured, match=rf"Environment variable DATABASE_URL=.*{re.escape(says)}"):
        Env({"DATABASE_URL": url}).database("DATABASE_URL", "")


def test_redis_urls_may_be_one_server_or_the_sentinels_of_one_master():
    from portal.redis_client import parse_redis_url

    env = Env({
        "CACHE_URL": "sentinel://:pw@s1:26379/1;sentinel://s2:26380/1;sentinel://s3",
        "CELERY_BROKER_URL": "sentinel://s1:26379/0;sentinel://s2:26379/0",
        "PLAIN": "redis://:pw@cache:6380/2",
    })  # fmt: skip
    cache = parse_redis_url(env.redis_url("CACHE_URL", ""))
    assert cache.sentinels == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (cache.db, cache.password) == (1, "pw")  # the first part's, as kombu reads them
    assert parse_redis_url(env.redis_url("CELERY_BROKER_URL", "")).db == 0
    plain = parse_redis_url(env.redis_url("PLAIN", ""))
    assert (plain.sentinels, plain.db, plain.password) == ((), 2, "pw")
    assert env.redis_url("CELERY_BROKER_URL_MEMORY", "memory://", also=("memory",)) == "memory://"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("amqp://guest@localhost//", "redis://, rediss:// or sentinel://"),
        ("redis://a:6379/0;redis://b:6379/0", "one redis:// server"),
        ("redis://cache:6379/one", "a database number"),
        ("sentinel://s1:26379/0;redis://s2:6379/0", "part 2"),
        ("sentinel://s1:26379/0;sentinel://s2:26379/1", "one database for the master"),
        ("sentinel://:a@s1/0;sentinel://:b@s2/0", "user and password on the first part only"),
        ("sentinel://s1:2x/0", "a numeric port"),
        ("sentinel://s1/0;", "part 2"),
        ("sentinel://s1/0?master_name=x", "without ?options"),
    ],
    ids=["amqp", "two-servers", "db-name", "mixed", "two-dbs", "two-passwords", "bad-port", "empty-part", "query"],
)
def test_a_malformed_redis_url_names_the_variable(value, says):
    with pytest.raises(ImproperlyConfigured, match=rf"Environment variable CACHE_URL=.*{re.escape(says)}"):
        Env({"CACHE_URL": value}).redis_url("CACHE_URL", "")


def test_sentinel_urls_reach_the_settings_with_the_master_name():
    code = (
        "from django.conf import settings as s; o = s.CELERY_BROKER_TRANSPORT_OPTIONS; print(s.CACHES['default']['LOCATION'], "
        "o['master_name'], o['sentinel_kwargs']['password'], s.CACHES['default']['OPTIONS']['pool_class'])"
    )
    result = _manage(
        "shell", "-v", "0", "-c", code, CACHE_URL="sentinel://s1:26379/1;sentinel://s2:26379/1",
        CELERY_BROKER_URL="sentinel://s1:26379/0;sentinel://s2:26379/0", REDIS_SENTINEL_MASTER="site-a",
        REDIS_SENTINEL_PASSWORD="s-pw",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "['sentinel://s1:26379/1;sentinel://s2:26379/1']", "site-a", "s-pw", "portal.redis_client.UrlConnectionPool",
    ]  # fmt: skip
    bad = _manage("check", REDIS_SENTINEL_MASTER="my master")
    assert bad.returncode != 0 and "Environment variable REDIS_SENTINEL_MASTER='my master' is invalid" in bad.stderr


@pytest.mark.parametrize("url", ["sqlite:///.run/db.sqlite3", "mysql://gpuportal@127.0.0.1/gpuportal", "gpuportal"])
def test_database_url_other_than_postgresql_is_refused_with_the_reason(url):
    with pytest.raises(ImproperlyConfigured, match=r"DATABASE_URL=.*PostgreSQL.*select_for_update"):
        Env({"DATABASE_URL": url}).database("DATABASE_URL", "")


def test_sqlite_database_url_stops_startup():
    result = _manage("check", DATABASE_URL="sqlite:///.run/db.sqlite3")
    assert result.returncode != 0
    assert "Environment variable DATABASE_URL='sqlite:///.run/db.sqlite3' is invalid" in result.stderr
    assert "needs PostgreSQL" in result.stderr


def test_default_database_is_the_postgresql_of_scripts_services():
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    code = "from django.conf import settings as s; d = s.DATABASES['default']; print(d['ENGINE'], d['HOST'], d['PORT'], d['NAME'])"
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.postgresql", "127.0.0.1", "5432", "gpuportal"]


def test_int_bounds_are_enforced():
    with pytest.raises(ImproperlyConfigured, match=r"SLURM_TIMEOUT='0'.*>= 1"):
        Env({"SLURM_TIMEOUT": "0"}).int("SLURM_TIMEOUT", 10, minimum=1)
    assert Env({}).int("SLURM_TIMEOUT", 10, minimum=1) == 10


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_float_settings_refuse_nan_and_infinity(value):
    with pytest.raises(ImproperlyConfigured, match=r"JOB_SYNC_INTERVAL_SECONDS=.*a finite number"):
        Env({"JOB_SYNC_INTERVAL_SECONDS": value}).float("JOB_SYNC_INTERVAL_SECONDS", 5.0, minimum=0.5)
    result = _manage("check", CLUSTER_MONTHLY_OPEX=value)
    assert result.returncode != 0 and "Environment variable CLUSTER_MONTHLY_OPEX=" in result.stderr


def test_secrets_come_from_the_variable_or_its_file(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text(" pass word \n")
    assert Env({"EMAIL_HOST_PASSWORD_FILE": str(secret)}).secret("EMAIL_HOST_PASSWORD") == " pass word "
    assert Env({"EMAIL_HOST_PASSWORD": " as is "}).secret("EMAIL_HOST_PASSWORD") == " as is "
    assert Env({}).secret("EMAIL_HOST_PASSWORD") == ""


def test_trusted_proxies_must_be_addresses_or_networks():
    assert Env({"TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8,::1"}).networks("TRUSTED_PROXIES", []) == [
        "127.0.0.1", "10.0.0.0/8", "::1",
    ]
    result = _manage("check", TRUSTED_PROXIES="127.0.0.1,nginx.local")
    assert result.returncode != 0 and "Environment variable TRUSTED_PROXIES=" in result.stderr and "nginx.local" in result.stderr


# ---------------------------------------------------------------- names another tool reads (portal.env.RENAMED)


def test_slurm_clusters_in_the_environment_stops_start_up_naming_gpuportal_clusters():
    with pytest.raises(ImproperlyConfigured, match=r"SLURM_CLUSTERS is Slurm's own variable.*reads GPUPORTAL_CLUSTERS: rename it"):
        Env({"SLURM_CLUSTERS": ""}).refuse_renamed()  # set at all, even empty
    assert Env({"GPUPORTAL_CLUSTERS": "name=gpuportal", "SLURM_CONF": "/x/slurm.conf"}).refuse_renamed() is None
    result = _manage("check", SLURM_CLUSTERS="name=gpuportal,conf=/etc/slurm/slurm.conf")
    assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr
    assert "SLURM_CLUSTERS is Slurm's own variable" in result.stderr and "reads GPUPORTAL_CLUSTERS" in result.stderr


# ---------------------------------------------------------------- the demo's environment file (RUN_DIR/env)


def _settings_values(code: str, *, drop: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """`manage.py shell -c CODE` in an environment without DEBUG, SECRET_KEY, TIME_ZONE and ``drop``, plus ``env``."""
    gone = ("DEBUG", "SECRET_KEY", "TIME_ZONE", "GPUPORTAL_ENV_FILE", "GPUPORTAL_CLUSTERS", *drop)
    environ = {k: v for k, v in os.environ.items() if k not in gone} | env
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", code],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_env_file_is_read_verbatim_skipping_comments_and_blank_lines(tmp_path):
    from portal.env import read_env_file

    path = tmp_path / "env"
    path.write_text("# scripts/demo start\n\nDATABASE_URL=postgres://u:p#=w d@h/gp\nDEBUG=\nSECRET_KEY= a b \n")
    assert read_env_file(path) == {"DATABASE_URL": "postgres://u:p#=w d@h/gp", "DEBUG": "", "SECRET_KEY": " a b "}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("DEBUG=0\nexport SECRET_KEY=x\n", r"line 2: expected NAME=value, got 'export SECRET_KEY=x'"),
        ("DEBUG=0\n\nSECRET_KEY\n", r"line 3: expected NAME=value, got 'SECRET_KEY'"),
        ("1DEBUG=0\n", r"line 1: expected NAME=value"),
        (" DEBUG=0\n", r"line 1: expected NAME=value"),
        ("DEBUG=0\nDEBUG=1\n", r"line 2: DEBUG is given twice"),
    ],
)
def test_a_malformed_env_file_stops_start_up_naming_the_file_and_line(tmp_path, text, says):
    from portal.env import read_env_file

    path = tmp_path / "env"
    path.write_text(text)
    with pytest.raises(ImproperlyConfigured, match=f"Environment file {path}, " + says):
        read_env_file(path)
    result = _settings_values("from django.conf import settings; print(settings.DEBUG)", GPUPORTAL_ENV_FILE=str(path))
    assert result.returncode != 0 and f"Environment file {path}, line " in result.stderr


def test_the_real_environment_wins_over_the_env_file_even_when_empty(tmp_path):
    path = tmp_path / "env"
    path.write_text("TIME_ZONE=Asia/Shanghai\nDEFAULT_CURRENCY=EUR\nTHROTTLE_LOGIN=5/min\n")
    env = Env({"DEFAULT_CURRENCY": "USD", "THROTTLE_LOGIN": ""}).with_file(path)
    assert (env.str("TIME_ZONE"), env.str("DEFAULT_CURRENCY"), env.environ["THROTTLE_LOGIN"]) == ("Asia/Shanghai", "USD", "")
    assert Env({"X": "1"}).with_file(None).environ == {"X": "1"}


def test_which_env_file_is_read(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert Env({}).env_file(run_dir) is None  # production: no file
    (run_dir / "env").write_text("DEBUG=0\n")
    assert Env({}).env_file(run_dir) == run_dir / "env"  # the checkout after make demo
    assert Env({"PYTEST_VERSION": "9"}).env_file(run_dir) is None  # the tests: their own environment only
    other = tmp_path / "other.env"
    other.write_text("DEBUG=0\n")
    assert Env({"PYTEST_VERSION": "9", "GPUPORTAL_ENV_FILE": str(other)}).env_file(run_dir) == other
    assert Env({"GPUPORTAL_ENV_FILE": ""}).env_file(run_dir) is None
    with pytest.raises(ImproperlyConfigured, match=r"GPUPORTAL_ENV_FILE=.*an existing file"):
        Env({"GPUPORTAL_ENV_FILE": str(tmp_path / "missing")}).env_file(run_dir)


def test_manage_py_in_the_checkout_reads_the_demos_env_file_for_what_the_environment_lacks(tmp_path):
    """`python manage.py …` after `make demo` without the eval: settings read RUN_DIR/env (written by
    scripts/demo start); a variable of the real environment wins; a process started by the tests
    (PYTEST_VERSION inherited) ignores the file."""
    (tmp_path / "env").write_text("TIME_ZONE=Asia/Shanghai\nDEFAULT_CURRENCY=EUR\nGPUPORTAL_CLUSTERS=name=fromfile\n")
    code = "from django.conf import settings as s; print(s.TIME_ZONE, s.DEFAULT_CURRENCY, [c.name for c in s.GPUPORTAL_CLUSTERS])"
    by_hand = _settings_values(code, drop=("PYTEST_VERSION", "DEFAULT_CURRENCY"), GPUPORTAL_RUN_DIR=str(tmp_path), TIME_ZONE="UTC")
    assert by_hand.returncode == 0, by_hand.stderr
    assert by_hand.stdout.split() == ["UTC", "EUR", "['fromfile']"]
    in_tests = _settings_values(code, drop=("DEFAULT_CURRENCY",), GPUPORTAL_RUN_DIR=str(tmp_path))
    assert in_tests.returncode == 0, in_tests.stderr
    assert in_tests.stdout.split() == ["UTC", "CNY", "[]"]


def test_slurm_clusters_in_the_env_file_is_refused_too(tmp_path):
    (tmp_path / "env").write_text("SLURM_CLUSTERS=name=gpuportal\n")
    result = _settings_values("from django.conf import settings; print(settings.DEBUG)", GPUPORTAL_ENV_FILE=str(tmp_path / "env"))
    assert result.returncode != 0 and "reads GPUPORTAL_CLUSTERS" in result.stderr


def test_the_kubeconfig_is_gpuportal_k8s_kubeconfig_never_kubectls_own(tmp_path):
    """KUBECONFIG is kubectl's and the kubernetes client's: the portal reads GPUPORTAL_K8S_KUBECONFIG, and
    without it the local cluster's (GPUPORTAL_K8S_DIR/etc/portal.kubeconfig) when scripts/k8s wrote one."""
    code = "from django.conf import settings; print(repr(settings.GPUPORTAL_K8S_KUBECONFIG))"
    drop = ("GPUPORTAL_K8S_KUBECONFIG",)
    named = _settings_values(code, drop=drop, KUBECONFIG="/root/.kube/config", GPUPORTAL_K8S_KUBECONFIG="/srv/k8s.conf")
    assert named.stdout.strip() == "'/srv/k8s.conf'", named.stderr
    unset = _settings_values(code, drop=drop, KUBECONFIG="/root/.kube/config", GPUPORTAL_K8S_DIR=str(tmp_path))
    assert unset.stdout.strip() == "''", unset.stderr
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "portal.kubeconfig").write_text("apiVersion: v1\n")
    local = _settings_values(code, drop=drop, KUBECONFIG="/root/.kube/config", GPUPORTAL_K8S_DIR=str(tmp_path))
    assert local.stdout.strip() == repr(str(tmp_path / "etc" / "portal.kubeconfig")), local.stderr
