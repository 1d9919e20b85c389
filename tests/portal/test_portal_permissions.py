"""The permission matrix for the portal app's pages and endpoints: anonymous, outsider, member,
manager, admin, finance (roles relative to team vision)."""

from __future__ import annotations

import pytest

from portal.services import api_token_create

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")

# Teams: pages and API show a team by one visibility rule (portal.selectors.teams_visible_to), so
# both are checked against one table: path under /teams/ → status per signed-in role (ROLES[1:]);
# the anonymous column is the way in each side asks for a login (302 to /login/, 401).
TEAMS_SIGNED_IN = {
    "": (200, 200, 200, 200, 200),
    "vision/": (404, 200, 200, 200, 200),
    "nlp/": (404, 404, 404, 200, 200),
}

# url → expected status per role, in ROLES order
PAGES = {
    "/": (302, 200, 200, 200, 200, 200),
    "/partials/cluster/": (302, 200, 200, 200, 200, 200),
    **{f"/teams/{path}": (302, *codes) for path, codes in TEAMS_SIGNED_IN.items()},
    "/account/tokens/": (302, 200, 200, 200, 200, 200),
    "/healthz": (503, 503, 503, 503, 503, 503),  # public; no Slurm read in these tests
    "/livez": (200, 200, 200, 200, 200, 200),  # public: the process answers (the load balancer's check)
    "/login/": (200, 302, 302, 302, 302, 302),
}
API = {
    "/api/v1/cluster/": (401, 200, 200, 200, 200, 200),
    **{f"/api/v1/teams/{path}": (401, *codes) for path, codes in TEAMS_SIGNED_IN.items()},
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
