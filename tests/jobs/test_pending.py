"""A pending job's outlook (issue 40): the expected start and place in line the sync takes from its
one queue read, the reason table, and how the page, the API and the CLI show them. Against an
in-memory gateway; tests/jobs/test_pending_slurm.py compares with the real clusters' squeue --start."""

from __future__ import annotations

import datetime as dt

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.pending import PENDING_REASONS, queue_outlook, reason_code, reason_explained
from jobs.services import jobs_sync
from portal.slurm.types import QueueEntry
from tests.fakes import FakeGateway, queue_entry

T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def fake(use_gateway):
    return use_gateway(FakeGateway())


def pending_jobs(world, n, *, first_id=500, gpu_type="a100"):
    now = timezone.now()
    return Job.objects.bulk_create(
        Job(
            team=world.vision, submitter=world.alice, name=f"p{i}", script="#!/bin/bash\ntrue", partition="gpu",
            gpu_type=gpu_type, gpus=1, time_limit_minutes=10, workdir="/tmp", state=JobState.PENDING,
            slurm_job_id=first_id + i, submitted_at=now, estimated_gpu_hours=1,
        )  # fmt: skip
        for i in range(n)
    )


# ---------------------------------------------------------------- the pure parts


def test_queue_outlook_orders_each_partition_and_gpu_type_by_priority():
    queue = [
        queue_entry(1, "RUNNING", "", start=T0, priority=0),
        queue_entry(2, "PENDING", "", priority=10, start=T0 + dt.timedelta(hours=2)),
        queue_entry(3, "PENDING", "", priority=30, start=T0 + dt.timedelta(hours=1)),
        queue_entry(4, "PENDING", "", priority=10),  # same priority as 2, younger: after it
        queue_entry(5, "PENDING", "", priority=99, tres_per_node="gres:gpu:h100:1"),  # another GPU type
        queue_entry(6, "PENDING", "", priority=99, partition="debug"),  # another partition
        queue_entry(7, "PENDING", "", priority=1, partition="debug,gpu"),  # both: placed in its first
    ]
    outlook = queue_outlook(queue)
    assert 1 not in outlook  # running: no outlook
    assert {i: outlook[i].position for i in (3, 2, 4, 5, 6, 7)} == {3: 1, 2: 2, 4: 3, 5: 1, 6: 1, 7: 2}
    assert outlook[3].expected_start == T0 + dt.timedelta(hours=1)
    assert outlook[4].expected_start is None  # no estimate yet


def test_queue_outlook_speaks_for_an_array_by_its_id():
    row = QueueEntry(
        job_id=40, name="a", user="u", account="a", partition="gpu", state="PENDING", reason="Priority", comment="",
        nodes="", num_nodes=1, submit_time=None, start_time=T0, end_time=None, time_limit_minutes=5,
        tres_per_node="gres:gpu:a100:1", array_job_id=40, array_tasks="2-9", priority=5,
    )  # fmt: skip
    outlook = queue_outlook([queue_entry(41, "PENDING", "", priority=50), row])
    assert (outlook[40].position, outlook[40].expected_start) == (2, T0)


@pytest.mark.parametrize(
    "reason, code",
    [("Priority", "Priority"), ("ReqNodeNotAvail, UnavailableNodes:nosuch", "ReqNodeNotAvail"),
     ("AssocGrpGRES", "AssocGrpGRES"), ("(null)", ""), ("SomethingNew", "SomethingNew")],
)  # fmt: skip
def test_reason_code_is_the_code_without_slurms_details(reason, code):
    assert reason_code(reason) == code


def test_every_reason_in_the_table_has_a_sentence_and_unknown_codes_have_none():
    assert all(text.endswith(".") and (advice == "" or advice.endswith(".")) for text, advice in PENDING_REASONS.values())
    assert reason_explained("SomethingNew") is None
    explained = reason_explained("ReqNodeNotAvail, UnavailableNodes:nosuch")
    assert explained.code == "ReqNodeNotAvail" and "does not exist" in explained.text


# ---------------------------------------------------------------- the sync


def test_sync_stores_expected_start_and_place_from_the_one_queue_read(world, fake):
    first, second = pending_jobs(world, 2)
    fake.queue_entries = [
        queue_entry(first.slurm_job_id, "PENDING", first.slurm_tag, reason="Resources", priority=20, start=T0),
        queue_entry(second.slurm_job_id, "PENDING", second.slurm_tag, reason="Priority", priority=10),
        queue_entry(999, "PENDING", "", reason="Priority", priority=15),  # someone else's job between them
    ]
    stats = jobs_sync()
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.expected_start_at, first.queue_position) == (T0, 1)
    assert (second.expected_start_at, second.queue_position) == (None, 3)
    assert fake.calls == {"queue": 1} and stats["queue_calls"] == 1


def test_sync_notes_an_estimate_that_moved_beyond_the_threshold(world, fake, settings):
    settings.START_ESTIMATE_MOVE_MINUTES = 30
    (job,) = pending_jobs(world, 1)
    entry = lambda start: queue_entry(job.slurm_job_id, "PENDING", job.slurm_tag, reason="Priority", start=start)  # noqa: E731
    fake.queue_entries = [entry(T0)]
    jobs_sync()
    fake.queue_entries = [entry(T0 + dt.timedelta(minutes=20))]  # within the threshold: no note
    jobs_sync()
    job.refresh_from_db()
    assert (job.expected_start_at, job.expected_start_moved_from) == (T0 + dt.timedelta(minutes=20), None)
    assert not JobEvent.objects.filter(job=job, reason__startswith="Expected start").exists()
    fake.queue_entries = [entry(T0 + dt.timedelta(hours=2, minutes=20))]
    jobs_sync()
    job.refresh_from_db()
    assert job.expected_start_moved_from == T0 + dt.timedelta(minutes=20)
    (event,) = JobEvent.objects.filter(job=job, reason__startswith="Expected start")
    assert (event.state, event.reason) == (JobState.PENDING, "Expected start moved later by 2 h 0 min")
    fake.queue_entries = [queue_entry(job.slurm_job_id, "RUNNING", job.slurm_tag, start=timezone.now())]
    jobs_sync()
    job.refresh_from_db()  # running: the outlook goes
    assert (job.state, job.expected_start_at, job.queue_position, job.expected_start_moved_from) == (JobState.RUNNING, None, None, None)


