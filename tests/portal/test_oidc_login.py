"""OpenID Connect settings and URLs without a browser (the flow itself: tests/browser/test_oidc_login.py):
the environment turns the backend and the URLs on; the login request carries PKCE (S256), state and
nonce; a callback that does not belong to a login started here fails back to the login page; bad
settings stop start-up."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from portal.env import Env
from portal.identity_settings import oidc_settings
from tests.conftest import OidcProvider

pytestmark = pytest.mark.django_db
PROVIDER = OidcProvider(9)  # its environment only: nothing is asked of it here


@pytest.fixture
def oidc_on(settings):
    for name, value in oidc_settings(Env(PROVIDER.environment())).items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = ["portal.auth_oidc.OidcBackend", "django.contrib.auth.backends.ModelBackend"]


def test_the_login_page_offers_single_sign_on_only_when_configured(world, settings):
    assert "single sign-on" not in Client().get("/login/").content.decode()
    for name, value in oidc_settings(Env(PROVIDER.environment() | {"OIDC_LOGIN_LABEL": "Log in with CAS-ID"})).items():
        setattr(settings, name, value)
    assert 'href="/oidc/authenticate/"' in Client().get("/login/").content.decode()
    assert "Log in with CAS-ID" in Client().get("/login/").content.decode()


@pytest.mark.parametrize("role", ["anonymous", "member", "admin"])
def test_the_login_request_goes_to_the_provider_with_pkce(world, oidc_on, role):
    client = Client()
    if (user := world.user_for(role)) is not None:
        client.force_login(user)
    response = client.get("/oidc/authenticate/")
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == f"{PROVIDER.url}/o/authorize/"
    query = parse_qs(target.query)
    assert query["client_id"] == [PROVIDER.CLIENT_ID] and query["redirect_uri"] == ["http://testserver/oidc/callback/"]
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["scope"] == ["openid email profile"] and query["state"] and query["nonce"]


def test_a_callback_without_a_login_started_here_fails_to_the_login_page(world, oidc_on):
    client = Client()
    response = client.get("/oidc/callback/?code=stolen&state=guessed")
    assert (response.status_code, response["Location"]) == (302, "/login/?sso=failed")
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OIDC_RP_CLIENT_ID": "x"}, "OIDC_OP_AUTHORIZATION_ENDPOINT=''"),
        (PROVIDER.environment() | {"OIDC_OP_TOKEN_ENDPOINT": "ftp://idp/token"}, "OIDC_OP_TOKEN_ENDPOINT="),
        (PROVIDER.environment() | {"OIDC_RP_SIGN_ALGO": "none"}, "OIDC_RP_SIGN_ALGO="),
        ({k: v for k, v in PROVIDER.environment().items() if k != "OIDC_RP_CLIENT_SECRET"}
         | {"OIDC_RP_CLIENT_SECRET_FILE": "/nonexistent"}, "OIDC_RP_CLIENT_SECRET_FILE="),  # fmt: skip
    ],
)
def test_bad_oidc_settings_stop_start_up(env, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        oidc_settings(Env(env))


def test_the_site_environment_turns_the_oidc_backend_on():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = "import django; django.setup(); from django.conf import settings as s; print(s.AUTHENTICATION_BACKENDS, s.OIDC_USE_PKCE)"
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "portal.project.settings"} | PROVIDER.environment()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.stdout.strip() == "['portal.auth_oidc.OidcBackend', 'django.contrib.auth.backends.ModelBackend'] True", result.stderr
