"""The hot path's reuse: one Redis client per pool (portal/cache.py) and one serializer per thread
(portal/serializer_cache.py), with the answers of the things they replace."""

from __future__ import annotations

import threading

import pytest
from django.core.cache import cache
from rest_framework import serializers

from portal.serializer_cache import represented, thread_serializer, validated


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


class Body(serializers.Serializer):
    gpus = serializers.IntegerField(min_value=1)
    name = serializers.CharField(required=False, default="x")


def test_a_reused_serializer_validates_and_refuses_as_a_new_one_does():
    assert validated(Body, {"gpus": "2"}) == {"gpus": 2, "name": "x"}
    fresh = Body(data={"gpus": 0})
    assert not fresh.is_valid()
    with pytest.raises(serializers.ValidationError) as info:
        validated(Body, {"gpus": 0})
    assert info.value.detail == fresh.errors
    assert validated(Body, {"gpus": 3, "name": "y"}) == {"gpus": 3, "name": "y"}  # nothing left from before
    assert represented(Body, {"gpus": 4, "name": "z"}) == Body({"gpus": 4, "name": "z"}).data


def test_each_thread_has_its_own_serializer():
    mine = thread_serializer(Body)
    other = []
    t = threading.Thread(target=lambda: other.append(thread_serializer(Body)))
    t.start()
    t.join()
    assert thread_serializer(Body) is mine and other[0] is not mine
