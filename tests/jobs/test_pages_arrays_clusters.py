"""The job page as a researcher follows an array: every task with Slurm's own JOBID_TASK id, its
state, elapsed time, exit code and output links, counts from the same rows, the table sent with each
poll of the status card (out of band) so header and table never disagree; a cancelled job shows no
"exit code 0"; the estimate's cost from exact GPU-seconds; the cluster a job runs on, and the form
panel's partition of the cluster the job will go to."""

from __future__ import annotations

import datetime as dt
import os
import re
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import JobArrayTask
from portal.slurm import ClusterConfig
from tests.jobs.test_pages import HTMX, _job

pytestmark = pytest.mark.django_db


def _array_job(world, **extra):
    job = _job(world, state=JobState.RUNNING, slurm_job_id=9529, array="0-3", array_tasks=4, **extra)
    now = timezone.now()
    JobArrayTask.objects.create(job=job, index=0, slurm_job_id=9530, state=JobState.COMPLETED, exit_code=0,
                                started_at=now - dt.timedelta(seconds=130), ended_at=now - dt.timedelta(seconds=10))  # fmt: skip
    JobArrayTask.objects.create(job=job, index=1, slurm_job_id=9531, state=JobState.RUNNING, started_at=now - dt.timedelta(seconds=65))
    JobArrayTask.objects.create(job=job, index=2, slurm_job_id=9532, state=JobState.CANCELLED, exit_code=0,
                                started_at=now - dt.timedelta(seconds=5), ended_at=now)  # fmt: skip
    return job  # task 3: not seen by a sync yet (pending)


def _rows(html: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(0) for m in re.finditer(r'<tr data-task="(\d+)".*?</tr>', html, re.S)}


def test_the_array_table_lists_every_task_with_slurms_ids_state_elapsed_exit_code_and_outputs(world, client_for):
    job = _array_job(world)
    html = client_for("member").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    rows = _rows(html)
    assert sorted(rows) == [0, 1, 2, 3]
    for index in range(4):
        assert f"<code>9529_{index}</code>" in rows[index]  # Slurm's JOBID_TASK, not the tasks' own numbers
    assert "9530" not in html.split('id="job-array-tasks"')[1].split("</section>")[0]
    assert 'data-state="COMPLETED"' in rows[0] and "2 min 00 s" in rows[0] and "<code>0</code>" in rows[0]
    assert 'data-state="RUNNING"' in rows[1] and "1 min 0" in rows[1]
    assert 'data-state="CANCELLED"' in rows[2] and "<code>0</code>" not in rows[2]  # Slurm's 0 for a cancel means nothing
    assert 'data-state="PENDING"' in rows[3] and "none yet" in rows[3]
    for index in (0, 1, 2):  # output of every task that ran, both streams
        for stream in ("stdout", "stderr"):
            assert f"?task={index}&amp;stream={stream}" in rows[index]
    counts = html.split('class="task-counts"')[1].split("</p>")[0]
    for state in ("COMPLETED", "RUNNING", "CANCELLED", "PENDING"):
        assert f'data-state="{state}">1 {state.lower()}<' in counts


def test_each_poll_of_the_status_card_carries_the_task_table_out_of_band(world, client_for):
    job = _array_job(world)
    client = client_for("member")
    poll = client.get(reverse("jobs:detail", args=[job.pk]), **HTMX).content.decode()
    assert 'id="job-status"' in poll and '<section id="job-array-tasks"' in poll and 'hx-swap-oob="true"' in poll
    assert 'data-state="RUNNING">1 running<' in poll

    # the array ends: the poll that shows the job Completed shows every task's final state with it
    JobArrayTask.objects.filter(job=job, index=1).update(state=JobState.COMPLETED, exit_code=0, ended_at=timezone.now())
    JobArrayTask.objects.create(job=job, index=3, slurm_job_id=9533, state=JobState.FAILED, exit_code=3, started_at=timezone.now())
    job.__class__.objects.filter(pk=job.pk).update(state=JobState.FAILED, exit_code=3, ended_at=timezone.now())
    poll = client.get(reverse("jobs:detail", args=[job.pk]), **HTMX).content.decode()
    assert "hx-trigger" not in poll  # the job ended: no more polling
    assert "running" not in poll.split('class="task-counts"')[1].split("</p>")[0]
    assert 'data-state="COMPLETED">2 completed<' in poll and 'data-state="FAILED">1 failed<' in poll
    assert "<code>3</code>" in _rows(poll)[3]


