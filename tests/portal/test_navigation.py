"""The main menu (templates/base.html, portal.context_processors.navigation): links reversed from the
URL names, and the entry of the page's section marked aria-current — found from the view the URL
resolved to, not from a path prefix written in the template."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def _current(html: str) -> list[tuple[str, str]]:
    menu = html[html.index('<nav aria-label="Main"') : html.index("</nav>")]
    return re.findall(r'<a href="([^"]+)" aria-current="page">([^<]+)</a>', menu)


@pytest.mark.parametrize(("path", "entry"), [
    ("/", ("/", "Dashboard")),
    ("/jobs/", ("/jobs/", "Jobs")),
    ("/jobs/new/", ("/jobs/", "Jobs")),
    ("/clusters/", ("/clusters/", "Clusters")),
    ("/accounting/bookings/", ("/accounting/bookings/", "Bookings")),
    ("/accounting/budget/", ("/accounting/budget/", "Budget")),
    ("/teams/vision/", ("/teams/", "Teams")),
    ("/accounting/reports/", ("/accounting/reports/", "Reports")),
    ("/account/tokens/", None),
])  # fmt: skip
def test_the_menu_marks_the_section_of_the_page(client_for, path, entry):
    response = client_for("finance" if "reports" in path else "member").get(path)
    assert response.status_code == 200
    assert _current(response.content.decode()) == ([entry] if entry else [])


def test_the_menu_links_every_section(client_for):
    html = client_for("admin").get("/").content.decode()
    menu = html[html.index('<nav aria-label="Main"') : html.index("</nav>")]
    links = re.findall(r'<a href="([^"]+)"', menu)
    assert links == ["/", "/jobs/", "/clusters/", "/accounting/bookings/", "/accounting/budget/", "/teams/",
                     "/accounting/reports/", "/admin/", "/api/docs/"]  # fmt: skip