@pytest.mark.parametrize("n", [1, 200])
def test_sync_outlook_keeps_the_query_count_constant(world, fake, django_assert_max_num_queries, n):
    jobs = pending_jobs(world, n)
    fake.queue_entries = [
        queue_entry(j.slurm_job_id, "PENDING", j.slurm_tag, reason="Priority", priority=1000 - i, start=T0 + dt.timedelta(minutes=i))
        for i, j in enumerate(jobs)
    ]
    with django_assert_max_num_queries(9):  # the same for 1 and 200 jobs
        stats = jobs_sync()
    assert stats["changed"] == n and fake.calls == {"queue": 1}
    assert list(Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("slurm_job_id").values_list("queue_position", flat=True)) == list(range(1, n + 1))


# ---------------------------------------------------------------- what users see


def _waiting(world, **fields):
    (job,) = pending_jobs(world, 1)
    Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    return job


def test_api_gives_the_outlook_and_the_reason_in_words(world, api_client_for):
    job = _waiting(world, state_reason="AssocGrpGRES", expected_start_at=T0, queue_position=2, expected_start_moved_from=T0 - dt.timedelta(hours=1))
    body = api_client_for("member").get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["state_reason"] == "AssocGrpGRES"
    assert body["state_reason_text"] == PENDING_REASONS["AssocGrpGRES"][0]
    assert body["state_reason_advice"] == PENDING_REASONS["AssocGrpGRES"][1]
    assert dt.datetime.fromisoformat(body["expected_start_at"]) == T0 and body["queue_position"] == 2
    assert dt.datetime.fromisoformat(body["expected_start_moved_from"]) == T0 - dt.timedelta(hours=1)
    listed = api_client_for("member").get("/api/v1/jobs/").json()["results"]
    assert [j["queue_position"] for j in listed if j["id"] == str(job.pk)] == [2]


def test_api_shows_an_unknown_reason_as_slurm_gives_it(world, api_client_for):
    job = _waiting(world, state_reason="SomethingNew")
    body = api_client_for("member").get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["state_reason"], body["state_reason_text"], body["expected_start_at"]) == ("SomethingNew", "", None)


def test_job_page_and_list_show_the_outlook(world, client_for):
    job = _waiting(world, state_reason="Priority", queue_position=3)
    client = client_for("member")
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "no estimate yet" in page and "#3</strong> in line for a100 GPUs" in page
    assert PENDING_REASONS["Priority"][0] in page
    Job.objects.filter(pk=job.pk).update(expected_start_at=T0, expected_start_moved_from=T0 - dt.timedelta(hours=2))
    poll = client.get(reverse("jobs:detail", args=[job.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "expected start moved from" in poll and "no estimate yet" not in poll
    Job.objects.filter(pk=job.pk).update(expected_start_at=timezone.now() - dt.timedelta(minutes=1), expected_start_moved_from=None)
    assert "any moment now" in client.get(reverse("jobs:detail", args=[job.pk])).content.decode()  # a plan already past
    listing = client.get(reverse("jobs:list")).content.decode()
    assert f'id="start-{job.pk}"' in listing and "#3" in listing


def test_gpu_section_polls_its_own_data_while_the_job_runs(world, client_for):
    (job,) = pending_jobs(world, 1)
    client = client_for("member")
    url = reverse("jobs:gpu-usage", args=[job.pk])
    assert "hx-trigger" not in client.get(url, HTTP_HX_REQUEST="true").content.decode()  # not started: no poll
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=timezone.now())
    section = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert f'hx-get="{url}"' in section and 'id="gpu-usage"' in section
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert f'hx-get="{url}"' in page  # the page's section is the poller
    assert client_for("outsider").get(url, HTTP_HX_REQUEST="true").status_code == 404


def test_cli_lines_for_a_pending_job():
    from gpuportal_cli.output import _reason_line, _start_cell, _start_line

    job = {"state": "PENDING", "state_reason": "Priority", "state_reason_text": "Jobs ahead.", "state_reason_advice": "Wait.",
           "expected_start_at": None, "queue_position": 2, "gpu_type": "a100", "partition": "gpu"}  # fmt: skip
    assert _start_line(job) == "no estimate yet; #2 in line for a100 in gpu"
    assert _start_cell(job) == "no estimate #2"
    assert _reason_line(job) == "Priority: Jobs ahead. Wait."
    assert _reason_line(job | {"state_reason": "New", "state_reason_text": "", "state_reason_advice": ""}) == "New"
    assert _start_line(job | {"state": "RUNNING"}) == ""
    moved = _start_line(job | {"expected_start_at": "2030-01-01T12:00:00Z", "expected_start_moved_from": "2030-01-01T10:00:00Z"})
    assert "moved from" in moved and moved.startswith("2030-01-01")
    assert _start_line(job | {"expected_start_at": "2020-01-01T12:00:00Z"}).startswith("any moment now (planned for 2020-01-01")
