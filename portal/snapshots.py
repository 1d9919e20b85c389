"""Read-mostly rows kept in each process and re-read once per change, not once per request.

The submit path reads the cluster inventory (partitions, nodes, policy), the rate book, the bookings
that hold capacity and the submitter's team and role on every request; they change a few times a
day. (The quotas in force are kept too, for pages, alerts and Slurm's limits; the budget check reads
them from the database under the team's row lock, accounting.selectors.quotas_effective(fresh=True),
since a copy's version moves only after the change's commit.) ``snapshot(name, load)`` keeps ``load()``'s value in this process under a
version stored in the cache (Redis), and ``load()`` again when the version moved or the copy is older
than ``SNAPSHOT_MAX_AGE_SECONDS`` (a bound, should an invalidation be lost: Redis down at commit).
In a request (``snapshot_scope``, portal.middleware.SnapshotScopeMiddleware) every version is read
with ONE cache MGET, the first time one is needed; elsewhere one GET per call.

Whoever writes such rows moves the version with ``snapshot_changed(name)`` in its transaction: at
once and again after commit, so every process re-reads at its next call (a reader that re-read
between the two moves, before the commit, re-reads again after it). Saves and deletes of the models
behind a snapshot do it by themselves, and so do their querysets' ``update()``, ``bulk_create()``,
``bulk_update()`` and ``delete()`` (``SnapshotManager``, the models' one declaration: factories and
the admin count too). A transaction that changed a snapshot's rows
reads them from the database, never from (or into) the copy: what it sees is not committed and may
roll back. A value must be treated as read-only: it is shared by the threads of the process. When
the cache does not answer, ``load()`` runs every time (the database stays the truth).
``SNAPSHOT_MAX_AGE_SECONDS=0`` turns the copies off.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, models, transaction

from portal.redis_client import cache_redis

logger = logging.getLogger(__name__)

# The snapshots there are, and what moves their version (the models' SnapshotManager: every write):
INVENTORY = "inventory"  # portal.Cluster, PartitionInfo, NodeInfo, ClusterPolicyInfo
RATES = "rates"  # accounting.Rate
QUOTAS = "quotas"  # accounting.Quota
BOOKINGS = "bookings"  # accounting.Booking
ROLES = "roles"  # portal.Team, portal.Membership
APITOKENS = "apitokens"  # portal.ApiToken lookups — portal.authentication.api_token_forget
USAGE_MONTHS = "usage_months"  # accounting.UsageMonth (which closed months the reports read from their totals)
NAMES = (INVENTORY, RATES, QUOTAS, BOOKINGS, ROLES, APITOKENS, USAGE_MONTHS)

_held: dict[str, tuple[str, float, Any]] = {}  # name -> (version, loaded at (monotonic), value)
_local = threading.local()  # .scope: {name: version} of the current request; .dirty: names changed in its transaction


def _key(name: str) -> str:
    return f"snapshot:{name}:v"


# The versions live in the default cache's Redis as plain strings under the cache's own key names
# (cache.make_key), read and written through one redis-py client per process
# (portal.redis_client.cache_redis): a request's MGET without Django's new client per operation.
# Another cache backend (tests' local memory): through Django's cache API.


def _versions_get(names: list[str]) -> dict[str, str]:
    client = cache_redis()
    if client is None:
        found = cache.get_many([_key(n) for n in names])
        return {n: found[_key(n)] for n in names if _key(n) in found}
    values = client.mget([cache.make_key(_key(n)) for n in names])
    return {n: value.decode() for n, value in zip(names, values, strict=True) if value is not None}


def _versions_set(name: str, value: str, *, only_new: bool = False) -> None:
    client = cache_redis()
    if client is None:
        (cache.add if only_new else cache.set)(_key(name), value, timeout=None)
    else:
        client.set(cache.make_key(_key(name)), value, nx=only_new)


def snapshot_version(name: str) -> str | None:
    """The version of ``name`` in the cache now (None: none yet), as every process reads it."""
    return _versions_get([name]).get(name)


def _version(name: str) -> str:
    scope = getattr(_local, "scope", None)
    if scope is not None:
        if not scope:  # the request's first snapshot: every version in one round trip
            scope.update(_versions_get(list(NAMES)))
            scope.setdefault("", "")  # read once, even if nothing was found
        if name in scope:
            return scope[name]
    version = _versions_get([name]).get(name)
    if version is None:  # first use, or the cache lost it: a new version (every process re-reads)
        _versions_set(name, uuid.uuid4().hex, only_new=True)
        version = _versions_get([name])[name]
    if scope is not None:
        scope[name] = version
    return version


@contextlib.contextmanager
def snapshot_scope() -> Iterator[None]:
    """One request: the snapshots' versions are read once (one MGET) for all of it."""
    _local.scope = {}
    try:
        yield
    finally:
        _local.scope = None


