"""The cache backend: Django's Redis cache with one client object per connection pool.

Django's ``RedisCacheClient.get_client`` builds a new ``redis.Redis`` for every cache operation, and
building one copies redis-py's table of ~80 response callbacks: about 0.13 ms of Python per call,
and a single-job POST makes about ten cache calls (token, snapshot versions, throttle, …). A
``redis.Redis`` is safe to share between threads (each command takes its own connection from the
pool), so one per pool is kept. Behaviour is otherwise Django's own (same options, pools, serializer)."""

from __future__ import annotations

import threading

from django.core.cache.backends.redis import RedisCache, RedisCacheClient


class _SharedClients(RedisCacheClient):
    def __init__(self, servers, **options):
        super().__init__(servers, **options)
        self._clients: dict[int, object] = {}
        self._clients_lock = threading.Lock()

    def get_client(self, key=None, *, write=False):
        index = self._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            with self._clients_lock:
                client = self._clients.get(index)
                if client is None:
                    client = self._clients[index] = self._client(connection_pool=self._get_connection_pool(write))
        return client


class PortalRedisCache(RedisCache):
    """``django.core.cache.backends.redis.RedisCache`` with one ``redis.Redis`` per pool."""

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _SharedClients
