"""Issue 42 (the site test's finding): a request the database or Redis cannot serve — a server that
has become read-only (a primary being demoted, a standby), a Redis that does not answer — answers 503
with Retry-After, the API's JSON envelope or a page, never a 500: the CLI and API clients retry a 503
(a keyed POST included), and nothing was written. Real PostgreSQL (its own read-only transactions,
the error a standby gives) and a real closed port for Redis."""

from __future__ import annotations

import socket

import pytest
from django.db import connection
from rest_framework.test import APIClient

from jobs.models import Job
from portal.exceptions import FAILOVER_RETRY_AFTER_SECONDS
from tests.support import job_payload

pytestmark = pytest.mark.django_db(transaction=True)


def _read_only(on: bool) -> None:
    """The session's transactions read-only from now on (or no longer), as on a standby: every write
    fails with SQLSTATE 25006 ("cannot execute INSERT in a read-only transaction")."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION {'READ ONLY' if on else 'READ WRITE'}")


@pytest.fixture
def read_only_database():
    """Call it to make the database read-only; read-write again at the end (the test's flush writes)."""
    yield lambda: _read_only(True)
    _read_only(False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once closed


def test_an_api_post_on_a_read_only_database_answers_503_with_retry_after(world, inventory, relays, read_only_database):
    client = APIClient()
    client.force_authenticate(world.alice)
    read_only_database()
    response = client.post("/api/v1/jobs/", job_payload(name="failover"), format="json", HTTP_IDEMPOTENCY_KEY="k-503")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == str(FAILOVER_RETRY_AFTER_SECONDS)
    body = response.json()
    assert set(body) == {"detail", "errors"} and "retry" in body["detail"]
    _read_only(False)
    assert not Job.objects.filter(name="failover").exists()  # nothing half-written
    # the same keyed POST again, once the database writes: one job
    again = client.post("/api/v1/jobs/", job_payload(name="failover"), format="json", HTTP_IDEMPOTENCY_KEY="k-503")
    assert again.status_code == 201 and Job.objects.filter(name="failover").count() == 1


def test_a_page_post_on_a_read_only_database_answers_a_503_page(world, inventory, relays, client_for, read_only_database):
    member = client_for("member")
    read_only_database()
    response = member.post("/jobs/new/", {"team": "vision", "name": "x", "script": "true", "gpus": "1"})
    assert response.status_code == 503 and response["Retry-After"] == str(FAILOVER_RETRY_AFTER_SECONDS)
    assert "switching servers" in response.content.decode()


def test_a_database_that_refuses_connections_before_any_view_is_a_503_too(world):
    """The database host gone (a primary killed, the standby not promoted yet): the first query of a
    page is a middleware's (the user's time zone, before any view), outside process_exception —
    Django's handler500 (portal.exceptions.server_error) answers 503 too. Real PostgreSQL on a port
    where nothing listens."""
    from django.test import Client

    member = Client(raise_request_exception=False)  # as a server answers: the handler's response
    member.force_login(world.alice)
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(_closed_port())
    try:
        response = member.get("/jobs/")
        api = member.get("/api/v1/jobs/")
    finally:
        connection.close()
        connection.settings_dict["PORT"] = port
    assert response.status_code == 503 and response["Retry-After"] == str(FAILOVER_RETRY_AFTER_SECONDS)
    assert "switching servers" in response.content.decode()
    assert api.status_code == 503 and set(api.json()) == {"detail", "errors"} and api["Retry-After"]


def test_an_api_post_while_redis_does_not_answer_answers_503(world, inventory, relays, settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{_closed_port()}/1"}}  # fmt: skip
    client = APIClient()
    client.force_authenticate(world.alice)
    response = client.post("/api/v1/jobs/", job_payload(name="no-redis"), format="json")
    assert response.status_code == 503 and response["Retry-After"] == str(FAILOVER_RETRY_AFTER_SECONDS)
    assert set(response.json()) == {"detail", "errors"}


def test_a_programming_error_is_still_a_500(world):
    from portal.exceptions import backend_unavailable

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
    except Exception as exc:  # noqa: BLE001 — the real error PostgreSQL gives
        assert not backend_unavailable(exc)
    else:
        raise AssertionError("the query should have failed")
