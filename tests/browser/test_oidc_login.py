"""OpenID Connect login end to end in the browser (Debian's Chromium) against a real OpenID provider
running locally (django-oauth-toolkit in a second process, tests/oidc_provider; PKCE required
there): the login page's single sign-on button, the provider's own login page, the authorisation
code flow with PKCE (S256) back to the portal, the claims → username, e-mail, Unix user, uid/gid and
teams, the same visibility rules as for everyone, and the logout that also ends the provider's
session. A provider account named like the portal's local admin does not become that admin."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model

from portal.env import Env
from portal.identity_settings import oidc_settings, team_map
from portal.models import IdentitySource, Membership, Role
from tests.browser.helpers import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect = pytest.importorskip("playwright.sync_api").expect
User = get_user_model()
SSO = "Log in with single sign-on"


@pytest.fixture
def oidc_site(settings, oidc_provider):
    """The settings portal/project/settings.py builds from a site's environment naming this provider."""
    env = Env(oidc_provider.environment() | {"DIRECTORY_TEAM_MAP": "vision-leads=vision:manager"})
    for name, value in oidc_settings(env).items():
        setattr(settings, name, value)
    settings.DIRECTORY_TEAM_MAP = team_map(env)
    settings.AUTHENTICATION_BACKENDS = ["portal.auth_oidc.OidcBackend", "django.contrib.auth.backends.ModelBackend"]
    return oidc_provider


def _sign_in_at_the_provider(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_role("link", name=SSO).click()
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    page.get_by_label("Provider user").fill(username)
    page.get_by_label("Provider password").fill(password)
    page.get_by_role("button", name="Sign in at the provider").click()


def test_oidc_login_with_pkce_maps_the_claims_and_logout_ends_both_sessions(world, browsing, oidc_site, live_server):
    page = browsing.page()
    authorisations = []
    page.on("request", lambda request: "/o/authorize/" in request.url and authorisations.append(request.url))
    _sign_in_at_the_provider(page, "olga", "olga-provider-pw")
    page.wait_for_url(f"{live_server.url}/")
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    expect(page.get_by_role("link", name="olga")).to_be_visible()
    screenshot(page, "oidc-dashboard")

    query = parse_qs(urlsplit(authorisations[0]).query)
    assert query["response_type"] == ["code"] and query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) == 43  # base64url of a SHA-256: PKCE, as the provider requires

    olga = User.objects.get(username="olga")
    assert (olga.email, olga.has_usable_password()) == ("olga@idp.example.org", False)
    assert (olga.profile.identity_source, olga.profile.cluster_username, olga.profile.unix_uid, olga.profile.unix_gid) == (
        IdentitySource.OIDC, "olga", 25001, 25100,
    )
    assert list(Membership.objects.filter(user=olga).values_list("team__slug", "role")) == [("vision", Role.MANAGER)]

    # the same visibility rules as for every other way in
    assert page.goto("/teams/vision/").status == 200
    assert page.goto("/teams/nlp/").status == 404

    page.goto("/")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(lambda url: url.startswith(f"{live_server.url}/login/"))
    assert page.goto("/").url.startswith(f"{live_server.url}/login/")  # logged out of the portal
    # … and of the provider: single sign-on asks for the password again
    page.get_by_role("link", name=SSO).click()
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    browsing.assert_clean(allow=("/teams/nlp/",))


def test_a_provider_account_named_like_the_local_admin_is_refused(world, browsing, oidc_site, live_server):
    page = browsing.page()
    _sign_in_at_the_provider(page, "admin", "admin-provider-pw")
    page.wait_for_url(lambda url: url.startswith(f"{live_server.url}/login/"))
    expect(page.get_by_role("alert")).to_contain_text("Single sign-on did not log you in")
    world.admin.refresh_from_db()
    assert world.admin.email != "admin@idp.example.org" and world.admin.is_superuser
    assert not Membership.objects.filter(user=world.admin).exists()
    # the admin's portal password still works
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    browsing.assert_clean()
