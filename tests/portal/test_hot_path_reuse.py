"""The hot path's reuse: one Redis client per pool (portal/cache.py), with the answers of the
things it replaces."""

from __future__ import annotations

import threading

from django.core.cache import cache


def test_the_cache_keeps_one_client_per_pool_and_works_from_threads():
    backend = cache._cache
    assert backend.get_client(write=True) is backend.get_client(write=True)
    results = {}

    def worker(i):
        cache.set(f"hot-path-{i}", i, 30)
        results[i] = cache.get(f"hot-path-{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: i for i in range(8)}