def snapshot(name: str, load: Callable[[], Any]) -> Any:
    """``load()``'s value as of the last change of ``name``: this process's copy when its version is
    current and it is younger than SNAPSHOT_MAX_AGE_SECONDS, else ``load()`` (kept for the next call)."""
    max_age = settings.SNAPSHOT_MAX_AGE_SECONDS
    if max_age <= 0:
        return load()
    dirty = getattr(_local, "dirty", None)
    if dirty and name in dirty:
        if connection.in_atomic_block:  # this transaction changed the rows: not committed yet
            return load()
        dirty.discard(name)  # its transaction ended (a rollback leaves the name here)
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


def snapshot_changed_here(name: str) -> bool:
    """Whether the current transaction changed the rows behind ``name`` (then ``snapshot`` reads them
    again at every call, and a caller that can read them itself should)."""
    dirty = getattr(_local, "dirty", None)
    return bool(dirty) and name in dirty and connection.in_atomic_block


def snapshot_memo(name: str) -> dict:
    """A dict of answers kept in this process under ``name``'s version: emptied whenever it moves (a
    transaction that changed the rows gets a fresh one it keeps to itself). Fill it with memo_put."""
    return snapshot(name, dict)


def memo_put(memo: dict, key, value, *, max_entries: int) -> None:
    """``memo[key] = value``, emptying the memo first when it holds ``max_entries`` (a bound on a
    process's memory, not a cache policy: it fills again from the next requests)."""
    if len(memo) >= max_entries:
        memo.clear()
    memo[key] = value


def _move(name: str) -> None:
    scope = getattr(_local, "scope", None)
    if scope:
        scope.pop(name, None)  # this request re-reads it too
    try:
        _versions_set(name, uuid.uuid4().hex)
    except Exception:  # noqa: BLE001 — copies expire within SNAPSHOT_MAX_AGE_SECONDS anyway
        logger.warning("snapshot %s: the cache does not answer; copies expire within %s s", name,
                       settings.SNAPSHOT_MAX_AGE_SECONDS, exc_info=True)  # fmt: skip
    _held.pop(name, None)


def snapshot_changed(name: str) -> None:
    """The rows behind ``name`` change in the current transaction: every process re-reads them at its
    next ``snapshot(name, …)`` (the version moves now and after commit)."""
    _move(name)
    if connection.in_atomic_block:
        dirty = getattr(_local, "dirty", None)
        if dirty is None:
            dirty = _local.dirty = set()
        dirty.add(name)

        def committed() -> None:
            dirty.discard(name)
            _move(name)

        transaction.on_commit(committed)


def changed_on_save(model, name: str) -> None:
    """Every save and delete of ``model`` moves snapshot ``name`` (model signals; a queryset
    ``update()`` or ``bulk_create`` does not send them and must call snapshot_changed itself)."""
    from django.db.models.signals import post_delete, post_save

    def moved(sender, **kwargs) -> None:
        snapshot_changed(name)

    post_save.connect(moved, sender=model, weak=False, dispatch_uid=f"snapshot-{name}-{model._meta.label}-save")
    post_delete.connect(moved, sender=model, weak=False, dispatch_uid=f"snapshot-{name}-{model._meta.label}-delete")


# ---------------------------------------------------------------- the models behind the snapshots

_CACHED_MODELS: dict[type, str] = {}  # model -> the snapshot that keeps its rows (SnapshotManager)


class SnapshotQuerySet(models.QuerySet):
    """A queryset whose bulk writes move its model's snapshot: update(), bulk_create() and
    bulk_update() send no signals, and delete() moves it once more after its per-row signals."""

    def _moved(self, result):
        snapshot_changed(_CACHED_MODELS[self.model])
        return result

    def update(self, **kwargs):
        return self._moved(super().update(**kwargs))

    def bulk_create(self, objs, *args, **kwargs):
        return self._moved(super().bulk_create(objs, *args, **kwargs))

    def bulk_update(self, objs, fields, *args, **kwargs):
        return self._moved(super().bulk_update(objs, fields, *args, **kwargs))

    def delete(self):
        return self._moved(super().delete())


class SnapshotManager(models.Manager.from_queryset(SnapshotQuerySet)):
    """The manager of a model whose rows a snapshot keeps, and the one declaration of it
    (``objects = SnapshotManager(INVENTORY)``): every write moves the snapshot, a save() or delete()
    of an instance (signals: services, the admin, factories) as an update() or bulk_* of a queryset.
    Raw SQL and portal.db.bulk_update (django-pgbulk) bypass the manager: they must call snapshot_changed."""

    def __init__(self, snapshot: str = ""):  # "": a related manager Django derives from this one
        super().__init__()
        self.snapshot = snapshot

    def contribute_to_class(self, cls, name):
        super().contribute_to_class(cls, name)
        if self.snapshot and not cls._meta.abstract:
            _CACHED_MODELS[cls] = self.snapshot
            changed_on_save(cls, self.snapshot)


def snapshots_forget() -> None:
    """Drop this process's copies (tests: each test's rows are its own)."""
    _held.clear()
    _local.dirty = set()
