"""A small JSON-over-HTTP client of the portal's REST API (``/api/v1/``), on ``http.client``
(standard library only, Python >= 3.9).

- One keep-alive connection per client, reused for every request (``logs --follow`` polls over it);
  a connection the server closed while idle is seen before it is used, and replaced.
- The token goes to the portal's origin (scheme, host, port of the configured URL) and nowhere
  else: ``next`` links of paginated answers are read on that origin; a redirect is followed only
  for a GET and only within that origin; a redirect of a POST is refused (urllib turned a 301 of a
  POST into a GET and sent the token along to the new origin).
- An answer that is not JSON (an SSO login page, a proxy's error page) is an ``ApiError`` whose
  one-line message names the URL and the status.
- ``http_proxy`` / ``https_proxy`` / ``no_proxy`` are honoured as urllib does (an https portal
  through a CONNECT tunnel, so the proxy never sees the token).
- 429 and 503 honour ``Retry-After`` (seconds or an HTTP date, at most ``RETRY_AFTER_MAX_SECONDS``).
  A 429 is retried for any request (the throttle refused it before anything happened); requests that
  are safe to repeat (GETs, and POSTs carrying an ``Idempotency-Key``) are also retried on connection
  errors and 502/503/504, with backoff; nothing else is.

Errors come back as ``ApiError`` carrying the API's ``{"detail", "errors"}``."""

from __future__ import annotations

import base64
import email.utils
import http.client
import json
import select
import ssl
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Tuple

USER_AGENT = "gpuportal-cli/1"
RETRY_STATUSES = {502, 503, 504}  # retried for repeatable requests
RETRY_BACKOFF_SECONDS = 1.0  # first wait; doubles on each retry, up to RETRY_BACKOFF_MAX_SECONDS
RETRY_BACKOFF_MAX_SECONDS = 8.0
# retries of a request that may be repeated: enough to ride out a server's failover (a database's takes
# 9–30 s, docs/reliability.md: the portal and its load balancer answer 503 with Retry-After meanwhile)
RETRIES = 8
RETRY_AFTER_MAX_SECONDS = 120.0  # a longer Retry-After is reported, not waited for
MAX_REDIRECTS = 5
# Sending on a kept-alive connection the server has closed: the request never reached it.
STALE_CONNECTION_ERRORS = (ConnectionResetError, BrokenPipeError)

Origin = Tuple[str, str, int]


class ApiError(Exception):
    """The API answered with an error (``status`` > 0) or could not be reached (``status`` == 0).
    ``from_api`` is False when what answered was not the API (not JSON, a redirect not followed)."""

    def __init__(self, status: int, detail: str, errors: dict[str, list[str]] | None = None, *, from_api: bool = True):
        super().__init__(detail)
        self.status = status
        self.from_api = from_api
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


def origin_of(url: str) -> Origin:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


