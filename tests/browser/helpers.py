"""Page helpers of the browser tests: log in through the form, save a screenshot."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"  # gitignored; CI may keep it as an artefact
PASSWORD = "pw-for-tests"  # tests.factories.UserFactory's


def log_in(page, username: str, *, password: str = PASSWORD) -> None:
    """Through the login form, as a person does."""
    page.goto("/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/login/" not in url)
    assert page.get_by_role("button", name="Log out").is_visible()


def screenshot(page, name: str) -> Path:
    """A full-page PNG under test-artifacts/screenshots/ (overwritten on each run)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, animations="disabled")
    return path
