"""The API's OpenAPI contract: one ``AutoSchema`` for the whole project (REST_FRAMEWORK's
DEFAULT_SCHEMA_CLASS) that documents, beside each operation's success answers, every error status it
can give, all with the one shared ``Error`` component (``{"detail": str, "errors": {...}}``, as
``portal.exceptions`` writes it).

The statuses are derived from what the view is, so they follow the code without a decorator per view:

- 400 — every operation: a query parameter (any name, documented or not) holding a NUL byte is refused
  before the view (portal.middleware.NulQueryMiddleware); and what takes a body or query parameters or
  changes state refuses invalid input (a service's ApplicationError);
- 401 — the view authenticates (no credentials, a bad or expired token);
- 403 — it changes state (role checks in the services; the CSRF check of session auth), or a
  permission class beyond IsAuthenticated; a read that refuses by role declares its 403 itself;
- 404 — every operation: an object the path names that does not exist or that the caller may not
  see (both look alike), a page past the end, an unknown ``?format=``;
- 409 — it changes state (a conflict with the current state: budget, overlap, already ended);
- 415 — it takes a body (bodies are JSON only: REST_FRAMEWORK's DEFAULT_PARSER_CLASSES);
- 429 — the view has a throttle.

An operation's own ``@extend_schema(responses=…)`` wins for a status it names. Errors are always JSON,
even where the success answer is CSV. Optional query parameters say ``allowEmptyValue``: an empty
value is the same as none, as DRF and django-filter read query strings."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from rest_framework import permissions, serializers

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ErrorSerializer(serializers.Serializer):
    """Every error of the API."""

    detail = serializers.CharField(help_text="What went wrong, as a sentence for people.")
    errors = serializers.DictField(
        help_text=(
            "Field name → list of messages; empty when the error is not about a field. For a batch of jobs: "
            'job index → field → messages ({"3": {"gpus": ["…"]}}).'
        ),
    )


ERROR_DESCRIPTIONS = {
    "400": "Invalid input, or refused by a business rule: `errors` names the fields.",
    "401": "Not authenticated: no credentials, or a token that is invalid, revoked or expired.",
    "403": "Authenticated but not allowed (your role), or the CSRF check of session authentication failed.",
    "404": "No such object, or one you may not see (both answer the same), a page past the end, or an unknown `format`.",
    "409": "Conflicts with the current state (budget, overlap, an object already decided or ended, "
    "an Idempotency-Key reused with another body).",
    "415": "Unsupported media type: send `application/json`.",
    "429": "Too many requests: retry after the number of seconds in `Retry-After`.",
}

_PLAIN_PERMISSIONS = (permissions.AllowAny, permissions.IsAuthenticated)


class PortalAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "query" and not parameter.get("required"):
                parameter["allowEmptyValue"] = True  # `?since=` is the same as no `since` (DRF, django-filter)
        responses = operation.setdefault("responses", {})
        error = {"application/json": {"schema": self.resolve_serializer(ErrorSerializer, "response").ref}}
        for code in self.error_statuses(operation):
            if code not in responses:
                responses[code] = {"content": dict(error), "description": ERROR_DESCRIPTIONS[code]}
                if code == "429":
                    responses[code]["headers"] = {
                        "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}
                    }
        for code, response in responses.items():
            if int(code) >= 400 and "application/json" in response.get("content", {}):
                # one the operation declared: errors are JSON whatever its renderers (?format=csv too)
                response["content"] = {"application/json": response["content"]["application/json"]}
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def error_statuses(self, operation: dict) -> list[str]:
        """The error statuses this operation can answer (see the module's docstring)."""
        has_body = "requestBody" in operation
        changes_state = self.method not in SAFE_METHODS
        view_permissions = self.view.get_permissions()
        statuses = set()
        statuses.add("400")  # every operation: a NUL byte in any query parameter (NulQueryMiddleware)
        if self.view.get_authenticators():
            statuses.add("401")
        if changes_state or any(not isinstance(p, _PLAIN_PERMISSIONS) for p in view_permissions):
            statuses.add("403")
        statuses.add("404")  # every operation: an unknown `?format=` (DRF's content negotiation)
        if changes_state:
            statuses.add("409")
        if has_body:
            statuses.add("415")
        if self.view.get_throttles():
            statuses.add("429")
        return sorted(statuses)
