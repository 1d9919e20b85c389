"""How the CLI speaks HTTP, against the stand-in API (it can script what the real portal never
answers: a redirect to another origin, an HTML 200, a 429 with an HTTP-date Retry-After, a server
that counts TCP connections). The same behaviours against the real portal: test_cli_live_portal.py."""

from __future__ import annotations

import email.utils
import time

import pytest

from gpuportal_cli import client as cli_client
from gpuportal_cli.client import ApiError, Client, retry_after_seconds
from gpuportal_cli.main import main
from tests.cli.conftest import FakeApi
from tests.support import wait_for

JOB_ID = "3f1c2e9a-1111-4222-8333-944455556666"
JOB_PATH = f"/api/v1/jobs/{JOB_ID}/"
TEAMS_PAGE = {"count": 1, "next": None, "previous": None, "results": [{"slug": "vision", "name": "Vision"}]}


@pytest.fixture
def other_origin():
    """A second server: another port is another origin."""
    api = FakeApi()
    yield api
    api.close()


@pytest.fixture
def sleeps(monkeypatch):
    """The waits the client asks for, recorded instead of slept."""
    recorded: list[float] = []
    monkeypatch.setattr(cli_client.time, "sleep", recorded.append)
    return recorded


def _job(state):
    return {"id": JOB_ID, "name": "train", "team": "vision", "state": state, "slurm_job_id": 7, "gpus": 1}


def test_logs_follow_polls_over_one_kept_alive_connection(fake_api, capsys):
    out_path = JOB_PATH + "output/"
    for data, start in (("one\n", 0), ("two\n", 4), ("", 8), ("", 8)):
        fake_api.add("GET", out_path, 200, {"data": data, "offset": start, "next_offset": start + len(data), "eof": True, "message": ""})
    for state in ("RUNNING", "RUNNING", "COMPLETED"):
        fake_api.add("GET", JOB_PATH, 200, _job(state))

    assert main(["logs", JOB_ID, "--follow", "--poll-interval", "0.01"]) == 0

    assert capsys.readouterr().out == "one\ntwo\n"
    assert len(fake_api.requests) >= 6
    assert fake_api.connections == 1


def test_a_redirected_post_is_not_followed_and_nothing_else_is_sent(fake_api, tmp_path, capsys):
    fake_api.add("POST", "/api/v1/jobs/", 301, {"detail": "moved"}, headers={"Location": "/api/v2/jobs/"})
    fake_api.add("GET", "/api/v2/jobs/", 200, TEAMS_PAGE)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH --time=5\nhostname\n")

    assert main(["submit", str(script), "--team", "vision"]) == 69

    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"POST {fake_api.url}/api/v1/jobs/ was redirected (301) to {fake_api.url}/api/v2/jobs/; not followed" in err
    assert [(r["method"], r["path"]) for r in fake_api.requests] == [("POST", "/api/v1/jobs/")]


def test_a_get_redirect_to_another_origin_is_refused_and_the_token_stays_home(fake_api, other_origin, capsys):
    other_origin.add("GET", "/api/v1/teams/", 200, TEAMS_PAGE)
    fake_api.add("GET", "/api/v1/teams/", 302, None, headers={"Location": other_origin.url + "/api/v1/teams/"})

    assert main(["teams"]) == 69

    err = capsys.readouterr().err
    assert "another origin; not followed" in err and other_origin.url in err
    assert other_origin.requests == []


def test_a_get_redirect_within_the_origin_is_followed_with_the_token(fake_api, capsys):
    fake_api.add("GET", "/api/v1/teams/", 301, None, headers={"Location": "/portal/api/v1/teams/"})
    fake_api.add("GET", "/portal/api/v1/teams/", 200, TEAMS_PAGE)

    assert main(["teams"]) == 0

    assert "vision" in capsys.readouterr().out
    followed = fake_api.requests_to("GET", "/portal/api/v1/teams/")
    assert len(followed) == 1 and followed[0]["headers"]["Authorization"] == "Token gpp_test"


