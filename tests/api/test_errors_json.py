"""Everything under /api/ answers JSON ``{"detail", "errors"}`` — unknown paths, malformed ids, wrong
methods, unsupported media types and unhandled exceptions — with DEBUG on and off
(portal.middleware.ApiErrorMiddleware and the DRF exception handler). Pages keep plain error pages."""

from __future__ import annotations

import logging
import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture(params=[True, False], ids=["debug-on", "debug-off"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


def assert_envelope(response, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), (response["Content-Type"], response.content[:300])
    body = response.json()
    assert set(body) == {"detail", "errors"} and isinstance(body["detail"], str) and isinstance(body["errors"], dict), body
    assert "Traceback" not in response.content.decode()
    return body


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/no-such-thing/",
        "/api/nothing",
        "/api/v1/jobs/not-a-uuid/",
        "/api/v1/jobs/not-a-uuid/output/",
        "/api/v1/job-templates/null,null/",
        "/api/v1/quotas/-1/approve/",
        "/api/v1/bookings/1/cancel/",
    ],
)
def test_unknown_paths_and_malformed_ids_answer_json_404(debug, api_client_for, path):
    body = assert_envelope(api_client_for("member").get(path), 404)
    assert body["detail"] == "Not found."
    # the same without credentials: the URL does not resolve before authentication is asked for
    assert_envelope(Client().post(path, data="{}", content_type="application/json"), 404)


def test_a_wrong_method_answers_json_405_with_allow(debug, api_client_for):
    response = api_client_for("member").put("/api/v1/cluster/", {}, format="json")
    body = assert_envelope(response, 405)
    assert "PUT" in body["detail"] and response["Allow"].startswith("GET")
    assert_envelope(api_client_for("member").delete("/api/v1/jobs/"), 405)


def test_an_unsupported_media_type_answers_json_415(debug, api_client_for):
    response = api_client_for("member").post("/api/v1/jobs/", data="team=vision", content_type="text/plain")
    body = assert_envelope(response, 415)
    assert "text/plain" in body["detail"]


def test_malformed_json_answers_json_400(debug, api_client_for):
    response = api_client_for("member").post("/api/v1/jobs/", data="{not json", content_type="application/json")
    assert "JSON parse error" in assert_envelope(response, 400)["detail"]


def test_an_unhandled_exception_answers_json_500_with_the_id_that_is_logged(debug, api_client_for, monkeypatch, caplog):
    from portal import apis

    def broken():
        raise RuntimeError("the cluster summary broke")

    monkeypatch.setattr(apis, "cluster_summary", broken)
    client = api_client_for("member")
    client.raise_request_exception = False
    with caplog.at_level(logging.ERROR, logger="portal.errors"):
        response = client.get("/api/v1/cluster/")
    body = assert_envelope(response, 500)
    match = re.fullmatch(r"Internal error \(id ([0-9a-f]{12})\)\.", body["detail"])
    assert match and body["errors"] == {}, body
    assert "the cluster summary broke" not in response.content.decode()
    error_id = match.group(1)
    assert response["X-Error-Id"] == error_id
    [record] = [r for r in caplog.records if error_id in r.getMessage()]
    assert "GET /api/v1/cluster/" in record.getMessage()
    assert record.exc_info and "the cluster summary broke" in str(record.exc_info[1])


def test_an_exception_in_a_middleware_answers_json_500_too(debug, api_client_for, monkeypatch, caplog):
    """Outside any view (here the time-zone middleware): Django turns it into its 500 (the debug
    page with DEBUG on); the outermost middleware answers the API's JSON instead."""
    from portal import middleware

    def broken(*args, **kwargs):
        raise RuntimeError("the time zone broke")

    monkeypatch.setattr(middleware.timezone, "deactivate", broken)
    client = api_client_for("member")
    client.raise_request_exception = False
    with caplog.at_level(logging.ERROR, logger="portal.errors"):
        response = client.get("/api/v1/teams/")
    body = assert_envelope(response, 500)
    error_id = re.fullmatch(r"Internal error \(id ([0-9a-f]{12})\)\.", body["detail"]).group(1)
    assert any(error_id in r.getMessage() for r in caplog.records)


def test_pages_keep_a_plain_error_page(settings, client_for, monkeypatch):
    from portal.project import views

    settings.DEBUG = False
    monkeypatch.setattr(views, "cluster_summary", lambda: 1 / 0)
    client = client_for("member")
    client.raise_request_exception = False
    response = client.get("/")
    assert response.status_code == 500 and response["Content-Type"].startswith("text/html")
    assert "ZeroDivisionError" not in response.content.decode() and "Traceback" not in response.content.decode()
    missing = client.get("/jobs/not-a-uuid/")
    assert missing.status_code == 404 and missing["Content-Type"].startswith("text/html")


def test_errors_of_drf_views_keep_their_json_and_headers(debug, api_client_for):
    """The middleware leaves JSON answers alone: a 401 keeps WWW-Authenticate, a 403 its message."""
    anonymous = api_client_for("anonymous").get("/api/v1/jobs/")
    assert_envelope(anonymous, 401)
    assert anonymous["WWW-Authenticate"].startswith("Token")
    body = assert_envelope(api_client_for("member").get("/api/v1/reports/cost/"), 403)
    assert body["detail"] == "Cost reports are for admins and finance."
