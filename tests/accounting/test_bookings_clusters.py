"""Bookings on several clusters through the API and the page: ``cluster`` taken and shown, the
default cluster chosen by the GPU type (400 naming ``cluster`` and the candidates when several
clusters have it), an unknown cluster or one where the team has no Slurm account refused (400
naming ``cluster``), the list filtered by cluster in constant queries, the availability per cluster,
and the page's cluster picker, column and calendar only when several clusters are configured."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounting.models import Booking
from accounting.services import booking_create
from portal.models import AuditEvent, NodeInfo, TeamClusterAccount
from portal.services import cluster_row, clusters_record
from portal.slurm import ClusterConfig
from tests.accounting import test_bookings
from tests.accounting.test_bookings import day_at
from tests.accounting.test_bookings_pages import field_group, form_data, page_as

# the fixtures of the bookings tests (whole-node inventory without Slurm; reservation tasks recorded)
inventory_whole_nodes = test_bookings.inventory_whole_nodes
reserve_calls = test_bookings.reserve_calls

pytestmark = pytest.mark.django_db

API = "/api/v1/bookings/"


@pytest.fixture
def two_clusters(settings, world, inventory_whole_nodes, reserve_calls):
    """The default cluster (2 × 4 a100, 1 × 4 h100: inventory_whole_nodes) and ``east`` (1 × 4 a100,
    1 × 4 l40s: a type only east has); team vision has an account on east, nlp has none."""
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(settings.SLURM_CLUSTER, "cli"), ClusterConfig("east", "cli"))
    clusters_record()
    east = cluster_row("east")
    for name, gpu_type in (("east-a100-01", "a100"), ("east-l40s-01", "l40s")):
        NodeInfo.objects.create(cluster=east, name=name, state="IDLE", partitions=["gpu"], gpu_type=gpu_type, gpus_total=4,
                                cpus_total=32, memory_mb=256000, seen_at=timezone.now())  # fmt: skip
    TeamClusterAccount.objects.create(team=world.vision, cluster=east, slurm_account="vision-east")
    return cluster_row(settings.SLURM_CLUSTER), east


def body(**fields) -> dict:
    return {"team": "vision", "gpu_type": "a100", "gpus": 4, "start": day_at(9).isoformat(), "end": day_at(10).isoformat(),
            **fields}  # fmt: skip


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


# ---------------------------------------------------------------- the API: create


def test_a_booking_on_a_named_cluster_is_made_there_and_shows_it(two_clusters, api_client_for, reserve_calls,
                                                                  django_capture_on_commit_callbacks):  # fmt: skip
    main, east = two_clusters
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_client_for("manager").post(API, body(cluster="east"), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["cluster"] == "east" and answer.json()["nodes"] == ["east-a100-01"]
    booking = Booking.objects.get(pk=answer.json()["id"])
    assert booking.cluster_id == east.pk and reserve_calls["reserve"] == [str(booking.pk)]
    assert AuditEvent.objects.get(action="booking.create").data["cluster"] == "east"
    # the same window on the default cluster: its own capacity, its own nodes
    answer = api_client_for("manager").post(API, body(cluster=main.name, gpus=8), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["cluster"] == main.name and answer.json()["nodes"] == ["a100-01", "a100-02"]


def test_without_a_cluster_the_one_cluster_that_has_the_gpu_type_is_taken(two_clusters, api_client_for):
    main, east = two_clusters
    client = api_client_for("manager")
    answer = client.post(API, body(gpu_type="l40s"), format="json")  # only east has l40s
    assert answer.status_code == 201, answer.json()
    assert answer.json()["cluster"] == "east" and Booking.objects.get(pk=answer.json()["id"]).cluster_id == east.pk
    answer = client.post(API, body(gpu_type="h100", cluster=""), format="json")  # only the default cluster has h100
    assert answer.status_code == 201, answer.json()
    assert answer.json()["cluster"] == main.name


def test_without_a_cluster_a_gpu_type_on_several_clusters_is_a_400_listing_them(two_clusters, api_client_for):
    main, _ = two_clusters
    answer = api_client_for("manager").post(API, body(gpu_type="a100"), format="json")
    assert answer.status_code == 400
    assert set(answer.json()) == {"detail", "errors"} and list(answer.json()["errors"]) == ["cluster"]
    message = answer.json()["errors"]["cluster"][0]
    assert ", ".join(sorted(["east", main.name])) in message, message
    assert not Booking.objects.exists()


def test_an_unknown_cluster_is_a_400_naming_it(two_clusters, api_client_for):
    main, _ = two_clusters
    answer = api_client_for("manager").post(API, body(cluster="west"), format="json")
    assert answer.status_code == 400
    message = answer.json()["errors"]["cluster"][0]
    assert "'west'" in message and "east" in message and main.name in message, message
    assert not Booking.objects.exists()


def test_a_cluster_where_the_team_has_no_slurm_account_is_a_400_naming_cluster(two_clusters, world):
    client = as_user(world.dave)  # a manager of nlp, which has no account on east
    for fields in ({"cluster": "east"}, {"gpu_type": "l40s"}):  # named, or chosen by the GPU type
        answer = client.post(API, body(team="nlp", **fields), format="json")
        assert answer.status_code == 400, answer.json()
        assert "no Slurm account on cluster 'east'" in answer.json()["errors"]["cluster"][0], answer.json()
    answer = client.post(API, body(team="nlp", gpu_type="h100"), format="json")  # the default cluster: its usual account
    assert answer.status_code == 201, answer.json()
    assert list(Booking.objects.values_list("team__slug", "cluster__name")) == [("nlp", cluster_row().name)]


def test_a_member_is_refused_before_the_cluster_is_looked_at(two_clusters, api_client_for):
    for cluster in ("west", "east", ""):
        answer = api_client_for("member").post(API, body(cluster=cluster), format="json")
        assert answer.status_code == 403, (cluster, answer.json())
    assert not Booking.objects.exists()


def test_with_one_cluster_a_booking_goes_to_it_and_names_it(world, inventory_whole_nodes, reserve_calls, api_client_for,
                                                            settings):  # fmt: skip
    answer = api_client_for("manager").post(API, body(), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["cluster"] == settings.SLURM_CLUSTER
    answer = api_client_for("manager").post(API, body(cluster="east", start=day_at(11).isoformat(),
                                                      end=day_at(12).isoformat()), format="json")  # fmt: skip
    assert answer.status_code == 400 and "'east'" in answer.json()["errors"]["cluster"][0]


# ---------------------------------------------------------------- the API: list, detail, availability


def _book(world, cluster, day: int, gpu_type: str = "a100"):
    return booking_create(team=world.vision, gpu_type=gpu_type, gpus=4, start=day_at(9, days=day), end=day_at(10, days=day),
                          actor=world.admin, cluster=cluster)  # fmt: skip


def test_the_list_shows_and_filters_by_cluster_in_constant_queries(two_clusters, world, api_client_for,
                                                                   django_assert_num_queries):  # fmt: skip
    main, _ = two_clusters
    here, there = _book(world, main.name, 2), _book(world, "east", 3)
    client = api_client_for("member")
    client.get(API)  # the first request of a process reads what it then keeps
    with CaptureQueriesContext(connection) as small:
        rows = client.get(API).json()["results"]
    assert {(r["id"], r["cluster"]) for r in rows} == {(str(here.pk), main.name), (str(there.pk), "east")}
    for day in range(4, 10):
        _book(world, main.name if day % 2 else "east", day)
    with django_assert_num_queries(len(small)):
        assert len(client.get(API).json()["results"]) == 8
    rows = client.get(API, {"cluster": "east"}).json()["results"]
    assert len(rows) == 4 and {r["cluster"] for r in rows} == {"east"}
    assert client.get(API, {"cluster": "west"}).json()["results"] == []


def test_the_detail_shows_the_cluster_to_those_who_see_the_booking(two_clusters, world, api_client_for):
    booking = _book(world, "east", 2)
    answer = api_client_for("member").get(f"{API}{booking.pk}/")
    assert answer.status_code == 200 and (answer.json()["id"], answer.json()["cluster"]) == (str(booking.pk), "east")
    assert as_user(world.carol).get(f"{API}{booking.pk}/").status_code == 404  # another team's


def test_the_availability_is_each_clusters_own(two_clusters, world, api_client_for):
    main, _ = two_clusters
    _book(world, "east", 2)
    window = {"start": day_at(9).isoformat(), "end": day_at(10).isoformat()}
    client = api_client_for("member")
    east = client.get(f"{API}availability/", {**window, "cluster": "east"}).json()
    assert east["cluster"] == "east"
    assert {r["gpu_type"]: (r["capacity"], r["steps"][0]["free"]) for r in east["results"]} == {"a100": (4, 0), "l40s": (4, 4)}
    default = client.get(f"{API}availability/", window).json()  # no cluster: the default one
    assert default["cluster"] == main.name
    assert {r["gpu_type"]: (r["capacity"], r["steps"][0]["free"]) for r in default["results"]} == {"a100": (8, 8), "h100": (4, 4)}
    answer = client.get(f"{API}availability/", {**window, "cluster": "west"})
    assert answer.status_code == 400 and "'west'" in answer.json()["errors"]["cluster"][0]


# ---------------------------------------------------------------- the page


URL = "/accounting/bookings/"


def test_the_page_offers_the_clusters_and_books_on_the_one_chosen(two_clusters, world):
    main, east = two_clusters
    _book(world, main.name, 2)
    client = page_as(world.bob)
    page = client.get(URL).content.decode()
    picker = field_group(page, "cluster")
    assert '<select name="cluster"' in picker and '<option value="east">east (a100, l40s)</option>' in picker
    # the default: a cluster that has the first GPU type (a100), never "on several clusters; name one"
    assert f'<option value="{main.name}" selected>{main.name} (a100, h100)</option>' in picker
    assert '<th scope="col">Cluster</th>' in page and f'<td data-cluster="{main.name}">' in page
    assert "l40s on east" in page and f"a100 on {main.name}" in page  # the calendar: each cluster's types
    response = client.post(URL, {**form_data(day_at(11), day_at(12), gpu_type="a100"), "cluster": "east"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Booking.objects.get(start=day_at(11)).cluster_id == east.pk
    assert '<td data-cluster="east">' in client.get(URL).content.decode()


def test_the_page_names_the_cluster_field_when_the_gpu_type_is_on_several(two_clusters, world):
    client = page_as(world.bob)
    response = client.post(URL, form_data(day_at(11), day_at(12), gpu_type="a100"))
    assert response.status_code == 400
    assert "several clusters" in field_group(response.content.decode(), "cluster")
    response = client.post(URL, {**form_data(day_at(11), day_at(12), gpu_type="a100"), "cluster": "west"})
    assert response.status_code == 400 and "west" in field_group(response.content.decode(), "cluster")
    assert not Booking.objects.exists()


def test_the_page_lists_bookings_of_both_clusters_in_constant_queries(two_clusters, world, django_assert_num_queries):
    main, _ = two_clusters
    _book(world, main.name, 2)
    _book(world, "east", 3)
    client = page_as(world.alice)
    with CaptureQueriesContext(connection) as small:
        assert client.get(URL).status_code == 200
    for day in range(4, 8):
        _book(world, main.name if day % 2 else "east", day)
    with django_assert_num_queries(len(small)):
        page = client.get(URL).content.decode()
    assert page.count('<td data-cluster="east">') == 3 and page.count(f'<td data-cluster="{main.name}">') == 3


def test_with_one_cluster_the_page_has_no_cluster_choice_or_column(world, inventory_whole_nodes, reserve_calls):
    page = page_as(world.bob).get(URL).content.decode()
    assert '<input type="hidden" name="cluster"' in page and '<select name="cluster"' not in page
    assert '<th scope="col">Cluster</th>' not in page and "<td data-cluster=" not in page
    assert 'data-gpu-type="a100"' in page and "a100 on " not in page  # the calendar names no cluster


# ---------------------------------------------------------------- jobs in a booking


def test_a_job_in_a_booking_runs_on_the_bookings_cluster_or_is_refused_naming_cluster(two_clusters, world, relays):
    from accounting.models import ReservationState
    from jobs.services import job_submit
    from portal.exceptions import ApplicationError
    from portal.models import PartitionInfo
    from portal.snapshots import INVENTORY, snapshot_changed

    _, east = two_clusters
    PartitionInfo.objects.create(cluster=east, name="gpu", is_default=True, state="UP", default_time_minutes=60,
                                 max_time_minutes=4320, node_names=["east-a100-01", "east-l40s-01"], seen_at=timezone.now())  # fmt: skip
    snapshot_changed(INVENTORY)
    now = timezone.now()
    booking = booking_create(team=world.vision, gpu_type="a100", gpus=4, start=now, end=now + dt.timedelta(hours=1),
                             actor=world.admin, cluster="east")  # fmt: skip
    Booking.objects.filter(pk=booking.pk).update(reservation_state=ReservationState.ACTIVE)
    common = {"user": world.alice, "team": world.vision, "name": "in-booking", "script": "true", "partition": "gpu",
              "gpu_type": "a100", "gpus": 4, "time_limit_minutes": 10, "booking": booking.pk}  # fmt: skip
    with pytest.raises(ApplicationError) as info:  # "gpu" is on both clusters: the default one, not the booking's
        job_submit(**common)
    assert "on cluster 'east'" in info.value.errors["cluster"][0], info.value.errors
    job, created = job_submit(**common, cluster="east")
    assert created and (job.cluster_id, job.booking_id) == (east.pk, booking.pk)
