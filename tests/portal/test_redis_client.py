"""portal.redis_client: the one way from a redis:// or sentinel:// URL to a redis-py pool (the cache's
pool_class, the throttle, the outbox flags). The failover itself: tests/faults/test_failover_redis.py."""

from __future__ import annotations

import redis
from redis.sentinel import SentinelConnectionPool

from portal.redis_client import UrlConnectionPool, redis_client, redis_pool


def test_a_redis_url_gives_redis_pys_own_pool():
    pool = redis_pool("redis://:pw@cache.example:6380/3", socket_timeout=2)
    assert type(pool) is redis.ConnectionPool
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (
        "cache.example", 6380, 3, "pw", 2,
    )  # fmt: skip
    defaults = redis_pool("redis://cache.example:6380/3").connection_kwargs  # a host that stops answering fails a call
    assert (defaults["socket_timeout"], defaults["socket_connect_timeout"]) == (5.0, 2.0)


def test_a_sentinel_url_gives_a_pool_of_the_named_master_on_every_sentinel(settings):
    settings.REDIS_SENTINEL_MASTER = "site-a"
    pool = redis_pool("sentinel://:pw@s1:26379/1;sentinel://s2:26380/1;sentinel://s3/1")
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "site-a"  # REDIS_SENTINEL_MASTER unless the caller names one
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (1, "pw")
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"]) for s in sentinels] == [("s1", 26379), ("s2", 26380), ("s3", 26379)]
    assert all(s["socket_timeout"] == 1.0 for s in sentinels)  # a dead Sentinel host is skipped quickly
    assert all(s.get("password") is None for s in sentinels)  # the URL's password is the master's
    settings.REDIS_SENTINEL_PASSWORD = "s-pw"  # the Sentinels' own (their requirepass)
    guarded = redis_pool("sentinel://:pw@s1:26379/1")
    assert [s.connection_pool.connection_kwargs["password"] for s in guarded.sentinel_manager.sentinels] == ["s-pw"]
    assert guarded.connection_kwargs["password"] == "pw"
    assert redis_pool("sentinel://s1/0", master_name="broker-master").service_name == "broker-master"
    assert isinstance(redis_client("sentinel://s1/0").connection_pool, SentinelConnectionPool)


def test_djangos_cache_gets_the_same_pool_through_pool_class(settings):
    settings.REDIS_SENTINEL_MASTER = "site-a"
    pool = UrlConnectionPool.from_url("sentinel://s1:26379/1;sentinel://s2:26379/1", parser_class=redis.connection.DefaultParser)
    assert isinstance(pool, SentinelConnectionPool) and pool.connection_kwargs["db"] == 1


def test_nothing_else_in_the_apps_makes_a_redis_client():
    """One owner: a client made elsewhere from a URL (redis.Redis.from_url) would talk to one server
    and miss a Sentinel failover."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    made = re.compile(r"\bfrom_url\(|\bredis\.(Strict)?Redis\(|\bSentinel\(|\bConnectionPool\(")
    found = [
        f"{path.relative_to(root)}:{number}"
        for app in ("portal", "jobs", "accounting")
        for path in sorted((root / app).rglob("*.py"))
        if path != root / "portal" / "redis_client.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if made.search(line)
    ]
    assert found == []
