"""Client addresses behind the reverse proxy (TRUSTED_PROXIES): throttles and the audit trail use the
real client address — the right end of X-Forwarded-For past the trusted hops — so a client that
rotates a fake X-Forwarded-For keeps its throttle bucket, and one that talks to the portal directly
cannot choose its address at all."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

from portal.models import AuditEvent
from portal.proxies import client_address
from tests.security.test_security import api_as, low_rates  # noqa: F401 (low_rates: a fixture)
from tests.security.test_url_matrix import make_job
from tests.support import job_payload

pytestmark = pytest.mark.django_db
NGINX = "127.0.0.1"


@pytest.mark.parametrize(
    ("trusted", "remote", "forwarded", "client"),
    [
        ([], "127.0.0.1", "203.0.113.5", "127.0.0.1"),  # no trusted proxy: the header means nothing
        (["127.0.0.1"], "198.51.100.2", "203.0.113.5", "198.51.100.2"),  # not from the proxy: ignored
        (["127.0.0.1"], "127.0.0.1", "203.0.113.5", "203.0.113.5"),
        (["127.0.0.1"], "127.0.0.1", "6.6.6.6, 203.0.113.5", "203.0.113.5"),  # a client's fake entry is left of it
        (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", "6.6.6.6, 203.0.113.5, 10.1.2.3", "203.0.113.5"),  # two proxies
        (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", "10.9.9.9, 10.1.2.3", "10.9.9.9"),  # all hops trusted
        (["127.0.0.1"], "127.0.0.1", "not-an-ip", "127.0.0.1"),
        (["127.0.0.1"], "127.0.0.1", "", "127.0.0.1"),
        (["127.0.0.1"], "::ffff:127.0.0.1", "2001:db8::7", "2001:db8::7"),  # dual-stack socket
    ],
)
def test_client_address_reads_x_forwarded_for_from_the_right(settings, trusted, remote, forwarded, client):
    settings.TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == client


def _login_from(forwarded: str) -> int:
    return Client(REMOTE_ADDR=NGINX).post(
        "/login/", {"username": "alice", "password": "wrong"}, HTTP_X_FORWARDED_FOR=forwarded
    ).status_code


def test_rotating_x_forwarded_for_behind_nginx_is_still_throttled(world, settings, low_rates):  # noqa: F811
    settings.TRUSTED_PROXIES = [NGINX]
    # nginx's $proxy_add_x_forwarded_for: "<what the client sent>, <the client's real address>"
    statuses = [_login_from(f"10.{i}.{i}.{i}, 203.0.113.5") for i in range(5)]
    assert statuses == [200, 200, 200, 429, 429]
    assert _login_from("203.0.113.6") == 200  # another real client has its own bucket


def test_rotating_x_forwarded_for_without_a_proxy_is_still_throttled(world, settings, low_rates):  # noqa: F811
    settings.TRUSTED_PROXIES = []
    statuses = [_login_from(f"10.{i}.{i}.{i}") for i in range(4)]
    assert statuses == [200, 200, 200, 429]


def test_api_submissions_are_throttled_per_user_whatever_the_header(world, settings, low_rates, relays):  # noqa: F811
    settings.TRUSTED_PROXIES = [NGINX]
    client = api_as(world.alice)
    statuses = [
        client.post("/api/v1/jobs/", job_payload(gpus=0), format="json", REMOTE_ADDR=NGINX,
                    HTTP_X_FORWARDED_FOR=f"10.0.0.{i}").status_code  # fmt: skip
        for i in range(3)
    ]
    assert statuses == [400, 400, 429]


def test_the_audit_trail_records_the_client_behind_the_proxy(world, settings):
    settings.TRUSTED_PROXIES = [NGINX]
    job = make_job(world.vision, world.alice)
    page = Client(REMOTE_ADDR=NGINX, HTTP_X_FORWARDED_FOR="6.6.6.6, 192.0.2.44")
    page.force_login(world.bob)
    assert page.post(f"/jobs/{job.pk}/cancel/").status_code == 302
    assert list(AuditEvent.objects.values_list("actor_name", "action", "address")) == [("bob", "job.cancel", "192.0.2.44")]
