"""/healthz reports database, broker and Slurm (as the workers last saw it)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from portal.services import sync_record_failure, sync_record_success

pytestmark = pytest.mark.django_db


def test_healthz_is_200_when_database_broker_and_a_recent_slurm_read_answer(client):
    sync_record_success("cluster")
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["failing"] == []
    assert {k: v["ok"] for k, v in body["checks"].items()} == {"database": True, "broker": True, "slurm": True}


def test_healthz_is_503_naming_slurm_when_the_last_read_failed(client):
    sync_record_success("cluster", at=timezone.now() - dt.timedelta(seconds=40))
    sync_record_failure("cluster", error="Unable to contact slurm controller (connect failure)")
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["slurm"]
    assert "Unable to contact slurm controller" in body["checks"]["slurm"]["error"]
    assert body["checks"]["slurm"]["failing_since"]


def test_healthz_is_503_naming_slurm_when_never_read_or_too_old(client, settings):
    assert client.get("/healthz").json()["failing"] == ["slurm"]
    sync_record_success("cluster", at=timezone.now() - dt.timedelta(seconds=settings.SLURM_HEALTH_MAX_AGE + 5))
    body = client.get("/healthz").json()
    assert body["failing"] == ["slurm"]
    assert "s ago" in body["checks"]["slurm"]["error"]


def test_healthz_is_503_naming_the_broker_when_it_does_not_answer(client, settings):
    sync_record_success("cluster")
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["broker"]


def test_healthz_says_when_the_accounting_rollup_is_stale_without_failing(client, use_gateway, world):
    """The periodic roll-up check (accounting.tasks.rollup_check_task) recorded slurmdbd 3 h behind:
    /healthz still answers 200 (the cluster runs jobs) and names the stale roll-up in the detail."""
    from accounting.services import rollup_record
    from accounting.tasks import rollup_check_task
    from tests.fakes import FakeGateway

    hour = timezone.now().astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    gateway = use_gateway(FakeGateway())
    gateway.rolled_up_to = hour
    sync_record_success("cluster")
    assert rollup_check_task.delay().get() == hour.isoformat()
    cluster = client.get("/healthz").json()["checks"]["slurm"]["clusters"]["gpuportal"]
    assert cluster["accounting_rollup"]["rolled_up_to"] == hour.isoformat()
    assert cluster["accounting_rollup"]["stale"] is False and "warnings" not in cluster

    gateway.rolled_up_to = hour - dt.timedelta(hours=3)
    rollup_record()
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"
    cluster = response.json()["checks"]["slurm"]["clusters"]["gpuportal"]
    expected = f"sreport has not rolled up since {hour - dt.timedelta(hours=3):%Y-%m-%d %H:%M} UTC on cluster gpuportal"
    assert cluster["accounting_rollup"]["stale"] is True and cluster["warnings"] == [expected]


def test_healthz_before_any_rollup_check(client):
    sync_record_success("cluster")
    cluster = client.get("/healthz").json()["checks"]["slurm"]["clusters"]["gpuportal"]
    assert cluster["accounting_rollup"] == {
        "rolled_up_to": None, "checked_at": None, "stale": False,
        "message": "the accounting roll-up has not been checked yet",
    }  # fmt: skip


def test_livez_answers_200_without_the_database_or_redis(client, settings, django_assert_num_queries):
    """What the load balancer checks (docs/deploy.md, "A site with failover"): the process answers,
    whatever the shared backends do — with the broker and the cache on a port where nothing listens,
    /healthz says 503 and /livez 200, with no query."""
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": ["redis://127.0.0.1:1/0"]}}
    assert client.get("/healthz").status_code == 503
    with django_assert_num_queries(0):
        response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]
