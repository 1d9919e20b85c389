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
