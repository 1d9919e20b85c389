from __future__ import annotations

import zoneinfo

from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpResponseBadRequest
from django.http.multipartparser import MultiPartParserError
from django.utils import timezone

from portal.exceptions import api_error_response, backend_unavailable, internal_error_response, is_api_request, unavailable_response

# What Django itself turns into a 4xx (django.core.handlers.exception.response_for_exception)
_CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest, SuspiciousOperation, MultiPartParserError)


class ApiErrorMiddleware:
    """Everything under /api/ answers JSON ``{"detail", "errors"}``, with DEBUG on or off.

    DRF views already do (portal.exceptions.api_exception_handler). This covers the rest: a URL that
    does not resolve (an unknown path, a malformed id), Django's own 4xx answers, and unhandled
    exceptions, which answer ``500 {"detail": "Internal error (id …)"}`` with the id logged beside
    the traceback instead of the debug page. It must be the first middleware, so that it also sees
    the answers of the others. Pages keep Django's handling (plain error pages when DEBUG is off)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code >= 400 and is_api_request(request) and not _is_json(response):
            if response.status_code >= 500:
                # an exception outside the view (another middleware): Django logged its traceback
                return internal_error_response(request)
            converted = api_error_response(response.status_code)
            for header in ("Allow", "WWW-Authenticate", "Retry-After"):
                if response.has_header(header):
                    converted[header] = response[header]
            return converted
        return response

    def process_exception(self, request, exception):
        if backend_unavailable(exception):  # a failover: 503 with Retry-After, pages and API alike
            return unavailable_response(request, exception)
        if not is_api_request(request) or isinstance(exception, _CLIENT_ERRORS):
            return None  # pages: Django's handling; API 4xx: converted in __call__
        return internal_error_response(request, exc_info=(type(exception), exception, exception.__traceback__))


class NulQueryMiddleware:
    """A query parameter (name or value) with a NUL byte is a 400 naming it, before any view: PostgreSQL
    text cannot hold NUL, so a filter like ``?status=%00`` would otherwise be a database error (500).
    Request bodies are covered by their serializers and forms (DRF's and Django's CharField refuse NUL)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        bad = sorted({name.replace("\x00", "\\x00") for name, values in request.GET.lists() for text in (name, *values)
                      if "\x00" in text})  # fmt: skip
        if bad:
            message = "Must not contain NUL (0x00) bytes."
            if is_api_request(request):
                return api_error_response(400, f"Query parameter {bad[0]!r}: {message}", {name: [message] for name in bad})
            return HttpResponseBadRequest(f"Query parameter {bad[0]!r}: {message}", content_type="text/plain; charset=utf-8")
        return self.get_response(request)


class SnapshotScopeMiddleware:
    """Read the versions of the process's snapshots (portal.snapshots) once per request: one cache
    MGET for the inventory, rates, quotas, bookings and roles a submission looks at."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from portal.snapshots import snapshot_scope

        with snapshot_scope():
            return self.get_response(request)


def _is_json(response) -> bool:
    content_type = response.get("Content-Type", "").split(";")[0].strip()
    return content_type == "application/json" or content_type.endswith("+json")


class UserTimezoneMiddleware:
    """Show times in the user's own time zone (profile), else the site's TIME_ZONE."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        tz_name = ""
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            profile = getattr(user, "profile", None)
            tz_name = profile.time_zone if profile else ""
        if tz_name:
            try:
                timezone.activate(zoneinfo.ZoneInfo(tz_name))
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                timezone.deactivate()
        else:
            timezone.deactivate()
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """The Content-Security-Policy header (setting CONTENT_SECURITY_POLICY; empty: none) on every
    response that has none. ``{nonce}`` in the policy is a fresh random value per request, given to
    templates as ``csp_nonce`` (portal.context_processors.csp): an inline ``<script>`` runs only with
    ``nonce="{{ csp_nonce }}"``, so markup injected into a page cannot run script."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        import secrets

        from django.conf import settings

        request.csp_nonce = secrets.token_urlsafe(18)
        response = self.get_response(request)
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy.replace("{nonce}", request.csp_nonce)
        return response
