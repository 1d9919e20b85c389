"""Races through the real HTTP stack (live server, one thread and one database connection per
client). Budget and booking races belong to the quotas/bookings tests (tests/accounting/)."""

from __future__ import annotations

import threading

import pytest
import requests

from jobs.models import Job
from portal.models import AuditEvent
from portal.services import api_token_create
from tests.support import job_payload

CLIENTS = 20


@pytest.mark.django_db(transaction=True)
def test_twenty_clients_racing_one_idempotency_key_create_exactly_one_job(world, inventory_small, relays, live_server):
    _, key = api_token_create(user=world.alice, name="race")
    body = job_payload(gpus=1)
    barrier = threading.Barrier(CLIENTS)
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def client():
        session = requests.Session()
        headers = {"Authorization": f"Token {key}", "Idempotency-Key": "race-1"}
        barrier.wait()
        response = session.post(f"{live_server.url}/api/v1/jobs/", json=body, headers=headers, timeout=60)
        with lock:
            results.append((response.status_code, response.json()))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    statuses = sorted(status for status, _ in results)
    assert len(results) == CLIENTS
    assert statuses == [200] * (CLIENTS - 1) + [201], statuses
    assert len({data["id"] for _, data in results}) == 1
    assert Job.objects.count() == 1
    job = Job.objects.get()
    assert relays["drain"] == [None]  # one relay (drain) enqueued
    assert AuditEvent.objects.filter(action="job.submit").count() == 1

    # the same key with a different body is a conflict, in the JSON error shape
    response = requests.post(
        f"{live_server.url}/api/v1/jobs/", json=job_payload(gpus=2),
        headers={"Authorization": f"Token {key}", "Idempotency-Key": "race-1"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 409 and set(response.json()) == {"detail", "errors"}
