"""The permission matrix for the portal app's pages and endpoints: anonymous, outsider, member,
manager, admin, finance (roles relative to team vision)."""

from __future__ import annotations

import pytest

from portal.services import api_token_create

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")

# url → expected status per role, in ROLES order
PAGES = {
    "/": (302, 200, 200, 200, 200, 200),
    "/partials/cluster/": (302, 200, 200, 200, 200, 200),
    "/teams/": (302, 200, 200, 200, 200, 200),
    "/teams/vision/": (302, 404, 200, 200, 200, 200),
    "/teams/nlp/": (302, 404, 404, 404, 200, 200),
    "/account/tokens/": (302, 200, 200, 200, 200, 200),
    "/healthz": (503, 503, 503, 503, 503, 503),  # public; no Slurm read in these tests
    "/login/": (200, 302, 302, 302, 302, 302),
}
API = {
    "/api/v1/cluster/": (401, 200, 200, 200, 200, 200),
    "/api/v1/teams/": (401, 200, 200, 200, 200, 200),
    "/api/v1/teams/vision/": (401, 404, 200, 200, 200, 200),
    "/api/v1/teams/nlp/": (401, 404, 404, 404, 200, 200),
    "/api/schema/": (200, 200, 200, 200, 200, 200),
    "/api/docs/": (200, 200, 200, 200, 200, 200),
}


@pytest.mark.parametrize("url", PAGES)
@pytest.mark.parametrize("role", ROLES)
def test_page_permission_matrix(world, client_for, url, role):
    response = client_for(role).get(url)
    assert response.status_code == PAGES[url][ROLES.index(role)]
    if response.status_code == 302 and role == "anonymous":
        assert response["Location"].startswith("/login/")


@pytest.mark.parametrize("url", API)
@pytest.mark.parametrize("role", ROLES)
def test_api_permission_matrix(world, api_client_for, url, role):
    response = api_client_for(role).get(url)
    assert response.status_code == API[url][ROLES.index(role)]
    if response.status_code >= 400:
        assert set(response.json()) == {"detail", "errors"}


@pytest.mark.parametrize("role", ROLES)
def test_team_list_api_shows_exactly_the_visible_teams(world, api_client_for, role):
    response = api_client_for(role).get("/api/v1/teams/")
    if role == "anonymous":
        assert response.status_code == 401
        return
    slugs = sorted(t["slug"] for t in response.json()["results"])
    expected = {
        "outsider": [],
        "member": ["vision"],
        "manager": ["vision"],
        "admin": ["nlp", "vision"],
        "finance": ["nlp", "vision"],
    }[role]
    assert slugs == expected


@pytest.mark.parametrize("role", ROLES)
def test_token_revoke_matrix_only_the_owner_may_revoke(world, client_for, role):
    token, _ = api_token_create(user=world.alice, name="alice's")
    response = client_for(role).post(f"/account/tokens/{token.pk}/revoke/")
    expected = {"anonymous": 302, "member": 302}.get(role, 404)
    assert response.status_code == expected
    token.refresh_from_db()
    assert (token.revoked_at is not None) == (role == "member")


def test_api_errors_have_the_json_error_shape_and_get_only_endpoints_refuse_post(world, api_client_for):
    response = api_client_for("member").post("/api/v1/cluster/", {})
    assert response.status_code == 405
    assert set(response.json()) == {"detail", "errors"}
