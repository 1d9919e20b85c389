"""Strict readers for environment variables. A bad value stops start-up with a message that names
the variable and says what was expected; nothing is silently replaced by a default."""

from __future__ import annotations

import math
import os
import re
from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Names the portal once read that another tool reads from the same shell, each with the name the
# portal reads instead and what the other tool does with it. Set, they stop start-up (Env.refuse_renamed):
# a shell that exports one for the portal breaks that tool. SLURM_CLUSTERS: Slurm's commands read it as
# --clusters (their man pages, ENVIRONMENT VARIABLES; SLURM-NOTES.md "Measured 2026-12-05").
RENAMED = {
    "SLURM_CLUSTERS": (
        "GPUPORTAL_CLUSTERS",
        "Slurm's own variable (sinfo, squeue, sbatch, srun, salloc, scancel and scontrol read it as --clusters)",
    ),
}


def read_env_file(path: Path) -> dict[str, str]:
    """The NAME=value lines of ``path`` (what ``scripts/demo start`` writes into the run directory's
    ``env``). A value is the rest of its line, verbatim: no quotes, no escapes, no ``export``. Blank
    lines and lines starting with ``#`` are skipped; any other line without a valid NAME=, and a name
    given twice, stop start-up naming the file and the line. An unreadable file stops it too."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImproperlyConfigured(f"Environment file {path} cannot be read: {exc}.") from None
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals or not _NAME_RE.fullmatch(name):
            raise ImproperlyConfigured(f"Environment file {path}, line {number}: expected NAME=value, got {line!r}.")
        if name in values:
            raise ImproperlyConfigured(f"Environment file {path}, line {number}: {name} is given twice.")
        values[name] = value
    return values


class Env:
    """Reads one environment mapping (os.environ by default) through typed helpers."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = os.environ if environ is None else environ

    def env_file(self, run_dir: Path) -> Path | None:
        """The file of defaults this environment names: GPUPORTAL_ENV_FILE when set (empty: none; a
        file named there must exist), else ``run_dir``/env when it exists (``scripts/demo start``
        writes it in the checkout; production has none). Under pytest (PYTEST_VERSION, which pytest
        sets for its run and the processes tests start inherit) only GPUPORTAL_ENV_FILE names one:
        the tests' settings come from their own environment, whatever demo ran in the checkout."""
        named = self._raw("GPUPORTAL_ENV_FILE")
        if named is not None:
            if named and not Path(named).is_file():
                raise self._fail("GPUPORTAL_ENV_FILE", named, "an existing file (empty: none)")
            return Path(named) if named else None
        default = Path(run_dir) / "env"
        return default if "PYTEST_VERSION" not in self.environ and default.is_file() else None

    def with_file(self, path: Path | None) -> Env:
        """This environment, with the values of ``path`` (read_env_file) for the names it lacks: a
        variable of the real environment always wins, even an empty one. ``path`` None: unchanged."""
        if path is None:
            return self
        return Env(ChainMap(self.environ, read_env_file(path)))

    def refuse_renamed(self) -> None:
        """Stop start-up when a name of RENAMED is set (even empty), naming the one to use instead."""
        for old, (new, why) in RENAMED.items():
            if old in self.environ:
                raise ImproperlyConfigured(
                    f"Environment variable {old} is {why}; the portal reads {new}: rename it, and keep {old} "
                    "out of the portal's environment."
                )

    def _raw(self, name: str) -> str | None:
        value = self.environ.get(name)
        return None if value is None else value.strip()

    @staticmethod
    def _fail(name: str, value: str, expected: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"Environment variable {name}={value!r} is invalid: expected {expected}.")

    def str(self, name: str, default: str | None = None, *, required: bool = False) -> str:
        value = self._raw(name)
        if value is None or value == "":
            if required:
                raise ImproperlyConfigured(f"Environment variable {name} is required but not set.")
            return default or ""
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise self._fail(name, value, "one of 1/0, true/false, yes/no, on/off")

    def _number(self, name: str, default, parse, kind: str, *, minimum=None, maximum=None):
        """NAME as ``parse`` reads it (``kind`` names what it must be: "a whole number"), within the
        bounds; ``default`` when unset or empty. The one reader behind ``int`` and ``float``."""
        value = self._raw(name)
        if value is None or value == "":
            return default
        try:
            number = parse(value)
        except ValueError:
            raise self._fail(name, value, kind) from None
        if not math.isfinite(number):  # float() accepts nan, inf, -infinity: no setting means those
            raise self._fail(name, value, "a finite number (not nan or inf)")
        if minimum is not None and number < minimum:
            raise self._fail(name, value, f"{kind} >= {minimum}")
        if maximum is not None and number > maximum:
            raise self._fail(name, value, f"{kind} <= {maximum}")
        return number

    def int(self, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        return self._number(name, default, int, "a whole number", minimum=minimum, maximum=maximum)

    def float(self, name: str, default: float, *, minimum: float | None = None) -> float:
        return self._number(name, default, float, "a number", minimum=minimum)

    def secret(self, name: str, default: str = "") -> str:
        """A secret from NAME, or from the file named by NAME_FILE (its content, one trailing newline
        removed: Docker/Kubernetes/systemd credentials). Both set is an error; an unreadable file too."""
        file_name = self._raw(f"{name}_FILE")
        if file_name:
            if self._raw(name):
                raise ImproperlyConfigured(f"Environment variables {name} and {name}_FILE are both set: set one.")
            try:
                with open(file_name, encoding="utf-8") as handle:
                    return handle.read().removesuffix("\n").removesuffix("\r")
            except OSError as exc:
                raise self._fail(f"{name}_FILE", file_name, f"a readable file ({exc.strerror})") from None
        value = self.environ.get(name)
        return default if value is None else value  # not stripped: a password may end in a space

    def networks(self, name: str, default: list[str]) -> list[str]:
        """A comma-separated list of IP addresses or CIDR networks, each validated."""
        import ipaddress

        entries = self.list(name, default)
        for entry in entries:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise self._fail(name, ",".join(entries), f"IP addresses or CIDR networks ({entry!r} is neither)") from None
        return entries

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self._raw(name)
        if value is None or value == "":
            return default
        if value not in choices:
            raise self._fail(name, value, "one of " + ", ".join(choices))
        return value

    def clusters(self, name: str, default):
        """GPUPORTAL_CLUSTERS (portal.slurm.clusters.parse_clusters): the clusters the portal serves;
        unset or empty: ``default`` (the one cluster of SLURM_CLUSTER, SLURM_BACKEND, SLURM_CONF, …)."""
        from portal.slurm.clusters import ClusterConfigError, parse_clusters

        value = self._raw(name)
        if value is None or value == "":
            return tuple(default)
        try:
            return parse_clusters(value)
        except ClusterConfigError as exc:
            raise self._fail(name, value, f"clusters as name=…,backend=…,conf=…,bin=…,lib=…;… or JSON: {exc}") from None

    def list(self, name: str, default: list[str]) -> list[str]:
        value = self._raw(name)
        if value is None:
            return list(default)
        return [item.strip() for item in value.split(",") if item.strip()]

    def url(self, name: str, default: str, *, schemes: tuple[str, ...]) -> str:
        value = self.str(name, default)
        parts = urlsplit(value)
        if parts.scheme not in schemes:
            raise self._fail(name, value, "a URL starting with " + " or ".join(f"{s}://" for s in schemes))
        if not parts.hostname and not parts.path:
            raise self._fail(name, value, "a URL with a host")
        return value

    def redis_url(self, name: str, default: str, *, also: tuple[str, ...] = ()) -> str:
        """A Redis URL (portal.redis_client.parse_redis_url): ``redis://``/``rediss://`` for one server,
        or the ``sentinel://host:port[/db]`` URLs of a master's Sentinels joined by ``;`` (they follow a
        failover; the master's name is REDIS_SENTINEL_MASTER). ``also``: other schemes accepted as they
        are (the broker's ``memory://`` for tests)."""
        from portal.redis_client import parse_redis_url

        value = self.str(name, default)
        if urlsplit(value).scheme in also:
            return value
        try:
            parse_redis_url(value)
        except ValueError as exc:
            raise self._fail(name, value, str(exc)) from None
        return value

    def database(self, name: str, default: str) -> dict:
        """DATABASE_URL → a Django DATABASES entry: postgres://user:pass@host:port/name. PostgreSQL only:
        the portal's locking (team row locks, advisory locks, select_for_update) needs it, so any other
        engine (SQLite included) stops start-up here instead of failing under concurrent requests.

        Several hosts (a primary and its standbys, in any order) as libpq's multi-host URL:
        postgres://user:pass@h1:5432,h2:5432/name?target_session_attrs=read-write&connect_timeout=3.
        HOST becomes "h1,h2" and PORT "5432,5432" (a host without a port gets 5432): Django's PostgreSQL
        backend hands HOST, PORT and every OPTIONS entry (the query string) to psycopg.connect as they
        are, and libpq/psycopg try the hosts in turn, keeping the first that takes writes
        (target_session_attrs=read-write), each for at most connect_timeout seconds. CONN_HEALTH_CHECKS
        makes a request that finds its persistent connection dead (the primary failed over) open a new
        one, to whichever host is the primary now; a query in flight when the primary dies fails."""
        value = self.str(name, default)
        scheme = urlsplit(value).scheme
        if scheme not in ("postgres", "postgresql"):
            raise self._fail(
                name,
                value,
                "a PostgreSQL URL such as postgres://gpuportal@127.0.0.1:5432/gpuportal (what scripts/services up "
                f"prints); {scheme or 'this'} is not supported: the portal's locking (team row locks, advisory "
                "locks, select_for_update) needs PostgreSQL",
            )
        parts = urlsplit(value)
        db_name = unquote(parts.path.lstrip("/"))
        if not db_name:
            raise self._fail(name, value, "a database name in the path, e.g. postgres://user@host:5432/gpuportal")
        userinfo, _, hostlist = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        hosts, ports = [], []
        for entry in hostlist.split(",") if hostlist else []:  # none: libpq's default (the local socket)
            host, port = _host_port(entry.strip())
            if not host:
                raise self._fail(name, value, "a host for every entry of host:port,host:port (one is empty)")
            if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
                raise self._fail(name, value, f"a numeric port (1-65535) after each host, not {port!r}")
            hosts.append(host)
            ports.append(port)
        if len(hosts) <= 1:
            port_setting = (ports or [None])[0] or ""
        else:  # libpq: one port per host (or none at all)
            port_setting = ",".join(port or "5432" for port in ports) if any(ports) else ""
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if "connect_timeout" in options and not options["connect_timeout"].isdigit():
            raise self._fail(name, value, "connect_timeout as whole seconds (e.g. connect_timeout=3)")
        # No JIT compilation: the portal's queries are short, and PostgreSQL's cost estimate can start
        # JIT on one that is not (the budget hold under a submission's team lock spent 404 of 643 ms
        # compiling, bench/results.md). ?options=… in DATABASE_URL replaces this.
        options.setdefault("options", "-c jit=off")
        # A database host cut off (no RST, packets dropped) fails a query after 10 s without an
        # acknowledgement (TCP_USER_TIMEOUT), and an idle connection is probed after 30 s (3 probes
        # 10 s apart), instead of waiting for the kernel's retransmissions (~15 min) while a request, the
        # gunicorn worker and CONN_HEALTH_CHECKS' probe hang. libpq's parameters: TCP only; the URL's win.
        for key, default_value in TCP_DEFAULTS.items():
            options.setdefault(key, default_value)
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": db_name,
            "USER": unquote(user),
            "PASSWORD": unquote(password),
            "HOST": ",".join(hosts),
            "PORT": port_setting,
            "OPTIONS": options,
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }


# libpq's TCP parameters every DATABASE_URL gets unless it sets them (Env.database says why)
TCP_DEFAULTS = {"tcp_user_timeout": "10000", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}


def _host_port(entry: str) -> tuple[str, str | None]:
    """"host", "host:port", "[v6]" or "[v6]:port" → (host, port or None)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    host, colon, port = entry.partition(":")
    return unquote(host), port if colon else None