def test_a_next_link_naming_another_origin_is_read_on_the_portal_origin(fake_api, other_origin, capsys):
    """Behind a proxy the portal may build ``next`` links with its internal address."""
    page1 = {**TEAMS_PAGE, "count": 2, "next": other_origin.url + "/api/v1/teams/?page=2"}
    page2 = {**TEAMS_PAGE, "count": 2, "results": [{"slug": "nlp", "name": "NLP"}]}
    fake_api.add("GET", "/api/v1/teams/", 200, page1)
    fake_api.add("GET", "/api/v1/teams/", 200, page2)

    assert main(["teams"]) == 0

    out = capsys.readouterr().out
    assert "vision" in out and "nlp" in out
    assert fake_api.requests_to("GET", "/api/v1/teams/")[1]["query"] == {"page": "2"}
    assert other_origin.requests == []


def test_a_request_to_another_origin_is_refused_before_connecting(other_origin):
    client = Client("http://127.0.0.1:1", "gpp_secret")
    with pytest.raises(ApiError, match="refusing to send the token"):
        client._exchange("GET", other_origin.url + "/api/v1/teams/", None, {"Authorization": "Token gpp_secret"})
    assert other_origin.requests == []


@pytest.mark.parametrize("status", [200, 502])
def test_an_html_answer_is_a_one_line_error_naming_the_url_and_status(fake_api, capsys, status):
    page = b"<!doctype html><html><body><form>Single sign-on</form></body></html>"
    fake_api.add("GET", "/api/v1/teams/", status, page, headers={"Content-Type": "text/html; charset=utf-8"})

    assert main(["teams"]) == 69

    *retries, err = capsys.readouterr().err.strip().splitlines()  # a 502 of a GET is retried first, each said
    assert len(retries) == (8 if status == 502 else 0) and all("trying again in" in line for line in retries)
    assert "Traceback" not in err
    assert f"GET {fake_api.url}/api/v1/teams/ answered {status} " in err and "text/html, not JSON" in err


def test_429_waits_as_retry_after_says_even_for_a_post_without_a_key(fake_api, sleeps, capsys):
    fake_api.add("POST", "/api/v1/jobs/quote/", 429, {"detail": "Request was throttled."}, headers={"Retry-After": "7"})
    fake_api.add("POST", "/api/v1/jobs/quote/", 200, {"gpu_hours": "1.00", "cost": "10.00", "currency": "CNY"})

    assert main(["quote", "--gpus", "1", "--time", "1h"]) == 0

    assert sleeps == [7.0]
    assert len(fake_api.requests_to("POST", "/api/v1/jobs/quote/")) == 2
    assert "1.00 GPU-hours" in capsys.readouterr().out


def test_503_with_an_http_date_retry_after_is_retried_for_a_get(fake_api, sleeps, capsys):
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    fake_api.add("GET", "/api/v1/teams/", 503, {"detail": "Maintenance."}, headers={"Retry-After": later})
    fake_api.add("GET", "/api/v1/teams/", 200, TEAMS_PAGE)

    assert main(["teams"]) == 0

    assert len(sleeps) == 1 and 25 <= sleeps[0] <= 31
    captured = capsys.readouterr()
    assert "vision" in captured.out
    # the user is told why the command waits (one line per retry, on stderr)
    [notice] = captured.err.strip().splitlines()
    assert notice.startswith(f"gpuportal: GET {fake_api.url}/api/v1/teams/: 503 ") and "trying again in " in notice


def test_503_of_a_post_without_a_key_is_not_repeated(fake_api, sleeps, capsys):
    fake_api.add("POST", JOB_PATH + "cancel/", 503, {"detail": "Maintenance."}, headers={"Retry-After": "1"})
    assert main(["cancel", JOB_ID]) == 69
    assert sleeps == [] and len(fake_api.requests_to("POST", JOB_PATH + "cancel/")) == 1
    assert "Maintenance. (the portal asks to wait 1 s)" in capsys.readouterr().err


