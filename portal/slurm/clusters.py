"""The clusters one portal serves (settings.GPUPORTAL_CLUSTERS): each a name (slurmdbd's), a backend and
where its Slurm is (SLURM_CONF, optional bin and lib directories).

``GPUPORTAL_CLUSTERS`` is either ``;``-separated clusters of ``,``-separated ``key=value`` pairs::

    name=gpuportal,backend=cli,conf=/etc/slurm/slurm.conf;name=gpuportal25,backend=pyslurm,conf=/x/slurm.conf,bin=/x/bin,lib=/x/lib

or the same as a JSON list of objects (``[{"name": "gpuportal", "conf": "..."}, ...]``). Keys:
``name`` (required), ``backend`` (``auto``, ``cli``, ``pyslurm``; default ``auto``), ``conf``,
``bin``, ``lib``. The first cluster is the default one: where a partition name alone does not
decide, and where every row recorded before several clusters existed belongs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

BACKENDS = ("auto", "cli", "pyslurm")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_KEYS = {"name": "name", "backend": "backend", "conf": "slurm_conf", "bin": "bin_dir", "lib": "lib_dir"}


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    backend: str = "auto"
    slurm_conf: str = ""
    bin_dir: str = ""
    lib_dir: str = ""


class ClusterConfigError(ValueError):
    """GPUPORTAL_CLUSTERS cannot be read; the message says what is wrong."""


def parse_clusters(text: str) -> tuple[ClusterConfig, ...]:
    """GPUPORTAL_CLUSTERS → its clusters, in order (the first is the default). Raises ClusterConfigError."""
    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ClusterConfigError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise ClusterConfigError("a JSON list of objects")
        raw = [{str(k): v for k, v in item.items()} for item in items]
    else:
        raw = []
        for number, chunk in enumerate((c for c in text.split(";") if c.strip()), start=1):
            item: dict[str, object] = {}
            for pair in (p for p in chunk.split(",") if p.strip()):
                key, equals, value = pair.partition("=")
                if not equals:
                    raise ClusterConfigError(f"cluster {number}: {pair.strip()!r} is not key=value")
                if key.strip() in item:
                    raise ClusterConfigError(f"cluster {number}: {key.strip()!r} given twice")
                item[key.strip()] = value.strip()
            raw.append(item)
    if not raw:
        raise ClusterConfigError("at least one cluster")
    clusters: list[ClusterConfig] = []
    for number, item in enumerate(raw, start=1):
        unknown = sorted(set(item) - set(_KEYS))
        if unknown:
            raise ClusterConfigError(f"cluster {number}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
        if not all(isinstance(value, str) for value in item.values()):
            raise ClusterConfigError(f"cluster {number}: every value is a string")
        name = str(item.get("name", ""))
        if not _NAME_RE.match(name):
            raise ClusterConfigError(f"cluster {number}: name {name!r} is not a Slurm cluster name (a-z, 0-9, '-', '_')")
        if any(c.name == name for c in clusters):
            raise ClusterConfigError(f"cluster {name!r} is named twice")
        backend = str(item.get("backend") or "auto")
        if backend not in BACKENDS:
            raise ClusterConfigError(f"cluster {name!r}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
        clusters.append(ClusterConfig(**{_KEYS[k]: str(v) for k, v in item.items() if k != "backend"}, backend=backend))
    return tuple(clusters)
