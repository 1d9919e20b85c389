"""Throttles: DRF classes for the API, and the login page's counter (same rate setting). Every one
keys anonymous clients on the real client address (portal.proxies.client_address), never on the
raw X-Forwarded-For string that DRF would use.

Each counts with the generic cell rate algorithm (``CellRateThrottle``: one timestamp per client),
not DRF's list of every request's timestamp: that list is read, trimmed and written back whole on
every request, so at 160 POSTs/s under a 12000/min rate it held ~9600 floats (a 90 KB pickle each
way). Here a request costs one Redis round trip (a small Lua script), whatever the rate."""

from __future__ import annotations

import functools
import math
import threading

from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

from portal.proxies import client_address
from portal.redis_client import cache_write_server, redis_client


class CellRateThrottle(SimpleRateThrottle):
    """DRF's SimpleRateThrottle (same rates, keys, scopes; 429 with Retry-After) by the generic cell
    rate algorithm: "N per period" is one request every period/N on average with bursts of up to N.
    Per client one value, the theoretical arrival time (TAT): a request at ``now`` is allowed when
    ``max(TAT, now) + period/N − now ≤ period`` and then moves TAT there; a refused one changes
    nothing and may retry after ``max(TAT, now) + period/N − period − now`` seconds (never more than
    the period). With Redis one atomic script per request; with another backend (tests' local
    memory) a lock in the process and the cache's own calls."""

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        self.retry_after = _cell_rate(self.key, now=self.now, interval=self.duration / self.num_requests,
                                      period=self.duration)  # fmt: skip
        return True if self.retry_after is None else self.throttle_failure()

    def wait(self):
        """Whole seconds until a request would be allowed (DRF writes Retry-After from this)."""
        return max(1, math.ceil(self.retry_after or 0))


_CELL_RATE_LUA = """
local now, interval, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if tat < now then tat = now end
local new = tat + interval
if new - now > period then return tostring(new - period - now) end
redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil((new - now) * 1000))
return false
"""
_local_lock = threading.Lock()


@functools.cache
def _redis_script(server: str):
    """The script, registered on a redis-py client of ``server`` (portal.redis_client: a Sentinel URL's
    client follows a failover): one per process and server (its connection pool starts afresh in a
    forked child)."""
    return redis_client(server).register_script(_CELL_RATE_LUA)


_cache_write_server = cache_write_server  # the name tests/support.py imports


def _cell_rate(key: str, *, now: float, interval: float, period: float) -> float | None:
    """None when a request at ``now`` is allowed (and counted); else the seconds to wait."""
    if isinstance(caches["default"], RedisCache):  # the key as Django's Redis cache writes it
        script = _redis_script(_cache_write_server())
        wait = script(keys=[cache.make_key(key)], args=[repr(now), repr(interval), repr(period)])
        return None if wait is None else float(wait)
    with _local_lock:
        tat = max(float(cache.get(key) or now), now)
        new = tat + interval
        if new - now > period:
            return new - period - now
        cache.set(key, new, timeout=max(1, math.ceil(new - now)))
        return None


class _ClientAddressIdent:
    def get_ident(self, request):
        return client_address(request) or ""


class LoginRateThrottle(_ClientAddressIdent, CellRateThrottle, AnonRateThrottle):
    scope = "login"


class SubmitRateThrottle(_ClientAddressIdent, CellRateThrottle, UserRateThrottle):
    scope = "submit"


def login_attempt_allowed(request) -> bool:
    """Counts POSTs to the login page per client address in the cache, at the THROTTLE_LOGIN rate."""
    throttle = LoginRateThrottle()
    return throttle.allow_request(request, view=None)
