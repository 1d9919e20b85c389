"""Fixtures of the CLI tests: an isolated config directory, and a stdlib HTTP server standing in
for the REST API (scripted answers, recorded requests) for the tests that need no backend."""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """XDG_CONFIG_HOME in a temporary directory; no GPUPORTAL_* from the caller's shell; no backoff."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GPUPORTAL_URL", raising=False)
    monkeypatch.delenv("GPUPORTAL_TOKEN", raising=False)
    monkeypatch.setattr("gpuportal_cli.client.RETRY_BACKOFF_SECONDS", 0.01)
    return tmp_path


class FakeApi:
    """Answers queued per (method, path): ``api.add("POST", "/api/v1/jobs/", 201, {...})``. The last
    answer of a route repeats. Every request is recorded in ``requests``."""

    def __init__(self):
        self.routes: dict[tuple[str, str], deque] = defaultdict(deque)
        self.requests: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def add(self, method: str, path: str, status: int, body=None) -> None:
        self.routes[(method, path)].append((status, body))

    def requests_to(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == method and r["path"] == path]

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                api.requests.append(
                    {
                        "method": self.command,
                        "path": parts.path,
                        "query": {k: v[0] for k, v in parse_qs(parts.query).items()},
                        "headers": dict(self.headers),
                        "json": json.loads(raw) if raw else None,
                    }
                )
                queue = api.routes.get((self.command, parts.path))
                if not queue:
                    status, body = 404, {"detail": "Not found.", "errors": {}}
                else:
                    status, body = queue[0] if len(queue) == 1 else queue.popleft()
                payload = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

        return Handler

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_api(cli_env, monkeypatch):
    api = FakeApi()
    monkeypatch.setenv("GPUPORTAL_URL", api.url)
    monkeypatch.setenv("GPUPORTAL_TOKEN", "gpp_test")
    yield api
    api.close()
