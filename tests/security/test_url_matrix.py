"""The permission matrix for EVERY URL of the URLconf.

``test_every_url_has_a_matrix_entry`` walks ``get_resolver()`` recursively (the admin's own pages
except ``/admin/`` itself, and static files, are skipped) and fails when a URL name has no entry in
``MATRIX``. Each entry is one or more requests with the expected
status for anonymous, outsider, member, manager, admin, finance (roles relative to team vision;
objects from the fixture world: a vision job of alice, a vision team template, a token of alice)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from jobs.spec import output_files
from tests.support import stored_request
from jobs.models import Job, JobTemplate
from portal.services import api_token_create, sync_record_success
from tests.conftest import ROLES

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Req:
    method: str
    path: Callable[[Objects], str]  # built from the fixture objects
    expected: tuple[int, int, int, int, int, int]  # anonymous, outsider, member, manager, admin, finance
    data: dict | list = field(default_factory=dict)


class Objects:
    def __init__(self, world):
        self.world = world
        self.job = make_job(world.vision, world.alice)
        self.template = JobTemplate.objects.create(
            scope="team", team=world.vision, created_by=world.alice, name="vision-tpl", script="#!/bin/bash\ntrue\n"
        )
        self.token, _ = api_token_create(user=world.alice, name="alice's token")
        sync_record_success("cluster")  # /healthz: a recent cluster read
        self.booking = make_booking(world.vision, world.bob)


def make_booking(team, user):
    """A REQUESTED vision booking of one a100 node tomorrow (no Slurm reservation), on an a100 node."""
    import datetime as dt
    import uuid

    from django.utils import timezone

    from accounting.models import Booking
    from portal.models import NodeInfo

    NodeInfo.objects.get_or_create(name="a100-01", defaults={"state": "IDLE", "gpu_type": "a100", "gpus_total": 4, "seen_at": timezone.now()})
    start = timezone.now() + dt.timedelta(days=1)
    booking_id = uuid.uuid4()
    return Booking.objects.create(id=booking_id, team=team, gpu_type="a100", gpus=4, start=start, end=start + dt.timedelta(hours=1),
                                  created_by=user, reservation_name=Booking.reservation_name_for(booking_id))  # fmt: skip


def make_job(team, user, **overrides) -> Job:
    """A job row that never reaches Slurm (ACCEPTED, never claimed)."""
    values = {
        "team": team, "submitter": user, "name": "matrix-job", "script": "#!/bin/bash\ntrue\n", "partition": "gpu",
        "gpus": 1, "time_limit_minutes": 10, "workdir": "/tmp", "estimated_gpu_hours": Decimal("0.17"),
    }  # fmt: skip
    values.update(overrides)
    values.setdefault("submit_dir", values["workdir"])
    output, error = output_files(workdir=values["workdir"], array=values.get("array", ""))
    values.setdefault("output_pattern", output)
    values.setdefault("error_pattern", error)
    job = Job(**values)
    job.request = job.request or stored_request(job)
    job.save(force_insert=True)
    return job


ALL_200 = (200, 200, 200, 200, 200, 200)
LOGIN_THEN_200 = (302, 200, 200, 200, 200, 200)
API_LOGIN_THEN_200 = (401, 200, 200, 200, 200, 200)

# URL name → the requests made and their expected status per role (ROLES order).
IDLE_POLICY_FORM = {"enabled": "on", "threshold_percent": "5", "warn_minutes": "30", "cancel_minutes": "30"}
MATRIX: dict[str, list[Req]] = {
    # portal pages
    "dashboard": [Req("GET", lambda o: "/", LOGIN_THEN_200)],
    "cluster-partial": [Req("GET", lambda o: "/partials/cluster/", LOGIN_THEN_200)],
    "cluster-status": [Req("GET", lambda o: "/clusters/", LOGIN_THEN_200)],
    "healthz": [Req("GET", lambda o: "/healthz", ALL_200)],  # public: status only, no data
    "livez": [Req("GET", lambda o: "/livez", ALL_200)],  # public: the process answers, nothing else
    "metrics": [Req("GET", lambda o: "/metrics", ALL_200)],  # by address (127.0.0.1) / bearer token, not by role
    "login": [Req("GET", lambda o: "/login/", (200, 302, 302, 302, 302, 302))],
    "logout": [Req("GET", lambda o: "/logout/", (405,) * 6), Req("POST", lambda o: "/logout/", (302,) * 6)],
    # OpenID Connect: off in the test settings (404 for all); on, see tests/portal/test_oidc_login.py
    "oidc_authentication_init": [Req("GET", lambda o: "/oidc/authenticate/", (404,) * 6)],
    "oidc_authentication_callback": [Req("GET", lambda o: "/oidc/callback/?code=x&state=y", (404,) * 6)],
    "team-list": [Req("GET", lambda o: "/teams/", LOGIN_THEN_200)],
    "team-detail": [
        Req("GET", lambda o: "/teams/vision/", (302, 404, 200, 200, 200, 200)),
        Req("GET", lambda o: "/teams/nlp/", (302, 404, 404, 404, 200, 200)),
        # the idle-GPU policy form: the team's managers and admins (finance sees the team, sets nothing)
        Req("POST", lambda o: "/teams/vision/", (302, 404, 403, 302, 302, 403), data=IDLE_POLICY_FORM),
    ],
    "token-list": [Req("GET", lambda o: "/account/tokens/", LOGIN_THEN_200)],
    "profile": [Req("GET", lambda o: "/account/profile/", LOGIN_THEN_200), Req("POST", lambda o: "/account/profile/", (302,) * 6)],
    "token-revoke": [Req("POST", lambda o: f"/account/tokens/{o.token.pk}/revoke/", (302, 404, 302, 404, 404, 404))],
    # job pages
    "jobs:list": [Req("GET", lambda o: "/jobs/", LOGIN_THEN_200)],
    "jobs:live-states": [Req("GET", lambda o: f"/jobs/live/?ids={o.job.pk}", LOGIN_THEN_200)],
    "jobs:new": [Req("GET", lambda o: "/jobs/new/", LOGIN_THEN_200), Req("POST", lambda o: "/jobs/new/", (302, 400, 400, 400, 400, 400))],
    "jobs:quote": [Req("GET", lambda o: "/jobs/new/quote/?gpus=1", LOGIN_THEN_200)],
    "jobs:templates": [Req("GET", lambda o: "/jobs/templates/", LOGIN_THEN_200)],
    "jobs:template-create": [Req("POST", lambda o: "/jobs/templates/new/", (302, 400, 400, 400, 400, 400))],
    "jobs:template-delete": [
        Req("POST", lambda o: f"/jobs/templates/{o.template.pk}/delete/", (302, 404, 302, 302, 302, 404))
    ],
    "jobs:detail": [Req("GET", lambda o: f"/jobs/{o.job.pk}/", (302, 404, 200, 200, 200, 404))],
    "jobs:output": [Req("GET", lambda o: f"/jobs/{o.job.pk}/output/", (302, 404, 302, 302, 302, 404))],
    "jobs:gpu-usage": [Req("GET", lambda o: f"/jobs/{o.job.pk}/gpu/", (302, 404, 302, 302, 302, 404))],
    "jobs:cancel": [Req("POST", lambda o: f"/jobs/{o.job.pk}/cancel/", (302, 404, 302, 302, 302, 404))],
    "jobs:save-template": [Req("POST", lambda o: f"/jobs/{o.job.pk}/save-template/", (302, 404, 400, 400, 400, 404))],
    # API
    "api-cluster": [Req("GET", lambda o: "/api/v1/cluster/", API_LOGIN_THEN_200)],
    "api-cluster-list": [Req("GET", lambda o: "/api/v1/clusters/", API_LOGIN_THEN_200)],
    "api-team-list": [Req("GET", lambda o: "/api/v1/teams/", API_LOGIN_THEN_200)],
    "api-team-detail": [
        Req("GET", lambda o: "/api/v1/teams/vision/", (401, 404, 200, 200, 200, 200)),
        Req("GET", lambda o: "/api/v1/teams/nlp/", (401, 404, 404, 404, 200, 200)),
    ],
    "api-team-idle-policy": [
        Req("GET", lambda o: "/api/v1/teams/vision/idle-policy/", (401, 404, 200, 200, 200, 200)),
        Req("GET", lambda o: "/api/v1/teams/nlp/idle-policy/", (401, 404, 404, 404, 200, 200)),
        Req("PUT", lambda o: "/api/v1/teams/vision/idle-policy/", (401, 404, 403, 200, 200, 403),
            data={"enabled": True, "threshold_percent": "5", "warn_minutes": "30", "cancel_minutes": "30"}),
    ],
    "api-job-list": [
        Req("GET", lambda o: "/api/v1/jobs/", API_LOGIN_THEN_200),
        Req("POST", lambda o: "/api/v1/jobs/", (401, 400, 400, 400, 400, 400)),  # empty body: invalid for all
        Req("POST", lambda o: "/api/v1/jobs/", (401, 400, 400, 400, 400, 400), data=[]),  # an empty batch
    ],
    "api-job-quote": [Req("POST", lambda o: "/api/v1/jobs/quote/", (401, 400, 400, 400, 400, 400))],
    # an empty batch is refused whoever asks (400); who may submit for which team is tested in tests/jobs/test_batch.py
    "api-job-detail": [Req("GET", lambda o: f"/api/v1/jobs/{o.job.pk}/", (401, 404, 200, 200, 200, 404))],
    "api-job-cancel": [Req("POST", lambda o: f"/api/v1/jobs/{o.job.pk}/cancel/", (401, 404, 200, 200, 200, 404))],
    "api-job-output": [Req("GET", lambda o: f"/api/v1/jobs/{o.job.pk}/output/", (401, 404, 200, 200, 200, 404))],
    "api-job-template-list": [Req("GET", lambda o: "/api/v1/job-templates/", API_LOGIN_THEN_200)],
    "api-job-template-detail": [
        Req("GET", lambda o: f"/api/v1/job-templates/{o.template.pk}/", (401, 404, 200, 200, 200, 404)),
        Req("DELETE", lambda o: f"/api/v1/job-templates/{o.template.pk}/", (401, 404, 204, 204, 204, 404)),
    ],
    "api-schema": [Req("GET", lambda o: "/api/schema/", ALL_200)],
    "api-docs": [Req("GET", lambda o: "/api/docs/", ALL_200)],
    # the admin site's front door (its own pages are Django's, permission-checked by the admin)
    # accounting: prices are public to logged-in users; reports for admins and finance; a team's usage
    # for its members (404 to others); invoices for the team's managers, admins and finance
    "accounting:rates": [Req("GET", lambda o: "/accounting/rates/", LOGIN_THEN_200)],
    "accounting:reports": [Req("GET", lambda o: "/accounting/reports/", (302, 403, 403, 403, 200, 200))],
    "accounting:usage": [Req("GET", lambda o: "/accounting/usage/?team=vision", (302, 404, 200, 200, 200, 200))],
    "accounting:invoice": [Req("GET", lambda o: "/accounting/invoices/vision/2026-11/", (302, 404, 403, 200, 200, 200))],
    "accounting:invoice-pdf": [
        Req("GET", lambda o: "/accounting/invoices/vision/2026-11.pdf", (302, 404, 403, 200, 200, 200))
    ],
    # issuing (a POST; the page redirects back with what happened): admins and finance only
    "accounting:invoice-issue": [
        Req("POST", lambda o: "/accounting/invoices/vision/2026-10/issue/", (302, 404, 403, 403, 302, 302))
    ],
    "accounting:invoice-jobs-csv": [
        Req("GET", lambda o: "/accounting/invoices/vision/2026-11-jobs.csv", (302, 404, 403, 200, 200, 200))
    ],
    "api-cost-report": [
        Req("GET", lambda o: "/api/v1/reports/cost/?start=2026-11-01&end=2026-11-30&group_by=team", (401, 403, 403, 403, 200, 200))
    ],
    "api-team-usage": [Req("GET", lambda o: "/api/v1/teams/vision/usage/", (401, 404, 200, 200, 200, 200))],
    "admin:index": [Req("GET", lambda o: "/admin/", (302, 302, 302, 302, 200, 302))],
    # bookings: every signed-in user sees the calendar (and their teams' bookings); the team's managers
    # and admins book and cancel; admins approve and reject
    "accounting:bookings": [Req("GET", lambda o: "/accounting/bookings/", LOGIN_THEN_200)],
    "accounting:booking-cancel": [Req("POST", lambda o: f"/accounting/bookings/{o.booking.pk}/cancel/", (302, 404, 403, 302, 302, 403))],
    "accounting:booking-approve": [Req("POST", lambda o: f"/accounting/bookings/{o.booking.pk}/approve/", (302, 404, 403, 403, 302, 403))],
    "accounting:booking-reject": [Req("POST", lambda o: f"/accounting/bookings/{o.booking.pk}/reject/", (302, 404, 403, 403, 302, 403))],
    "api-booking-list": [
        Req("GET", lambda o: "/api/v1/bookings/", API_LOGIN_THEN_200),
        Req("POST", lambda o: "/api/v1/bookings/", (401, 400, 403, 201, 201, 403), data={
            "team": "vision", "gpu_type": "a100", "gpus": 4, "start": "2099-01-05T09:00:00Z", "end": "2099-01-05T10:00:00Z"}),
        # the cluster field: the role is checked before the cluster (a member learns nothing of it)
        Req("POST", lambda o: "/api/v1/bookings/", (401, 400, 403, 400, 400, 403), data={
            "team": "vision", "cluster": "nosuchcluster", "gpu_type": "a100", "gpus": 4, "start": "2099-01-05T09:00:00Z",
            "end": "2099-01-05T10:00:00Z"}),
    ],
    "api-booking-detail": [Req("GET", lambda o: f"/api/v1/bookings/{o.booking.pk}/", (401, 404, 200, 200, 200, 200))],
    "api-booking-availability": [Req("GET", lambda o: "/api/v1/bookings/availability/?gpu_type=a100", API_LOGIN_THEN_200)],
    "api-booking-cancel": [Req("POST", lambda o: f"/api/v1/bookings/{o.booking.pk}/cancel/", (401, 404, 403, 200, 200, 403))],
    "api-booking-approve": [Req("POST", lambda o: f"/api/v1/bookings/{o.booking.pk}/approve/", (401, 404, 403, 403, 200, 403))],
    "api-booking-reject": [Req("POST", lambda o: f"/api/v1/bookings/{o.booking.pk}/reject/", (401, 404, 403, 403, 200, 403))],
    # quotas: everyone signed in sees the list (their teams' quotas); the team's managers and admins
    # request; admins approve and reject (a fresh REQUESTED vision quota per request); a team's
    # budget for its members, admins and finance (404 to others)
    "accounting:quotas": [
        Req("GET", lambda o: "/accounting/quotas/", LOGIN_THEN_200),
        Req("POST", lambda o: "/accounting/quotas/", (302, 403, 403, 302, 302, 403),
            data={"team": "vision", "gpu_hours": "10", "justification": "matrix"}),
    ],
    "accounting:quota-approve": [Req("POST", lambda o: f"/accounting/quotas/{requested_quota(o).pk}/approve/", (302, 404, 403, 403, 302, 403))],
    "accounting:quota-reject": [
        Req("POST", lambda o: f"/accounting/quotas/{requested_quota(o).pk}/reject/", (302, 404, 403, 403, 302, 403), data={"comment": "no"})
    ],
    # withdrawing a request: its team's managers and admins (the service's rule)
    "accounting:quota-withdraw": [Req("POST", lambda o: f"/accounting/quotas/{requested_quota(o).pk}/withdraw/", (302, 404, 403, 302, 302, 403))],
    "accounting:budget": [Req("GET", lambda o: "/accounting/budget/?team=vision", (302, 404, 200, 200, 200, 200))],
    "api-quota-list": [
        Req("GET", lambda o: "/api/v1/quotas/", API_LOGIN_THEN_200),
        Req("POST", lambda o: "/api/v1/quotas/", (401, 400, 403, 201, 201, 403),
            data={"team": "vision", "gpu_hours": "10", "justification": "matrix"}),
    ],
    "api-quota-approve": [Req("POST", lambda o: f"/api/v1/quotas/{requested_quota(o).pk}/approve/", (401, 404, 403, 403, 200, 403))],
    "api-quota-reject": [
        Req("POST", lambda o: f"/api/v1/quotas/{requested_quota(o).pk}/reject/", (401, 404, 403, 403, 200, 403), data={"comment": "no"})
    ],
    "api-quota-withdraw": [Req("POST", lambda o: f"/api/v1/quotas/{requested_quota(o).pk}/withdraw/", (401, 404, 403, 200, 200, 403))],
    "api-team-budget": [Req("GET", lambda o: "/api/v1/teams/vision/budget/", (401, 404, 200, 200, 200, 200))],
}


def requested_quota(o):
    """A fresh REQUESTED quota of team vision (requested by its manager bob)."""
    from accounting.services import quota_request

    return quota_request(team=o.world.vision, user=o.world.bob, gpu_hours=10, justification="matrix")

def _walk(resolver: URLResolver, prefix: str = "", namespace: str = ""):
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            ns = ":".join(filter(None, [namespace, pattern.namespace or ""]))
            yield from _walk(pattern, route, ns)
        elif isinstance(pattern, URLPattern):
            name = f"{namespace}:{pattern.name}" if namespace and pattern.name else (pattern.name or f"<unnamed {route}>")
            yield route, name


def url_names() -> dict[str, str]:
    """Every URL name of the URLconf → its route; admin internals and static files left out."""
    names = {}
    for route, name in _walk(get_resolver()):
        if route.startswith("admin/") and name != "admin:index":
            continue  # the admin's own pages (permission-checked by the admin site itself)
        if route.startswith(("static/", "^static/")):
            continue
        names[name] = route
    return names


def test_every_url_has_a_matrix_entry():
    names = url_names()
    missing = sorted(set(names) - set(MATRIX))
    assert missing == [], "URLs without a permission-matrix entry (add them to MATRIX): " + ", ".join(
        f"{name} ({names[name]})" for name in missing
    )
    stale = sorted(set(MATRIX) - set(names))
    assert stale == [], f"matrix entries for URLs that no longer exist: {stale}"


def test_the_url_walk_reaches_every_app_and_every_entry_has_requests():
    """The walk above is not vacuous: it finds the pages and APIs of every app (so a URLconf the walk
    cannot enter fails here, not silently), and no matrix entry is an empty list of requests."""
    namespaces = {name.split(":", 1)[0] for name in url_names() if ":" in name}
    assert {"jobs", "accounting", "admin"} <= namespaces, namespaces
    assert len(url_names()) == len(MATRIX)
    assert [name for name, requests in MATRIX.items() if not requests] == []


def _client(world, role: str, api: bool):
    user = world.user_for(role)
    if api:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user=user)
        return client
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


CASES = [(name, index) for name, reqs in MATRIX.items() for index in range(len(reqs))]


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}[{i}]" for n, i in CASES])
def test_url_permission_matrix(world, name, index, relays):
    """One request, as each of the six roles in turn, each in a savepoint rolled back after it (and
    with the caches cleared, as between tests): no role sees what another's request changed. The world
    is built once per request instead of once per role (issue 43); every role's mismatch is reported."""
    from django.db import transaction

    from portal.snapshots import snapshots_forget
    from tests.support import cache_clear

    req = MATRIX[name][index]
    objects = Objects(world)
    wrong = []
    for role in ROLES:
        with transaction.atomic():
            path = req.path(objects)
            api = path.startswith("/api/v1/")
            client = _client(world, role, api)
            data = {"format": "json"} if api and req.method != "GET" else {}
            response = getattr(client, req.method.lower())(path, req.data, **data)
            expected = req.expected[ROLES.index(role)]
            if response.status_code != expected:
                wrong.append(f"{req.method} {path} as {role}: {response.status_code}, expected {expected}")
            elif role == "anonymous" and response.status_code == 302 and not path.startswith("/logout/"):
                if not response["Location"].startswith(("/login/", "/admin/login/")):
                    wrong.append(f"{req.method} {path} as anonymous: redirected to {response['Location']}, not the login")
            elif api and response.status_code >= 400 and set(response.json()) != {"detail", "errors"}:
                wrong.append(f"{req.method} {path} as {role}: error body {sorted(response.json())}, not detail and errors")
            transaction.set_rollback(True)
        cache_clear()
        snapshots_forget()
    assert not wrong, "\n".join(wrong)
