"""Redis with Sentinel (issue 42): a real master, its replica and three Sentinels of this test's own
(passwords on both, as a site sets them);
the master is SIGKILLed, the Sentinels promote the replica, and without restarting any process the
portal's four users of Redis work again on the new master: Django's cache (portal.redis_client's
pool_class), the throttle's Lua script, the outbox's coalescing flags and Celery (a task sent through
the sentinel:// broker URL to a real worker, which writes the cache from its own process); /healthz's
broker check answers ok again.
Figures are printed (run with ``-s``)."""

from __future__ import annotations

import concurrent.futures
import os
import time
import uuid

import pytest

from tests.conftest import ROOT
from tests.faults.conftest import FaultWorker, _database_url
from tests.faults.ha import SentinelRedis, wait_until
from tests.support import wait_for
from tests.workers import _use_broker

CACHE_DB, BROKER_DB = 1, 0


@pytest.fixture
def sentinel_redis(tmp_path):
    redis_ha = SentinelRedis(tmp_path)
    try:
        redis_ha.start()
        yield redis_ha
    finally:
        redis_ha.stop()


@pytest.fixture
def cache_on_sentinels(sentinel_redis, settings):
    """This process's cache (and throttle) on the Sentinel URL, as production settings make it."""
    settings.REDIS_SENTINEL_MASTER = sentinel_redis.master_name
    settings.REDIS_SENTINEL_PASSWORD = sentinel_redis.sentinel_password
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": [sentinel_redis.url(CACHE_DB)],
            "OPTIONS": {"pool_class": "portal.redis_client.UrlConnectionPool"},
            "KEY_PREFIX": "gpuportal",  # the worker's (production settings)
        }
    }


@pytest.fixture
def portal_on_sentinels(sentinel_redis, cache_on_sentinels, settings, tmp_path):
    """This process's cache and Celery app on the Sentinel URLs, and a real worker on them."""
    from portal.project.celery import app
    from portal.redis_client import sentinel_kwargs

    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.CELERY_BROKER_URL = sentinel_redis.url(BROKER_DB)  # what /healthz's broker check reads
    # Celery (namespace CELERY) reads its transport options from Django's settings each time
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {
        **settings.CELERY_BROKER_TRANSPORT_OPTIONS, "master_name": sentinel_redis.master_name,
        "sentinel_kwargs": sentinel_kwargs(sentinel_redis.sentinel_password),
    }
    saved = app.conf.broker_url, app.conf.task_always_eager
    app.conf.task_always_eager = False
    _use_broker(sentinel_redis.url(BROKER_DB))
    queue = f"ha-{os.getpid()}"
    log_dir = ROOT / ".run" if (ROOT / ".run").is_dir() else tmp_path
    worker = FaultWorker(
        broker_url=sentinel_redis.url(BROKER_DB), queue=queue, database_url=_database_url(),
        log_path=log_dir / "test-failover-redis-worker.log", concurrency=1, module="tests.faults.ha_worker_main",
        extra_env={"CACHE_URL": sentinel_redis.url(CACHE_DB), "REDIS_SENTINEL_MASTER": sentinel_redis.master_name,
                   "REDIS_SENTINEL_PASSWORD": sentinel_redis.sentinel_password},
    )  # fmt: skip
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()
        app.conf.task_always_eager = saved[1]
        _use_broker(saved[0])


