"""Throttles: DRF classes for the API, and the login page's counter (same rate setting). Every one
keys anonymous clients on the real client address (portal.proxies.client_address), never on the
raw X-Forwarded-For string that DRF would use."""

from __future__ import annotations

from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from portal.proxies import client_address


class _ClientAddressIdent:
    def get_ident(self, request):
        return client_address(request) or ""


class LoginRateThrottle(_ClientAddressIdent, AnonRateThrottle):
    scope = "login"


class SubmitRateThrottle(_ClientAddressIdent, UserRateThrottle):
    scope = "submit"


def login_attempt_allowed(request) -> bool:
    """Counts POSTs to the login page per client address in the cache, at the THROTTLE_LOGIN rate."""
    throttle = LoginRateThrottle()
    return throttle.allow_request(request, view=None)
