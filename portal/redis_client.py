"""The one way the portal's own code reaches Redis: a ``redis://``/``rediss://`` URL (one server) or a
``sentinel://`` URL (the Sentinels of one master, which follow a failover) turned into a redis-py
client or connection pool. The throttle's script (portal/throttles.py), the outbox's coalescing flags
(portal/outbox.py) and Django's cache (``OPTIONS["pool_class"]``, portal/project/settings.py) all come
here; Celery's broker reads the same URL itself (kombu's ``sentinel://`` transport, with the same
``master_name``).

A Sentinel URL is Celery's/kombu's form (their documentation, "Using Redis Sentinel"): the Sentinels
joined by ``;``, each ``sentinel://[[user]:password@]host[:port][/db]``. The first one's password
and database are the master's (kombu reads them from the first); a later one may repeat them or
leave them out, never give others. The master's name is REDIS_SENTINEL_MASTER (settings), the
transport option ``master_name`` Celery is given; the Sentinels' own password, when they have one,
REDIS_SENTINEL_PASSWORD (``sentinel_kwargs``, given to Celery too). redis-py's documented ``redis.sentinel.Sentinel``
and ``SentinelConnectionPool`` do the rest: each new connection asks the Sentinels where the master
is now, and a connection to a master that died (or was demoted: READONLY) is dropped, so the next
command after a failover goes to the promoted replica without restarting the process. Nothing here
knows how many Sentinels there are."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

SENTINEL_DEFAULT_PORT = 26379
# A Redis that does not answer (a cut link, a frozen host) fails a command after this long instead of
# holding the request, and the gunicorn worker with it, until the kernel gives up on the connection
# (minutes); the portal's commands take well under a millisecond. A caller's own values win.
REDIS_SOCKET_TIMEOUT = 5.0
REDIS_CONNECT_TIMEOUT = 2.0
# A Sentinel answers "where is the master" at once; one that does not within this is skipped (a
# host that is down or cut off must not hold a request for the kernel's TCP timeout).
SENTINEL_SOCKET_TIMEOUT = 1.0


@dataclass(frozen=True)
class RedisLocation:
    """A parsed Redis URL: ``sentinels`` empty for a plain server (then ``url`` is redis-py's own)."""

    url: str
    sentinels: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)


def is_sentinel_url(url: str) -> bool:
    return url.strip().startswith("sentinel://")


def parse_redis_url(url: str) -> RedisLocation:
    """``url`` checked and parsed; ValueError saying what is wrong (portal.env names the variable)."""
    url = url.strip()
    if not is_sentinel_url(url):
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError("a URL starting with redis://, rediss:// or sentinel://")
        if ";" in url:
            raise ValueError("one redis:// server (several hosts: the sentinel:// URLs of their Sentinels, joined by ;)")
        if not parts.hostname:
            raise ValueError("a URL with a host")
        try:
            _ = parts.port  # urlsplit checks it when asked
        except ValueError:
            raise ValueError("a numeric port") from None
        return RedisLocation(url, (), _db(parts.path), parts.username, parts.password)
    sentinels = []
    db = username = password = None
    for index, piece in enumerate(url.split(";")):
        parts = urlsplit(piece.strip())
        if parts.scheme != "sentinel":
            raise ValueError(f"sentinel://host:port URLs joined by ; (part {index + 1}, {piece!r}, is not one)")
        if not parts.hostname:
            raise ValueError(f"a host in every sentinel:// part (part {index + 1} has none)")
        try:
            port = parts.port or SENTINEL_DEFAULT_PORT
        except ValueError:
            raise ValueError(f"a numeric port in every sentinel:// part (part {index + 1})") from None
        if parts.query or parts.fragment:
            raise ValueError("sentinel:// parts without ?options (the transport's options come from settings)")
        sentinels.append((parts.hostname, port))
        piece_db = _db(parts.path) if parts.path.strip("/") else None
        piece_user = unquote(parts.username) if parts.username else None
        piece_password = unquote(parts.password) if parts.password is not None else None
        if index == 0:
            db, username, password = piece_db or 0, piece_user, piece_password
            continue
        if piece_db is not None and piece_db != db:
            raise ValueError(f"one database for the master (part {index + 1} names /{piece_db}, the first /{db})")
        if (piece_user, piece_password) != (None, None) and (piece_user, piece_password) != (username, password):
            raise ValueError(f"the master's user and password on the first part only, or the same on each "
                             f"(part {index + 1} differs)")  # fmt: skip
    return RedisLocation(url, tuple(sentinels), db, username, password)


