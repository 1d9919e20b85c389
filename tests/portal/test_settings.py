"""Settings read the environment strictly: a bad value stops start-up naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import Env

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
    assert pg["OPTIONS"] == {"options": "-c jit=off"}
    own = Env({"DATABASE_URL": "postgres://u@h/gp?sslmode=require&options=-c%20work_mem%3D64MB"}).database("DATABASE_URL", "")
    assert own["OPTIONS"] == {"sslmode": "require", "options": "-c work_mem=64MB"}
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        Env({"DATABASE_URL": "postgres://host:5432/"}).database("DATABASE_URL", "")


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
