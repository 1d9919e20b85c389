"""Personal API tokens: created on a page (shown once), stored hashed, revocable, usable as
``Authorization: Token <key>``; ``create_api_token`` prints one for automation."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from portal.models import ApiToken
from portal.services import api_token_create

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