def test_a_retry_after_longer_than_the_cap_is_reported_not_waited_for(fake_api, sleeps, capsys):
    fake_api.add("GET", "/api/v1/teams/", 429, {"detail": "Request was throttled."}, headers={"Retry-After": "3600"})
    assert main(["teams"]) == 65
    assert sleeps == [] and "wait 3600 s" in capsys.readouterr().err


def test_retry_after_parsing():
    now = 1_800_000_000.0
    assert retry_after_seconds("12", now=now) == 12.0
    assert retry_after_seconds(email.utils.formatdate(now + 90, usegmt=True), now=now) == 90.0
    assert retry_after_seconds(email.utils.formatdate(now - 90, usegmt=True), now=now) == 0.0
    assert retry_after_seconds("soon", now=now) is None and retry_after_seconds(None) is None


def test_a_kept_alive_connection_the_server_closed_is_replaced_before_sending(fake_api):
    """Like gunicorn's or nginx's keep-alive timeout: the server closes an idle connection without
    having said so in the answer; the client sees it gone before sending and uses a new one (a POST
    without a key is sent exactly once)."""
    fake_api.add("POST", "/api/v1/jobs/quote/", 200, {"gpu_hours": "1.00"})
    fake_api.drop_idle = True
    client = Client(fake_api.url, "gpp_test")

    assert client.post("jobs/quote/", {"gpus": 1})["gpu_hours"] == "1.00"
    wait_for(lambda: cli_client._dropped(client._connection.sock), timeout=10, interval=0.01,
             what="the stand-in's close of the idle connection to arrive")  # fmt: skip
    assert client.post("jobs/quote/", {"gpus": 1})["gpu_hours"] == "1.00"

    assert client.connections_opened == 2 == fake_api.connections
    assert len(fake_api.requests_to("POST", "/api/v1/jobs/quote/")) == 2  # each sent once


# ---------------------------------------------------------------- proxies from the environment


def test_a_plain_http_portal_is_reached_through_http_proxy(fake_api, monkeypatch, capsys):
    """The stand-in API plays the proxy: it gets the absolute URL and the proxy's credentials."""
    fake_api.add("GET", "/api/v1/teams/", 200, TEAMS_PAGE)
    monkeypatch.setenv("GPUPORTAL_URL", "http://portal.example.invalid:8123")
    monkeypatch.setenv("http_proxy", fake_api.url.replace("http://", "http://proxyuser:s%40cret@"))
    monkeypatch.delenv("no_proxy", raising=False)

    assert main(["teams"]) == 0

    (request,) = fake_api.requests
    assert request["target"] == "http://portal.example.invalid:8123/api/v1/teams/"
    assert request["headers"]["Host"] == "portal.example.invalid:8123"
    assert request["headers"]["Proxy-Authorization"] == "Basic cHJveHl1c2VyOnNAY3JldA=="  # proxyuser:s@cret


def test_an_https_portal_goes_through_a_connect_tunnel_and_the_proxy_never_sees_the_token(fake_api, monkeypatch, capsys):
    monkeypatch.setenv("GPUPORTAL_URL", "https://portal.example.invalid")
    monkeypatch.setenv("https_proxy", fake_api.url)
    monkeypatch.delenv("no_proxy", raising=False)

    assert main(["teams"]) == 69  # the stand-in refuses the tunnel

    assert fake_api.requests and {r["method"] for r in fake_api.requests} == {"CONNECT"}
    assert fake_api.requests[0]["target"] == "portal.example.invalid:443"
    assert not any("Authorization" in r["headers"] for r in fake_api.requests)
    assert "cannot reach https://portal.example.invalid" in capsys.readouterr().err


def test_no_proxy_hosts_are_reached_directly(fake_api, monkeypatch, capsys):
    fake_api.add("GET", "/api/v1/teams/", 200, TEAMS_PAGE)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")

    assert main(["teams"]) == 0
    assert fake_api.requests[0]["target"] == "/api/v1/teams/"
