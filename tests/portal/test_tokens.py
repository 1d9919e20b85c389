"""Personal API tokens: created on a page (shown once), stored hashed, revocable, usable as
``Authorization: Token <key>``; ``create_api_token`` prints one for automation."""

from __future__ import annotations

import io
import time
from unittest import mock

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from portal.models import ApiToken
from portal.services import api_token_create, api_token_revoke

pytestmark = pytest.mark.django_db


def test_token_page_creates_a_token_shown_once_and_stores_only_its_hash(world, client_for):
    client = client_for("member")
    response = client.post("/account/tokens/", {"name": "laptop"})
    assert response.status_code == 200
    key = response.context["new_key"]
    assert key.startswith("gpp_") and key in response.content.decode()
    token = ApiToken.objects.get(user=world.alice, name="laptop")
    assert token.key_hash == ApiToken.hash_key(key)
    assert key not in {token.key_hash, token.prefix, token.name}
    # Shown once: the next visit lists the token but not the key.
    again = client.get("/account/tokens/")
    assert key not in again.content.decode()
    assert "laptop" in again.content.decode()


def test_token_without_name_is_refused_with_a_message(world, client_for):
    response = client_for("member").post("/account/tokens/", {"name": "  "}, follow=True)
    assert ApiToken.objects.filter(user=world.alice).count() == 0
    assert "Give the token a name." in response.content.decode()


def test_api_accepts_a_token_and_refuses_it_after_revocation(world, client_for):
    token, key = api_token_create(user=world.alice, name="script")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    ok = api.get("/api/v1/teams/")
    assert ok.status_code == 200
    assert [t["slug"] for t in ok.json()["results"]] == ["vision"]

    revoke = client_for("member").post(f"/account/tokens/{token.pk}/revoke/")
    assert revoke.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    refused = api.get("/api/v1/teams/")
    assert refused.status_code == 401
    assert refused.json()["detail"] == "Invalid or revoked API token."


def test_a_user_cannot_revoke_someone_elses_token(world, client_for):
    token, _ = api_token_create(user=world.bob, name="bob's")
    response = client_for("member").post(f"/account/tokens/{token.pk}/revoke/")
    assert response.status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_create_api_token_command_prints_a_working_token(world):
    out = io.StringIO()
    call_command("create_api_token", "carol", stdout=out)
    key = out.getvalue().strip()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    response = api.get("/api/v1/teams/")
    assert response.status_code == 200
    assert [t["slug"] for t in response.json()["results"]] == ["nlp"]


def test_garbage_token_gets_401_in_the_json_error_shape(world):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Token nope")
    response = api.get("/api/v1/cluster/")
    assert response.status_code == 401
    assert set(response.json()) == {"detail", "errors"}


# ---------------------------------------------------------------- expiry


def test_a_token_with_an_expiry_works_until_then_and_is_refused_after(world):
    import datetime as dt

    from django.utils import timezone

    token, key = api_token_create(user=world.alice, name="ci", expires_in_days=7)
    assert abs(token.expires_at - (timezone.now() + dt.timedelta(days=7))) < dt.timedelta(minutes=1)
    client = APIClient()
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    # the lookup is cached now (portal/authentication.py); expiry is checked on every request anyway
    later = token.expires_at + dt.timedelta(seconds=1)
    with mock.patch("portal.authentication.timezone.now", return_value=later):
        refused = client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}")
    assert refused.status_code == 401
    assert set(refused.json()) == {"detail", "errors"} and "expired" in refused.json()["detail"]


def test_a_cached_token_costs_no_query_and_no_write(world, settings, django_assert_num_queries):
    # a cache of this test's own: other test runs on the machine flush the shared Redis cache database
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "tok"}}
    from portal.authentication import ApiTokenAuthentication

    token, key = api_token_create(user=world.alice, name="ci")
    auth = ApiTokenAuthentication()
    with django_assert_num_queries(2):  # the lookup, and last_used_at (first use)
        user, _ = auth.authenticate_credentials(key)
    assert user == world.alice
    with django_assert_num_queries(0):
        user, cached = auth.authenticate_credentials(key)
    assert user == world.alice and cached.pk == token.pk


def test_revoking_a_cached_token_takes_effect_at_once(world):
    from django.db import transaction

    token, key = api_token_create(user=world.alice, name="ci")
    client = APIClient()
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    with transaction.atomic():
        api_token_revoke(token=token)
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401


def test_a_user_made_inactive_is_refused_once_the_cached_lookup_expires(world, settings):
    token, key = api_token_create(user=world.alice, name="ci")
    client = APIClient()
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    type(world.alice).objects.filter(pk=world.alice.pk).update(is_active=False)
    # cached for API_TOKEN_CACHE_SECONDS (30 s by default): what the cache holds is still accepted…
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    from django.core.cache import cache

    from portal.authentication import _cache_key

    # … until the entry expires: in the cache and in the process's memo (30 s later)
    cache.delete(_cache_key(token.key_hash))
    later = time.time() + settings.API_TOKEN_CACHE_SECONDS + 1
    with mock.patch("portal.authentication.time.time", return_value=later):
        assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    settings.API_TOKEN_CACHE_SECONDS = 0  # 0: looked up on every request
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401


def test_the_token_page_sets_an_expiry_and_shows_it(world, client_for):
    client = client_for("member")
    response = client.post("/account/tokens/", {"name": "cluster-cron", "expires_in_days": "30"})
    assert response.status_code == 200 and response.context["new_key"]
    token = ApiToken.objects.get(user=world.alice, name="cluster-cron")
    assert token.expires_at is not None
    assert token.expires_at.strftime("%Y-%m-%d") in response.content.decode()
    for bad in ("0", "abc", "4000"):
        page = client.post("/account/tokens/", {"name": f"bad-{bad}", "expires_in_days": bad})
        assert "lifetime is out of range" in page.content.decode()
    assert not ApiToken.objects.filter(name__startswith="bad-").exists()


def test_api_token_max_days_caps_every_token(world, settings):
    settings.API_TOKEN_MAX_DAYS = 90
    token, _ = api_token_create(user=world.alice, name="default")
    assert token.expires_at is not None and (token.expires_at - token.created_at).days in (89, 90)
    from portal.exceptions import ApplicationError

    with pytest.raises(ApplicationError, match="out of range") as refused:
        api_token_create(user=world.alice, name="long", expires_in_days=365)
    assert refused.value.errors == {"expires_in_days": ["From 1 to 90 days."]}


def test_create_api_token_takes_a_lifetime(world):
    out = io.StringIO()
    call_command("create_api_token", "alice", "--name", "robot", "--days", "2", stdout=out)
    token = ApiToken.objects.get(user=world.alice, name="robot")
    assert token.expires_at is not None and ApiToken.hash_key(out.getvalue().strip()) == token.key_hash


def test_expired_tokens_do_not_count_against_the_limit_of_active_ones(world):
    import datetime as dt

    from django.utils import timezone

    for i in range(50):
        api_token_create(user=world.alice, name=f"t{i}", expires_in_days=1)
    ApiToken.objects.filter(user=world.alice).update(expires_at=timezone.now() - dt.timedelta(days=1))
    api_token_create(user=world.alice, name="fresh")  # 50 expired ones: not "too many active tokens"