def _round_trip(redis_ha: SentinelRedis, worker: FaultWorker, tag: str, master: int) -> dict:
    """Each user of Redis once, each checked on ``master`` itself; the seconds each took."""
    from django.core.cache import cache

    from portal.outbox import coalesced_hold
    from portal.project.celery import app
    from portal.project.health import _check_broker
    from portal.throttles import _cell_rate

    took = {}
    started = time.monotonic()
    cache.set(f"ha:{tag}", tag, timeout=300)
    assert cache.get(f"ha:{tag}") == tag
    assert redis_ha.data(master, CACHE_DB).exists(cache.make_key(f"ha:{tag}")) == 1
    took["cache"] = time.monotonic() - started

    started = time.monotonic()
    key = f"ha-throttle-{tag}"
    assert _cell_rate(key, now=1000.0, interval=30.0, period=60.0) is None  # 2/min: a burst of two …
    assert _cell_rate(key, now=1000.0, interval=30.0, period=60.0) is None
    assert _cell_rate(key, now=1000.0, interval=30.0, period=60.0) == pytest.approx(30.0)  # … then refused
    assert redis_ha.data(master, CACHE_DB).exists(cache.make_key(key)) == 1
    took["throttle"] = time.monotonic() - started

    started = time.monotonic()
    flag = f"ha-flag-{tag}"
    coalesced_hold(flag, 60)  # logs and goes on when Redis does not answer: look on the master
    assert redis_ha.data(master, BROKER_DB).get(flag) == b"1"
    took["outbox_flag"] = time.monotonic() - started

    started = time.monotonic()
    token = f"{tag}-{uuid.uuid4().hex[:8]}"
    app.send_task("tests.faults.ha_echo", args=[token], queue=worker.queue)
    wait_for(lambda: cache.get(f"ha-echo:{token}"), timeout=60, interval=0.1, what=f"the worker to run ha_echo({token})")
    took["celery"] = time.monotonic() - started

    started = time.monotonic()
    assert _check_broker() == {"ok": True}  # /healthz: the load balancer's view of this host
    took["healthz_broker"] = time.monotonic() - started
    return {name: round(seconds, 2) for name, seconds in took.items()}


def test_cache_throttle_outbox_flags_and_celery_follow_a_sentinel_failover(sentinel_redis, portal_on_sentinels):
    redis_ha, worker = sentinel_redis, portal_on_sentinels
    old, new = redis_ha.data_ports
    assert redis_ha.master_port() == old
    before = _round_trip(redis_ha, worker, "before", old)  # every pool now holds connections to the old master
    assert redis_ha.data(old).wait(1, 5000) == 1  # the replica has all of it (WAIT: replicated writes)

    redis_ha.kill(old)  # SIGKILL: the master host is gone
    failover = wait_until(lambda: redis_ha.master_port() == new, timeout=30, what="the Sentinels to promote the replica")
    after = _round_trip(redis_ha, worker, "after", new)  # the same process, the same Celery worker

    from django.core.cache import cache

    assert cache.get("ha:before") == "before"  # what was replicated before the kill is still there
    assert worker.proc.poll() is None and worker.exits == 0  # the worker followed by itself
    print(f"\nSentinel failover: promoted after {failover:.1f} s; first round trip before {before}, after {after}")


def test_a_frozen_master_fails_a_call_within_the_timeout_and_returns_as_a_replica(sentinel_redis, cache_on_sentinels):
    """A master that stops answering with its connections open (SIGSTOP: what a cut link looks like to
    a client) fails a cache call after REDIS_SOCKET_TIMEOUT instead of holding the request; the cache
    follows the promoted replica; the old master, back, is made a replica of the new one by the
    Sentinels, and the portal's writes keep going to the new master."""
    import redis
    from django.core.cache import cache

    from portal.redis_client import REDIS_SOCKET_TIMEOUT

    redis_ha = sentinel_redis
    old, new = redis_ha.data_ports
    cache.set("frozen:before", "1", timeout=300)  # a pooled connection to the old master
    redis_ha.freeze(old)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a call that hangs fails the test, not the run
        call = pool.submit(cache.get, "frozen:before")
        try:
            with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
                call.result(timeout=REDIS_SOCKET_TIMEOUT + 1.5)
        finally:
            if not call.done():
                redis_ha.thaw(old)
    failed_after = time.monotonic() - started
    wait_until(lambda: redis_ha.master_port() == new, timeout=30, what="the Sentinels to promote the replica")
    cache.set("frozen:after", "2", timeout=300)
    assert cache.get("frozen:after") == "2"

    redis_ha.thaw(old)  # the old master is back …
    back = wait_until(lambda: redis_ha.role(old) == "slave", timeout=30, what="the Sentinels to make it a replica")
    cache.set("frozen:back", "3", timeout=300)  # … and writes still go to the new master, replicated to it
    key = cache.make_key("frozen:back")
    assert redis_ha.data(new, CACHE_DB).get(key) is not None
    wait_until(lambda: redis_ha.data(old, CACHE_DB).get(key) is not None, timeout=10, what="the old master to replicate")
    print(f"\nfrozen master: the call failed after {failed_after:.1f} s; back as a replica {back:.1f} s after SIGCONT")
