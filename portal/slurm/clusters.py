"""The clusters one portal serves (settings.GPUPORTAL_CLUSTERS): each a name (slurmdbd's), a backend and
where its Slurm is (SLURM_CONF, optional bin and lib directories) — or, of kind ``kubernetes`` (issue 41),
a Kubernetes GPU cluster and the kubeconfig the portal reaches it with.

``GPUPORTAL_CLUSTERS`` is either ``;``-separated clusters of ``,``-separated ``key=value`` pairs::

    name=gpuportal,backend=cli,conf=/etc/slurm/slurm.conf;name=gpuportal25,backend=pyslurm,conf=/x/slurm.conf,bin=/x/bin,lib=/x/lib

or the same as a JSON list of objects (``[{"name": "gpuportal", "conf": "..."}, ...]``). Keys:
``name`` (required), ``backend`` (``auto``, ``cli``, ``pyslurm``; default ``auto``), ``conf``,
``bin``, ``lib``; ``kind`` (``slurm``, the default, or ``kubernetes``) and, for a Kubernetes cluster,
``kubeconfig`` (empty: settings.GPUPORTAL_K8S_KUBECONFIG)::

    name=gpuportal;name=gpuportal-k8s,kind=kubernetes,kubeconfig=/etc/gpuportal/k8s.kubeconfig

The first cluster is the default one: where a partition name alone does not decide, and where every
row recorded before several clusters existed belongs; it is a Slurm cluster (the teams' accounts,
bookings and usage of a one-cluster portal live there)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

BACKENDS = ("auto", "cli", "pyslurm")
KINDS = ("slurm", "kubernetes")
KUBERNETES = "kubernetes"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_KEYS = {"name": "name", "backend": "backend", "conf": "slurm_conf", "bin": "bin_dir", "lib": "lib_dir", "kind": "kind",
         "kubeconfig": "kubeconfig"}  # fmt: skip


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    backend: str = "auto"
    slurm_conf: str = ""
    bin_dir: str = ""
    lib_dir: str = ""
    kind: str = "slurm"  # KINDS: which scheduler runs the cluster's jobs
    kubeconfig: str = ""  # a Kubernetes cluster's (empty: settings.GPUPORTAL_K8S_KUBECONFIG)

    @property
    def is_kubernetes(self) -> bool:
        return self.kind == KUBERNETES


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
        kind = str(item.get("kind") or "slurm")
        if kind not in KINDS:
            raise ClusterConfigError(f"cluster {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if kind == KUBERNETES and not clusters:
            raise ClusterConfigError(f"cluster {name!r}: the first (default) cluster is a Slurm cluster; name it first")
        if kind == KUBERNETES and backend != "auto":
            raise ClusterConfigError(f"cluster {name!r}: a Kubernetes cluster has no Slurm backend ({backend!r})")
        if kind != KUBERNETES and item.get("kubeconfig"):
            raise ClusterConfigError(f"cluster {name!r}: kubeconfig is for a cluster of kind kubernetes")
        values = {_KEYS[k]: str(v) for k, v in item.items() if k not in ("backend", "kind")}
        clusters.append(ClusterConfig(**values, backend="kubernetes" if kind == KUBERNETES else backend, kind=kind))
    return tuple(clusters)
