"""One business error and the places that turn errors into what a user sees: the DRF exception
handler (JSON ``{"detail": ..., "errors": {...}}``), ``form_add_application_error`` for forms,
``page_button`` for a page's buttons, and the envelope and internal-error helpers
that ``portal.middleware.ApiErrorMiddleware`` uses so that everything under /api/ answers that JSON
shape, 404s of unknown URLs and 500s included, whatever ``DEBUG`` says."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler

logger = logging.getLogger("portal.errors")

API_PREFIX = "/api/"


class ApplicationError(Exception):
    """A business rule refused the request. ``errors`` maps field names to lists of messages.

    ``status_code`` is 400 for bad input, 409 for a conflict with the current state (a budget
    that does not fit, a booking that overlaps, cancelling a finished job)."""

    status_code = 400

    def __init__(self, message: str, *, errors: dict[str, list[str] | str] | None = None, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.errors = {k: (v if isinstance(v, list) else [v]) for k, v in (errors or {}).items()}
        if status_code is not None:
            self.status_code = status_code


class Conflict(ApplicationError):
    status_code = 409


def _flatten(detail: Any) -> Any:
    if isinstance(detail, list):
        return [str(item) if not isinstance(item, (dict, list)) else _flatten(item) for item in detail]
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    return [str(detail)]


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    """Every API error answers ``{"detail": str, "errors": {field: [messages]}}``, as JSON whatever
    renderer the request asked for (``?format=csv`` must not turn an error into CSV)."""
    request = context.get("request")
    if request is not None and getattr(request, "accepted_renderer", None) is not None:
        if getattr(request.accepted_renderer, "format", "json") != "json":
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
    if isinstance(exc, ApplicationError):
        return Response(error_envelope(exc.message, exc.errors), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        errors = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        exc = drf_exceptions.ValidationError(errors)
    elif isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = drf_exceptions.PermissionDenied()

    response = drf_default_handler(exc, context)
    if response is None:
        if request is not None and backend_unavailable(exc):
            return Response(error_envelope(FAILOVER_DETAIL), status=503, headers={"Retry-After": str(FAILOVER_RETRY_AFTER_SECONDS)})
        return None
    if isinstance(exc, drf_exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        errors = _flatten(errors)
        fields = ", ".join(sorted(errors))
        first = next(iter(errors.values()), [""])
        first_text = first[0] if isinstance(first, list) and first and isinstance(first[0], str) else ""
        detail = f"Invalid input: {fields}." + (f" {first_text}" if len(errors) == 1 and first_text else "")
        response.data = error_envelope(detail, errors)
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else str(response.data)
        response.data = error_envelope(detail)
        if isinstance(exc, drf_exceptions.Throttled) and exc.wait is not None:
            response.data["errors"] = {"throttle": [f"Retry in {int(exc.wait) + 1} s."]}
    return response


def form_add_application_error(form, error: ApplicationError) -> None:
    """Show an ApplicationError on a Django form: field errors beside their fields, the rest on top."""
    placed = False
    for field, messages in error.errors.items():
        target = field if field in form.fields else None
        for message in messages:
            form.add_error(target, message)
            placed = True
    if not placed or error.message not in sum(error.errors.values(), []):
        form.add_error(None, error.message)


def page_button(request, service: Callable[[], str], *, then: str):
    """A page's button (a POST without a form): run ``service``, which returns the success message,
    and redirect to the URL named ``then`` with that message or the ApplicationError's; a 403 stays
    a 403 (Django's PermissionDenied)."""
    from django.contrib import messages
    from django.shortcuts import redirect

    try:
        done = service()
    except ApplicationError as exc:
        if exc.status_code == 403:
            raise PermissionDenied(exc.message) from exc
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect(then)


def status_for(error: ApplicationError) -> int:
    return error.status_code or status.HTTP_400_BAD_REQUEST


# ---------------------------------------------------------------- the API's error envelope outside DRF


def is_api_request(request) -> bool:
    return request.path.startswith(API_PREFIX)


def error_envelope(detail: str, errors: dict | None = None) -> dict:
    """The body of every API error: ``{"detail": str, "errors": {field: [messages]}}``."""
    return {"detail": str(detail), "errors": errors or {}}


def status_detail(status_code: int) -> str:
    """A status's reason phrase as a sentence ("Not found.", "Method not allowed.")."""
    try:
        phrase = HTTPStatus(status_code).phrase
    except ValueError:
        phrase = "Error"
    return phrase[:1] + phrase[1:].lower() + "."


def api_error_response(status_code: int, detail: str | None = None, errors: dict | None = None) -> JsonResponse:
    return JsonResponse(error_envelope(detail or status_detail(status_code), errors), status=status_code)


# How long a client is told to wait when the database or Redis is not answering or not writable: the
# seconds a failover takes (a Sentinel promotion, pg_auto_failover's; docs/reliability.md's figures)
FAILOVER_RETRY_AFTER_SECONDS = 5
FAILOVER_DETAIL = "The portal's database or cache is not answering (a failover in progress?): retry in a few seconds."
_READ_ONLY_SQLSTATE = "25006"  # read_only_sql_transaction: a standby, or a primary being demoted


def backend_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database or Redis cannot serve the request now (a connection refused,
    lost or timed out, a server that is read-only: a failover), rather than that the request or the
    code is wrong. Such a request changed nothing (its transaction rolled back) and may be sent again:
    it answers 503 with Retry-After, which the CLI and API clients retry (a keyed POST included)."""
    from django.db import DatabaseError, InterfaceError, OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError, ReadOnlyError, TimeoutError as RedisTimeout

    if isinstance(exc, (OperationalError, InterfaceError, RedisConnectionError, RedisTimeout, ReadOnlyError)):
        return True
    return isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) == _READ_ONLY_SQLSTATE


def unavailable_response(request, exc: BaseException):
    """The 503 of a request the database or Redis could not serve (backend_unavailable): the API's
    JSON envelope, or a short page; Retry-After either way. Logged as a warning with its cause."""
    from django.http import HttpResponse
    from django.template.loader import render_to_string

    logger.warning("503 (backend unavailable): %s %s: %s: %s", request.method, request.get_full_path(), type(exc).__name__, exc)
    if is_api_request(request):
        response = api_error_response(503, FAILOVER_DETAIL)
    else:
        response = HttpResponse(render_to_string("503.html", {"detail": FAILOVER_DETAIL}), status=503)
    response["Retry-After"] = str(FAILOVER_RETRY_AFTER_SECONDS)
    return response


def server_error(request):
    """The URLconf's handler500, which Django calls while the exception is being handled — from a view
    or from a middleware's own work (a session saved on a database that has just become read-only):
    what the database or Redis could not serve is the 503 of ``unavailable_response``, anything else
    Django's own 500 page."""
    import sys

    from django.views.defaults import server_error as django_server_error

    exc = sys.exc_info()[1]
    if exc is not None and backend_unavailable(exc):
        return unavailable_response(request, exc)
    return django_server_error(request)


def internal_error_response(request, exc_info=None) -> JsonResponse:
    """A 500 for an API client: ``Internal error (id …)``; the same id is logged (with the traceback
    when ``exc_info`` is given) so that an operator finds the request a user reports."""
    error_id = uuid.uuid4().hex[:12]
    logger.error("Internal error (id %s): %s %s", error_id, request.method, request.get_full_path(), exc_info=exc_info)
    response = api_error_response(500, f"Internal error (id {error_id}).")
    response["X-Error-Id"] = error_id
    return response
