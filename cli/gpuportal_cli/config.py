"""Where the CLI keeps the portal's URL and the user's token: ``$XDG_CONFIG_HOME/gpuportal/config.json``
(default ``~/.config/gpuportal/config.json``), written with mode 0600 in a 0700 directory.
``GPUPORTAL_URL`` and ``GPUPORTAL_TOKEN`` override the file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Config:
    url: str
    token: str


def config_path(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpuportal" / "config.json"


def load(environ: dict[str, str] | None = None) -> Config:
    """The stored config overlaid with the environment; missing values are empty strings."""
    environ = os.environ if environ is None else environ
    stored: dict = {}
    path = config_path(environ)
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    url = environ.get("GPUPORTAL_URL") or stored.get("url", "")
    token = environ.get("GPUPORTAL_TOKEN") or stored.get("token", "")
    return Config(url=normalise_url(url) if url else "", token=token)


def save(config: Config, environ: dict[str, str] | None = None) -> Path:
    """Write the config atomically; the file is created 0600 and never exists with wider permissions."""
    path = config_path(environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have narrowed it; never widen beyond 0600
        with os.fdopen(fd, "w") as handle:
            json.dump({"url": config.url, "token": config.token}, handle, indent=2)
            handle.write("\n")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url and "://" not in url:
        url = "https://" + url
    for suffix in ("/api/v1", "/api"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


class ConfigError(Exception):
    pass
