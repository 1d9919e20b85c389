"""portal.throttles.CellRateThrottle: "N per period" allows bursts of N, then one request every
period/N; a refused request changes nothing and is told to wait no longer than it must (never more
than the period) — against Redis (the Lua script) and against a local-memory cache alike. The
counter is one small value whatever the rate (issue 16: DRF's history list was 9600 floats)."""

from __future__ import annotations

import uuid

import pytest
import redis

from portal.throttles import _cache_write_server, _cell_rate


@pytest.fixture(params=["redis", "locmem"])
def backend(request, settings):
    if request.param == "locmem":
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "thr"}}
    return request.param


def test_a_burst_of_n_then_one_per_interval_and_the_wait_is_exact(backend):
    key = f"test-throttle-{uuid.uuid4()}"

    def ask(now):
        return _cell_rate(key, now=now, interval=30.0, period=60.0)  # 2/min

    assert ask(1000.0) is None and ask(1000.0) is None  # the burst
    assert ask(1000.0) == pytest.approx(30.0)  # refused: the next slot is 30 s away …
    assert ask(1010.0) == pytest.approx(20.0)  # … and a refusal did not push it further
    assert ask(1030.0) is None  # one more, on time
    assert ask(1030.0) == pytest.approx(30.0)
    assert ask(1200.0) is None and ask(1200.0) is None  # idle long enough: a full burst again
    assert ask(1200.0) <= 60.0


def test_the_counter_is_one_small_value_whatever_the_rate(settings):
    from django.core.cache import cache

    key = f"test-throttle-{uuid.uuid4()}"
    for i in range(5000):  # 5000 requests within 10 s under a 1000000/min rate
        assert _cell_rate(key, now=2000.0 + i / 500, interval=60 / 1_000_000, period=60.0) is None
    # one more under a slow rate: the key then lives ~50 s (under 1000000/min it expires within 1 ms)
    assert _cell_rate(key, now=2010.0, interval=50.0, period=60.0) is None
    with redis.Redis.from_url(_cache_write_server()) as client:  # the value as the script stored it
        assert len(client.get(cache.make_and_validate_key(key))) < 32  # a float as text, not a list
