"""Fixtures of the browser tests: Debian's Chromium (scripts/browser) driven by Playwright for
Python (sync API) against pytest-django's live_server, with the real Celery worker relaying to the
local Slurm cluster and a sync loop standing in for beat.

Playwright is only told where the browser is (``executable_path``): ``playwright install`` (a
browser download of its own) is never run. Each test gets fresh browser contexts (cookies,
storage); ``launch()`` gives the browser a fresh temporary profile directory of its own.
Page helpers (log in, screenshots) are in tests/browser/helpers.py."""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal
from urllib.parse import urlsplit

import pytest

from tests.support import skip_unless_ci

CHROMIUM = os.environ.get("GPUPORTAL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
EXPECT_TIMEOUT_MS = 15_000  # one page step (navigation, an htmx swap); long waits say their own


@pytest.fixture(scope="package")
def chromium():
    """One headless Chromium for the browser tests (skips when Playwright or the browser is missing).

    Playwright's sync API keeps its asyncio loop marked as running on this thread while it is
    started, and Django then refuses ORM calls from this thread as if they came from async code. This
    thread only sets up and checks (the portal answers in live_server's thread), so Django is told
    to allow them while the browser runs — and only then: the browser stops with the package."""
    try:
        from playwright import sync_api
    except ImportError:
        skip_unless_ci("playwright is not installed (pip install -e '.[dev]')")
    if not os.access(CHROMIUM, os.X_OK):
        skip_unless_ci(f"{CHROMIUM} not found: run scripts/browser (installs Debian's chromium)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        playwright = sync_api.sync_playwright().start()
        try:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000
            )
            sync_api.expect.set_options(timeout=EXPECT_TIMEOUT_MS)
            yield browser
            browser.close()
        finally:
            playwright.stop()


class Browsing:
    """New pages in fresh contexts against the live server; records what went wrong on them
    (JavaScript errors, failed requests, 4xx/5xx answers of the portal) for ``assert_clean``."""

    def __init__(self, browser, base_url: str):
        self.browser = browser
        self.base_url = base_url
        self.contexts = []
        self.problems: list[str] = []

    def page(self, *, javascript: bool = True):
        context = self.browser.new_context(
            base_url=self.base_url, java_script_enabled=javascript, accept_downloads=True,
            viewport={"width": 1280, "height": 900}, locale="en-GB", timezone_id="UTC",
        )  # fmt: skip
        context.set_default_timeout(EXPECT_TIMEOUT_MS)
        self.contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: self.problems.append(f"JavaScript error on {page.url}: {exc}"))
        page.on("requestfailed", lambda request: self._request_failed(request))
        page.on("response", lambda response: self._response(response))
        return page

    def _ours(self, url: str) -> bool:
        return urlsplit(url).netloc == urlsplit(self.base_url).netloc

    def _request_failed(self, request) -> None:
        # a poll cut short by a navigation is "net::ERR_ABORTED": not a fault of the page
        if self._ours(request.url) and "ERR_ABORTED" not in (request.failure or ""):
            self.problems.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def _response(self, response) -> None:
        if self._ours(response.url) and response.status >= 400:
            self.problems.append(f"{response.status} for {response.request.method} {response.url}")

    def assert_clean(self, *, allow: tuple[str, ...] = ()) -> None:
        problems = [p for p in self.problems if not any(a in p for a in allow)]
        assert not problems, "\n".join(problems)

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def browsing(chromium, live_server):
    session = Browsing(chromium, live_server.url)
    yield session
    session.close()




A100_PRICE = Decimal(8)


@pytest.fixture
def a100_rate(world):
    """A GPU-hour price, so that the submission form's estimate has a cost."""
    from accounting.models import Rate

    return Rate.objects.create(
        gpu_type="a100", price_per_gpu_hour=A100_PRICE, effective_from=dt.date(2020, 1, 1)
    )


@pytest.fixture
def portal(cluster, real_worker, jobs_sync_loop, a100_rate, live_server, browsing):
    """The whole portal as a user meets it: live server, local cluster, real worker, sync loop."""
    return cluster
