"""Keyset pages of the job list (portal.paging, jobs.paging): every visible job exactly once, in the
list's order, forward and back, on the page and the API; a deep page runs the queries of the first."""

from __future__ import annotations

import datetime as dt
import os
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.paging import JobCursorPagination
from tests.support import output_patterns

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(world):
    """23 jobs of vision: created_at in 11 distinct instants (pairs share one: the primary key breaks
    the tie), GPUs 1-3, a third never ended (ended_at NULL); and one job of nlp (not the member's)."""
    base = timezone.now() - dt.timedelta(days=1)
    rows = []
    for i in range(23):
        job = Job.objects.create(
            team=world.vision, submitter=world.alice, name=f"j{i:02d}", script="#!/bin/bash\ntrue\n", partition="gpu",
            gpus=1 + i % 3, time_limit_minutes=5, workdir="/tmp", state=JobState.COMPLETED if i % 3 else JobState.PENDING,
            estimated_gpu_hours=1, unix_uid=os.getuid(), ended_at=base + dt.timedelta(minutes=i % 7) if i % 3 else None,
            **output_patterns("/tmp"),
        )  # fmt: skip
        Job.objects.filter(pk=job.pk).update(created_at=base + dt.timedelta(seconds=i // 2))
        rows.append(job)
    Job.objects.create(team=world.nlp, submitter=world.carol, name="other", script="#!/bin/bash\ntrue\n", partition="gpu",
                       gpus=1, time_limit_minutes=5, workdir="/tmp", estimated_gpu_hours=1, **output_patterns("/tmp"))  # fmt: skip
    return list(Job.objects.filter(team=world.vision))


def _expected(jobs, field: str, descending: bool) -> list[str]:
    """The order PostgreSQL gives (NULL the largest value), then the primary key the same way."""

    def key(job):
        value = getattr(job, field)
        return (value is None, value if value is not None else 0, job.pk)

    return [str(j.pk) for j in sorted(jobs, key=key, reverse=descending)]


def _walk_api(client, url: str) -> tuple[list[list[str]], list[list[str]]]:
    """The pages following ``next`` from ``url`` and then ``previous`` back: each a list of ids."""
    forward, body = [], client.get(url).json()
    while True:
        forward.append([r["id"] for r in body["results"]])
        if not body["next"]:
            break
        body = client.get(body["next"]).json()
    backward = [forward[-1]]
    while body["previous"]:
        body = client.get(body["previous"]).json()
        backward.append([r["id"] for r in body["results"]])
    return forward, backward


@pytest.mark.parametrize(
    "ordering", ["", "-created_at", "created_at", "gpus", "-gpus", "ended_at", "-ended_at", "name"]
)
def test_the_api_walks_every_visible_job_once_in_order_forward_and_back(
    api_client_for, jobs, monkeypatch, ordering
):
    monkeypatch.setattr(JobCursorPagination, "page_size", 5)
    client = api_client_for("member")
    forward, backward = _walk_api(
        client, f"/api/v1/jobs/?ordering={ordering}" if ordering else "/api/v1/jobs/"
    )
    field = {"": "created_at", "name": "name"}.get(ordering, ordering.lstrip("-"))
    descending = ordering.startswith("-") or ordering == ""
    assert [i for page in forward for i in page] == _expected(jobs, field, descending)
    assert [len(page) for page in forward] == [5, 5, 5, 5, 3]
    assert backward == forward[::-1]  # the previous links give the same pages back


def test_the_api_page_keeps_its_filters_in_the_links_and_never_widens_visibility(
    api_client_for, jobs, monkeypatch
):
    monkeypatch.setattr(JobCursorPagination, "page_size", 3)
    client = api_client_for("member")
    body = client.get("/api/v1/jobs/?state=ended&ordering=-gpus").json()
    query = parse_qs(urlsplit(body["next"]).query)
    assert query["state"] == ["ended"] and query["ordering"] == ["-gpus"] and "cursor" in query
    forward, _ = _walk_api(client, "/api/v1/jobs/?state=ended&ordering=-gpus")
    ended = [j for j in jobs if j.state == JobState.COMPLETED]
    assert [i for page in forward for i in page] == _expected(ended, "gpus", True)
    # a cursor taken from the member's list shows the outsider nothing
    assert api_client_for("outsider").get(body["next"]).json()["results"] == []


@pytest.mark.parametrize("cursor", ["nonsense", "W10", "WyJ4IiwxLDJd", "WyJuIiwibm90IGEgZGF0ZSIsIngiXQ"])
def test_a_cursor_that_is_not_one_is_a_400_naming_it(api_client_for, jobs, cursor):
    response = api_client_for("member").get(f"/api/v1/jobs/?cursor={cursor}")
    assert response.status_code == 400
    assert set(response.json()) == {"detail", "errors"} and "cursor" in response.json()["errors"]


def test_a_deep_api_page_runs_the_queries_of_the_first(api_client_for, jobs, monkeypatch):
    from django.db import connection

    statements = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    monkeypatch.setattr(JobCursorPagination, "page_size", 2)
    client = api_client_for("member")
    with connection.execute_wrapper(record):
        body = client.get("/api/v1/jobs/").json()
    first = list(statements)
    for _ in range(6):
        body = client.get(body["next"]).json()
    statements.clear()
    with connection.execute_wrapper(record):
        assert len(client.get(body["next"]).json()["results"]) == 2
    assert len(statements) == len(first) and first
    assert not any("OFFSET" in sql or "COUNT(" in sql for sql in first + statements)


def test_the_list_page_walks_older_and_newer_links(client_for, jobs, monkeypatch):
    monkeypatch.setattr("jobs.views.JOBS_PER_PAGE", 10)
    client = client_for("member")
    seen, response = [], client.get(reverse("jobs:list"))
    pages = 0
    while True:
        pages += 1
        seen += [str(j.pk) for j in response.context["jobs"]]
        older = response.context["older_query"]
        if older is None:
            break
        assert f'href="{older}"'.replace("&", "&amp;") in response.content.decode()
        response = client.get(reverse("jobs:list") + older)
    assert seen == _expected(jobs, "created_at", True) and pages == 3
    newer = client.get(reverse("jobs:list") + response.context["newer_query"])
    assert [str(j.pk) for j in newer.context["jobs"]] == seen[10:20]


def test_the_list_page_shows_the_first_page_for_a_link_that_is_not_valid(client_for, jobs):
    response = client_for("member").get(reverse("jobs:list"), {"cursor": "nonsense"})
    assert response.status_code == 200
    assert [str(j.pk) for j in response.context["jobs"]] == _expected(jobs, "created_at", True)[:25]


def test_an_empty_cursor_is_the_first_page_as_the_schema_says(api_client_for, jobs, monkeypatch):
    monkeypatch.setattr(JobCursorPagination, "page_size", 5)
    client = api_client_for("member")
    assert client.get("/api/v1/jobs/?cursor=").json() == client.get("/api/v1/jobs/").json()