class Client:
    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, retries: int = RETRIES, backoff: float | None = None,
                 on_retry: Callable[[str], None] | None = None):  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self.on_retry = on_retry  # told each retry's cause and wait (the CLI: one line on stderr)
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.origin = origin_of(self.base_url)
        if self.origin[0] not in ("http", "https") or not self.origin[1]:
            raise ApiError(0, f"not an http(s) URL: {self.base_url}")
        self._connection: http.client.HTTPConnection | None = None
        self.connections_opened = 0  # how many TCP connections this client has opened

    def _backoff(self) -> float:
        return RETRY_BACKOFF_SECONDS if self.backoff is None else self.backoff

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        if path.startswith("http://") or path.startswith("https://"):
            # A "next" link from a paginated answer: its path and query, on the portal's origin
            # (behind a proxy the portal may build links with its internal scheme or host).
            parts, base = urllib.parse.urlsplit(path), urllib.parse.urlsplit(self.base_url)
            url = urllib.parse.urlunsplit((base.scheme, base.netloc, parts.path, parts.query, ""))
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

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

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
        retries_left = self.retries
        attempt = 0
        redirects = 0
        while True:
            try:
                status, reason, answer_headers, raw = self._exchange(method, url, data, all_headers)
            except (OSError, http.client.HTTPException) as exc:
                if repeatable and retries_left > 0:
                    retries_left -= 1
                    wait = min(self._backoff() * 2**attempt, RETRY_BACKOFF_MAX_SECONDS)
                    self._retrying(method, url, getattr(exc, "reason", None) or str(exc) or type(exc).__name__, wait)
                    time.sleep(wait)
                    attempt += 1
                    continue
                reason_text = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
                raise ApiError(0, f"cannot reach {self.base_url}: {reason_text}") from None

            if 300 <= status < 400 and status != 304:
                url = self._redirect_target(method, url, status, answer_headers.get("Location") or "")
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise ApiError(status, f"{method} {url}: more than {MAX_REDIRECTS} redirects; not followed", from_api=False)
                continue

            if status in (429, *RETRY_STATUSES) and retries_left > 0 and (status == 429 or repeatable):
                wait = retry_after_seconds(answer_headers.get("Retry-After"))
                if wait is None:
                    wait = min(self._backoff() * 2**attempt, RETRY_BACKOFF_MAX_SECONDS)
                if wait <= RETRY_AFTER_MAX_SECONDS:
                    retries_left -= 1
                    attempt += 1
                    self._retrying(method, url, f"{status} {reason}".strip(), wait)
                    time.sleep(wait)
                    continue
            if status >= 400:
                raise _api_error(method, url, status, reason, answer_headers, raw)
            if not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError(status, _not_json(method, url, status, reason, answer_headers), from_api=False) from None

    def _retrying(self, method: str, url: str, cause: str, wait: float) -> None:
        if self.on_retry is not None:
            self.on_retry(f"{method} {url}: {cause}; trying again in {wait:.0f} s")

    def _redirect_target(self, method: str, url: str, status: int, location: str) -> str:
        target = urllib.parse.urljoin(url, location)
        if method != "GET":
            raise ApiError(
                status,
                f"{method} {url} was redirected ({status}) to {target or 'nowhere'}; not followed (only a GET is). "
                "Is the portal URL right? `gpuportal login --url URL` sets it.",
                from_api=False,
            )
        if not location or origin_of(target) != self.origin:
            raise ApiError(
                status,
                f"GET {url} was redirected ({status}) to {target or 'nowhere'}, another origin; not followed "
                f"(the token is only sent to {self.base_url}). If the portal moved: `gpuportal login --url URL`.",
                from_api=False,
            )
        return target

    def _exchange(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, str, http.client.HTTPMessage, bytes]:
        """One request and its whole answer over the kept-alive connection."""
        if origin_of(url) != self.origin:  # the token never leaves the portal's origin
            raise ApiError(0, f"refusing to send the token to {url} (not {self.base_url})")
        headers = dict(headers)
        target = self._request_target(url, headers)
        for fresh in (False, True):
            connection = self._connection_for_request()
            if connection.sock is not None and _dropped(connection.sock):
                self.close()  # the server closed the idle connection (keep-alive timeout)
                connection = self._connection_for_request()
            reused = connection.sock is not None
            if not reused:
                self.connections_opened += 1
            try:
                connection.request(method, target, body=data, headers=headers)
            except STALE_CONNECTION_ERRORS:
                self.close()
                if reused and not fresh:
                    continue  # closed as we sent: the server cannot have read it; once more, on a new one
                raise
            except BaseException:
                self.close()
                raise
            try:
                response = connection.getresponse()
                raw = response.read()
            except BaseException:
                self.close()  # an answer that did not come is never guessed at: the caller retries if it may
                raise
            if response.will_close:
                self.close()
            return response.status, response.reason, response.headers, raw
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection_for_request(self) -> http.client.HTTPConnection:
        if self._connection is None:
            scheme, host, port = self.origin
            proxy = self._proxy()
            connect_host, connect_port = (proxy[0], proxy[1]) if proxy else (host, port)
            if scheme == "https":
                connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                    connect_host, connect_port, timeout=self.timeout, context=ssl.create_default_context()
                )
                if proxy:
                    connection.set_tunnel(host, port, headers=proxy[2])
            else:
                connection = http.client.HTTPConnection(connect_host, connect_port, timeout=self.timeout)
            self._connection = connection
        return self._connection

    def _proxy(self) -> tuple[str, int, dict[str, str]] | None:
        """The proxy for the portal's origin from the environment (host, port, its headers), if any."""
        scheme, host, _ = self.origin
        proxy_url = urllib.request.getproxies().get(scheme)
        if not proxy_url or urllib.request.proxy_bypass(host):
            return None
        if "://" not in proxy_url:
            proxy_url = "http://" + proxy_url
        parts = urllib.parse.urlsplit(proxy_url)
        headers = {}
        if parts.username:
            credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        return parts.hostname or "", parts.port or 8080, headers

    def _request_target(self, url: str, headers: dict[str, str]) -> str:
        """Path and query; to a plain-http proxy, the absolute URL (and the proxy's credentials)."""
        parts = urllib.parse.urlsplit(url)
        proxy = self._proxy() if parts.scheme == "http" else None
        if proxy:
            headers.update(proxy[2])
            return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))
        return urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))

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


def _dropped(sock) -> bool:
    """An idle kept-alive connection that is readable has been closed by the server (or is out of step)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not "²": float() refuses it
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _not_json(method: str, url: str, status: int, reason: str, headers: http.client.HTTPMessage) -> str:
    content_type = (headers.get("Content-Type") or "no Content-Type").split(";")[0]
    return f"{method} {url} answered {status} {reason} with {content_type}, not JSON (a login page or a proxy in the way?)"


_DEFAULT_DETAIL = {
    400: "The request was refused.",
    401: "Not logged in, or the token is invalid or revoked. Run `gpuportal login`.",
    403: "Permission denied.",
    404: "Not found.",
    409: "Conflict with the current state.",
    429: "Too many requests; wait and try again.",
}


def _api_error(method: str, url: str, status: int, reason: str, headers: http.client.HTTPMessage, raw: bytes) -> ApiError:
    detail: str = ""
    errors: Any = {}
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:
        return ApiError(status, _not_json(method, url, status, reason, headers), from_api=False)
    if isinstance(payload, dict):
        detail = str(payload.get("detail") or "")
        errors = payload.get("errors") or {}
        if not detail and not errors:  # a plain DRF error body: {"field": ["msg"]}
            errors = {k: v for k, v in payload.items()}
    if not detail:
        detail = _DEFAULT_DETAIL.get(status, f"HTTP {status} {reason}")
    if status in (429, 503):
        wait = retry_after_seconds(headers.get("Retry-After"))
        if wait is not None:
            detail += f" (the portal asks to wait {wait:.0f} s)"
    errors_dict: dict[str, Any] = errors if isinstance(errors, dict) else {"errors": [str(errors)]}
    return ApiError(status, detail, errors_dict)

