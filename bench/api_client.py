"""The load generators' side of HTTP: one keep-alive connection to the benchmark's portal per client
thread, authenticated by token, and the count of refused POSTs."""

from __future__ import annotations

import http.client
import json
import sys
import time

from environment import BENCH_PORT


class ApiClient:
    """One keep-alive HTTP/1.1 connection to the benchmark's gunicorn, authenticated by token.
    Reconnects once when the server closed the connection."""

    def __init__(self, token: str, *, port: int | None = None, host: str = "127.0.0.1"):
        self.port = port or BENCH_PORT
        self.headers = {
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self.conn = http.client.HTTPConnection(host, self.port, timeout=60)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes, float]:
        """(status, body, seconds)."""
        payload = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):
            began = time.perf_counter()
            try:
                self.conn.request(method, path, body=payload, headers=self.headers)
                response = self.conn.getresponse()
                data = response.read()
                elapsed = time.perf_counter() - began
                if response.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return response.status, data, elapsed
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                http.client.CannotSendRequest,
            ):
                self.conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def count_refusal(errors: list[int], status: int, text, *, shown: int = 3, chars: int = 300) -> None:
    """A POST answered other than 201 is counted in ``errors[0]``; the first ``shown`` are printed
    (``chars`` of the answer). Called under the client threads' lock."""
    if status != 201:
        errors[0] += 1
        if errors[0] <= shown:
            print(f"  ! POST answered {status}: {text[:chars]!r}", file=sys.stderr)
