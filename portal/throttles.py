"""Throttles: DRF classes for the API, and the login page's counter (same rate setting)."""

from __future__ import annotations

from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class LoginRateThrottle(AnonRateThrottle):
    scope = "login"


class SubmitRateThrottle(UserRateThrottle):
    scope = "submit"


def login_attempt_allowed(request) -> bool:
    """Counts POSTs to the login page per client address in the cache, at the THROTTLE_LOGIN rate."""
    throttle = LoginRateThrottle()
    return throttle.allow_request(request, view=None)
