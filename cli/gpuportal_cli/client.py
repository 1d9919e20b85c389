"""A small JSON-over-HTTP client of the portal's REST API (``/api/v1/``), on urllib.

Errors come back as ``ApiError`` carrying the API's ``{"detail", "errors"}``. Requests that are
safe to repeat (GETs, and POSTs carrying an ``Idempotency-Key``) are retried on connection errors
and 502/503/504 with backoff; nothing else is."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

USER_AGENT = "gpuportal-cli/1"
RETRY_STATUSES = {502, 503, 504}
RETRY_BACKOFF_SECONDS = 1.0  # first wait; doubles on each retry


class ApiError(Exception):
    """The API answered with an error (``status`` > 0) or could not be reached (``status`` == 0)."""

    def __init__(self, status: int, detail: str, errors: dict[str, list[str]] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = errors or {}

    def lines(self) -> list[str]:
        """The message and each field error on its own line."""
        out = [self.detail or f"HTTP {self.status}"]
        for field, messages in self.errors.items():
            if isinstance(messages, dict):
                messages = [f"{k}: {v}" for k, v in messages.items()]
            elif not isinstance(messages, list):
                messages = [messages]
            for message in messages:
                out.append(f"  {field}: {message}" if field not in ("non_field_errors", "__all__") else f"  {message}")
        return out


class Client:
    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, retries: int = 3, backoff: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def _backoff(self) -> float:
        return RETRY_BACKOFF_SECONDS if self.backoff is None else self.backoff

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        if path.startswith("http://") or path.startswith("https://"):
            url = path  # a "next" link from a paginated answer
        else:
            url = f"{self.base_url}/api/v1/{path.lstrip('/')}"
        if params:
            query = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "")})
            if query:
                url += ("&" if "?" in url else "?") + query
        return url

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params, repeatable=True)

    def post(self, path: str, body: dict | list | None = None, *, idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", path, body={} if body is None else body, headers=headers, repeatable=bool(idempotency_key))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict | None = None,
        body: dict | list | None = None,
        headers: dict[str, str] | None = None,
        repeatable: bool = False,
    ) -> Any:
        url = self.url(path, params)
        data = json.dumps(body).encode() if body is not None else None
        all_headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **(headers or {})}
        if self.token:
            all_headers["Authorization"] = f"Token {self.token}"
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        attempts = 1 + (self.retries if repeatable else 0)
        for attempt in range(attempts):
            try:
                req = urllib.request.Request(url, data=data, method=method, headers=all_headers)
                with urllib.request.urlopen(req, timeout=self.timeout) as response:
                    raw = response.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                error = _api_error(exc)
                if exc.code in RETRY_STATUSES and attempt + 1 < attempts:
                    time.sleep(self._backoff() * 2**attempt)
                    continue
                raise error from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt + 1 < attempts:
                    time.sleep(self._backoff() * 2**attempt)
                    continue
                reason = getattr(exc, "reason", exc)
                raise ApiError(0, f"cannot reach {self.base_url}: {reason}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def paginate(self, path: str, params: dict | None = None, *, limit: int | None = None):
        """Yield the results of a paginated list, following ``next`` links, at most ``limit`` items."""
        page = self.get(path, params)
        count = 0
        while True:
            results = page.get("results", []) if isinstance(page, dict) else page
            for item in results:
                yield item
                count += 1
                if limit is not None and count >= limit:
                    return
            next_url = page.get("next") if isinstance(page, dict) else None
            if not next_url:
                return
            page = self.get(next_url)


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    detail, errors = "", {}
    try:
        payload = json.loads(exc.read() or b"null")
    except (ValueError, OSError):
        payload = None
    if isinstance(payload, dict):
        detail = str(payload.get("detail") or "")
        errors = payload.get("errors") or {}
        if not detail and not errors:  # a plain DRF error body: {"field": ["msg"]}
            errors = {k: v for k, v in payload.items()}
    if not detail:
        detail = {
            400: "The request was refused.",
            401: "Not logged in, or the token is invalid or revoked. Run `gpuportal login`.",
            403: "Permission denied.",
            404: "Not found.",
            409: "Conflict with the current state.",
            429: "Too many requests; wait and try again.",
        }.get(exc.code, f"HTTP {exc.code} {exc.reason}")
    return ApiError(exc.code, detail, errors if isinstance(errors, dict) else {"errors": [str(errors)]})