def test_the_output_of_any_task_is_shown_by_its_index(world, client_for, settings, tmp_path):
    settings.JOB_OUTPUT_PATTERN = str(tmp_path) + "/{slurm_job_id}.{stream}"
    job = _array_job(world, unix_uid=os.getuid())  # the files below are written as the job's user
    (tmp_path / "9529_0.out").write_text("task zero\n")
    (tmp_path / "9529_2.out").write_text("task two\n")
    client = client_for("member")
    page = client.get(reverse("jobs:detail", args=[job.pk]), {"task": "2"}).content.decode()
    assert "task two" in page and "task zero" not in page and "<strong>Task 2</strong>" in page
    partial = client.get(reverse("jobs:output", args=[job.pk]), {"task": "0", "stream": "stdout"}, **HTMX).content.decode()
    assert "task zero" in partial and "&amp;task=0" in partial  # the poll keeps reading the same task
    default = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "task zero" in default and "<strong>Task 0</strong>" in default
    not_a_task = client.get(reverse("jobs:detail", args=[job.pk]), {"task": "7"}).content.decode()
    assert "task zero" in not_a_task  # an index outside the array: the first task, no error


def test_a_cancelled_job_shows_no_exit_code(world, client_for):
    job = _job(world, state=JobState.CANCELLED, slurm_job_id=77, exit_code=0)
    html = client_for("member").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "exit code" not in html.split('id="job-status"')[1].split("</details>")[0]
    finished = _job(world, state=JobState.FAILED, slurm_job_id=78, exit_code=2)
    html = client_for("member").get(reverse("jobs:detail", args=[finished.pk])).content.decode()
    assert "exit code <code>2</code>" in html


def test_the_estimate_is_gpu_seconds_times_the_price_rounded_once(world, client_for, inventory):
    """1 GPU × 2 min × 4 array tasks at 8 CNY/GPU-h: 480 GPU-s × 8 / 3600 = 1.0666… → 1.07 (rounding
    the GPU-hours first gave 0.13 × 8 = 1.04)."""
    from accounting.models import Rate

    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal(8), effective_from=dt.date(2020, 1, 1))
    html = client_for("member").get(reverse("jobs:quote"), {
        "partition": "gpu", "gpu_type": "a100", "gpus": "1", "time_limit_minutes": "2", "array": "0-3",
        "script": "#!/bin/bash\ntrue\n",
    }).content.decode()  # fmt: skip
    stat = re.search(r'<div class="stat">\s*([\d.]+)', html)
    assert stat and stat.group(1) == "1.07", html
    assert "at most 0.13 GPU-hours" in html


def test_a_form_error_in_the_estimate_box_says_so_as_an_error(world, client_for):
    html = client_for("member").get(reverse("jobs:quote"), {"gpus": "0"}).content.decode()
    assert 'class="quote-error" role="alert"' in html and "GPUs" in html


@pytest.fixture
def two_clusters(settings, world, inventory):
    """The default cluster's inventory (``inventory``) and ``east`` with a partition gpu of its own."""
    from portal.models import NodeInfo, PartitionInfo
    from portal.services import cluster_row, clusters_record
    from portal.snapshots import INVENTORY, snapshot_changed

    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(settings.SLURM_CLUSTER, "cli"), ClusterConfig("east", "cli"))
    clusters_record()
    east = cluster_row("east")
    now = timezone.now()
    NodeInfo.objects.create(cluster=east, name="east-01", state="MIXED", partitions=["gpu"], gpu_type="a100", gpus_total=12,
                            gpus_allocated=8, cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
    PartitionInfo.objects.create(cluster=east, name="gpu", is_default=True, state="UP", max_time_minutes=60, node_names=["east-01"],
                                 seen_at=now)  # fmt: skip
    snapshot_changed(INVENTORY)
    return east


def test_the_job_list_and_page_name_the_cluster_when_there_are_several(world, client_for, two_clusters):
    job = _job(world, cluster=two_clusters)
    client = client_for("member")
    listing = client.get(reverse("jobs:list")).content.decode()
    assert "<th>Cluster</th>" in listing and '<span class="badge cluster">east</span>' in listing
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "<tr><th>Cluster</th><td>east</td></tr>" in page and '<span class="badge cluster" title="Cluster">east</span>' in page


def test_the_form_panel_shows_the_partition_of_the_cluster_the_job_goes_to(world, client_for, two_clusters, settings):
    client = client_for("member")
    east = client.get(reverse("jobs:quote"), {"partition": "gpu", "cluster": "east", "gpus": "1", "time_limit_minutes": "5"}).content.decode()
    assert '<span class="badge cluster" title="Cluster">east</span>' in east and "GPUs free now: 4 of 12" in east
    default = client.get(reverse("jobs:quote"), {"partition": "gpu", "gpus": "1", "time_limit_minutes": "5"}).content.decode()
    assert f'title="Cluster">{settings.SLURM_CLUSTER}</span>' in default and "GPUs free now: 4 of 12" not in default
