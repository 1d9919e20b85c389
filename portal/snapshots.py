"""Read-mostly rows kept in each process and re-read once per change, not once per request.

The submit path reads the cluster inventory (partitions, nodes, policy) and the rate book on every
request; they change a few times a day (``cluster_sync``, ``rate_create``). ``snapshot(name, load)``
keeps ``load()``'s value in this process under a version stored in the cache (Redis): one cache
GET per call instead of the queries, and ``load()`` again when the version moved or the copy is older
than ``SNAPSHOT_MAX_AGE_SECONDS`` (a bound, should an invalidation be lost: Redis down at commit).

The one writer of each kind of row calls ``snapshot_changed(name)`` in its transaction: it moves the
version at once and again after commit, so every process re-reads at its next call (a reader that
re-read between the two moves, before the commit, re-reads again after it). A value must be treated
as read-only: it is shared by the threads of the process. When the cache does not answer, ``load()``
runs every time (the database stays the truth). ``SNAPSHOT_MAX_AGE_SECONDS=0`` turns the copies off.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

logger = logging.getLogger(__name__)

# The snapshots there are, and who moves their version:
INVENTORY = "inventory"  # PartitionInfo, NodeInfo, ClusterPolicyInfo — portal.services.cluster_sync
RATES = "rates"  # accounting.Rate — accounting.services.rates.rate_create

_held: dict[str, tuple[str, float, Any]] = {}  # name -> (version, loaded at (monotonic), value)


def _key(name: str) -> str:
    return f"snapshot:{name}:version"


def _version(name: str) -> str:
    version = cache.get(_key(name))
    if version is None:  # first use, or the cache lost it: a new version (every process re-reads)
        cache.add(_key(name), uuid.uuid4().hex, timeout=None)
        version = cache.get(_key(name))
    return version


def snapshot(name: str, load: Callable[[], Any]) -> Any:
    """``load()``'s value as of the last change of ``name``: this process's copy when its version is
    current and it is younger than SNAPSHOT_MAX_AGE_SECONDS, else ``load()`` (kept for the next call)."""
    max_age = settings.SNAPSHOT_MAX_AGE_SECONDS
    if max_age <= 0:
        return load()
    try:
        version = _version(name)
    except Exception:  # noqa: BLE001 — the cache is an optimisation: without it, read the rows
        logger.warning("snapshot %s: the cache does not answer; reading the rows", name, exc_info=True)
        return load()
    held = _held.get(name)
    now = time.monotonic()
    if held is not None and held[0] == version and now - held[1] < max_age:
        return held[2]
    value = load()
    _held[name] = (version, now, value)
    return value


def _move(name: str) -> None:
    try:
        cache.set(_key(name), uuid.uuid4().hex, timeout=None)
    except Exception:  # noqa: BLE001 — copies expire within SNAPSHOT_MAX_AGE_SECONDS anyway
        logger.warning("snapshot %s: the cache does not answer; copies expire within %s s", name,
                       settings.SNAPSHOT_MAX_AGE_SECONDS, exc_info=True)  # fmt: skip
    _held.pop(name, None)


def snapshot_changed(name: str) -> None:
    """The rows behind ``name`` change in the current transaction: every process re-reads them at its
    next ``snapshot(name, …)`` (the version moves now and after commit)."""
    _move(name)
    transaction.on_commit(lambda: _move(name))


def snapshots_forget() -> None:
    """Drop this process's copies (tests: each test's rows are its own)."""
    _held.clear()