def _db(path: str) -> int:
    text = path.strip("/") or "0"
    if not text.isdigit():
        raise ValueError(f"a database number as the path (/0, /1, …), not /{text}")
    return int(text)


def sentinel_kwargs(password: str = "") -> dict:
    """How each Sentinel is reached (redis-py's and kombu's ``sentinel_kwargs``): at most
    SENTINEL_SOCKET_TIMEOUT each, with ``password`` when the Sentinels have one (their ``requirepass``:
    REDIS_SENTINEL_PASSWORD; the master's own password is the URL's)."""
    kwargs: dict = {"socket_timeout": SENTINEL_SOCKET_TIMEOUT, "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT}
    if password:
        kwargs["password"] = password
    return kwargs


def redis_pool(url: str, *, master_name: str | None = None, sentinel_options: dict | None = None,
               **options) -> redis.ConnectionPool:  # fmt: skip
    """A connection pool for ``url``: redis-py's ``ConnectionPool.from_url`` for one server, a
    ``SentinelConnectionPool`` of ``master_name`` for a Sentinel URL, asking its Sentinels with
    ``sentinel_options`` (defaults: settings.REDIS_SENTINEL_MASTER, ``sentinel_kwargs`` with
    settings.REDIS_SENTINEL_PASSWORD). ``options`` are redis-py's connection options (socket_timeout, …;
    unset: REDIS_SOCKET_TIMEOUT and REDIS_CONNECT_TIMEOUT)."""
    location = parse_redis_url(url)
    options = {"socket_timeout": REDIS_SOCKET_TIMEOUT, "socket_connect_timeout": REDIS_CONNECT_TIMEOUT, **options}
    if not location.is_sentinel:
        return redis.ConnectionPool.from_url(location.url, **options)
    if master_name is None or sentinel_options is None:
        from django.conf import settings

        master_name = master_name or settings.REDIS_SENTINEL_MASTER
        sentinel_options = sentinel_options or sentinel_kwargs(settings.REDIS_SENTINEL_PASSWORD)
    sentinel = Sentinel(list(location.sentinels), sentinel_kwargs=sentinel_options)
    credentials = {"username": location.username, "password": location.password}
    return SentinelConnectionPool(
        master_name,
        sentinel,
        db=location.db,
        **{k: v for k, v in credentials.items() if v is not None},
        **options,
    )


def redis_client(url: str, *, master_name: str | None = None, sentinel_options: dict | None = None,
                 **options) -> redis.Redis:  # fmt: skip
    """A redis-py client of ``url`` (see ``redis_pool``): the master, wherever it is now."""
    return redis.Redis(connection_pool=redis_pool(url, master_name=master_name, sentinel_options=sentinel_options,
                                                  **options))  # fmt: skip


class UrlConnectionPool:
    """Django's RedisCache ``OPTIONS["pool_class"]`` (Django's documented hook: it calls
    ``pool_class.from_url(LOCATION's server, **OPTIONS)``): the pool ``redis_pool`` makes, so the
    cache follows a Sentinel failover as the throttle and the outbox do. LOCATION is a list of one
    URL: Django splits a string at ``;`` and ``,`` into servers it would read from at random."""

    @classmethod
    def from_url(cls, url: str, **options) -> redis.ConnectionPool:
        return redis_pool(url, **options)


def cache_write_server() -> str:
    """The first server of the default cache's LOCATION (a URL, a comma-separated list, or a list):
    the one Django's Redis cache writes to (settings: a list of one URL, which may be a Sentinel URL)."""
    from django.conf import settings

    location = settings.CACHES["default"]["LOCATION"]
    servers = location.split(",") if isinstance(location, str) else list(location)
    return servers[0].strip()


def cache_redis() -> redis.Redis | None:
    """One redis-py client per process of the default cache's server (``cache_write_server``; a
    Sentinel URL's client follows a failover), or None when the default cache is not Django's Redis
    cache. For the hot path's own keys (portal.throttles, portal.snapshots): Django's RedisCache
    makes a new redis-py client for every operation (~0.1 ms of CPU each)."""
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    if not isinstance(caches["default"], RedisCache):
        return None
    return _cache_client(cache_write_server())


@functools.cache
def _cache_client(server: str) -> redis.Redis:
    return redis_client(server)
