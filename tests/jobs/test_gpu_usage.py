"""What the GPUs did, without a cluster: the sync's folding of Prometheus's points into per-GPU rows,
the verdict and the downsampled chart, Prometheus down (a refused port, really refused), the idle
alert with its webhook (a real local HTTP receiver), and the emulated exporter and the Prolog/Epilog
scripts run as processes with the environment slurmd gives them."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.gpu_report import GPU_CHART_POINTS, job_gpu_report
from jobs.gpu_summary import summary_encode
from jobs.models import JobGpuIdleAlert, JobGpuSample, JobGpuSummary, JobGpuUsage
from jobs.services import gpu_idle_alerts_check, gpu_usage_finalise, gpu_usage_record, gpu_usage_sync
from portal import prometheus
from portal.models import SyncStatus
from tests.conftest import ROOT
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

STEP = 60


def _series(job, gpu: str, utils: list[float], *, start: dt.datetime, mem: float | None = 1000.0, host="a100-01"):
    points = [(start + dt.timedelta(seconds=STEP * i), u, mem) for i, u in enumerate(utils)]
    return prometheus.GpuSeries(cluster=job.slurm_cluster, job=str(job.slurm_job_id), host=host, gpu=gpu,
                                model="NVIDIA A100-SXM4-80GB", points=points)  # fmt: skip


def _running_job(world, *, gpus=2, minutes_ago=60, **kwargs):
    now = timezone.now()
    return JobFactory(team=world.vision, submitter=world.alice, gpus=gpus, state=JobState.RUNNING, slurm_cluster="gpuportal",
                      slurm_job_id=kwargs.pop("slurm_job_id", 4242), started_at=now - dt.timedelta(minutes=minutes_ago), **kwargs)  # fmt: skip


def test_points_fold_into_one_row_per_gpu_and_a_repeat_counts_nothing_twice(world):
    job = _running_job(world)
    start = timezone.now() - dt.timedelta(minutes=10)
    series = [_series(job, "0", [90, 80, 100, 90], start=start), _series(job, "1", [0, 0, 1, 0], start=start, mem=None)]
    assert gpu_usage_record(series, step=STEP) == {"gpus": 2, "points": 8}
    assert gpu_usage_record(series, step=STEP) == {"gpus": 0, "points": 0}  # the same points again

    busy, idle = JobGpuUsage.objects.filter(job=job).order_by("gpu")
    assert (busy.samples, busy.util_mean, busy.util_peak, busy.mem_peak, busy.idle_samples) == (4, 90, 100, 1000, 0)
    assert (idle.samples, idle.util_peak, idle.idle_samples, idle.mem_samples) == (4, 1, 4, 0)
    assert idle.idle_since == start - dt.timedelta(seconds=STEP) and busy.idle_since is None
    assert not JobGpuSample.objects.exists()  # the raw points stay in Prometheus

    report = job_gpu_report(job)
    assert report["verdict"] == "1 of 2 GPUs idle for 100 % of the run"
    assert report["gpus"][0]["busy_gpu_hours"] == pytest.approx(360 / 100 * STEP / 3600)  # unrounded: shown rounded


def test_a_series_of_another_cluster_or_an_unknown_job_is_not_recorded(world):
    job = _running_job(world)
    start = timezone.now() - dt.timedelta(minutes=5)
    other = prometheus.GpuSeries(cluster="gpuportal25", job=str(job.slurm_job_id), host="a100-01", gpu="0", model="",
                                 points=[(start, 50.0, None)])  # fmt: skip
    unknown = prometheus.GpuSeries(cluster="gpuportal", job="999999", host="a100-01", gpu="0", model="", points=[(start, 50.0, None)])
    assert gpu_usage_record([other, unknown], step=STEP) == {"gpus": 0, "points": 0}


def test_the_verdict_names_the_busy_case_and_the_all_idle_case(world):
    start = timezone.now() - dt.timedelta(minutes=10)
    busy_job = _running_job(world, slurm_job_id=1)
    gpu_usage_record([_series(busy_job, "0", [50, 70], start=start), _series(busy_job, "1", [60, 60], start=start)], step=STEP)
    assert job_gpu_report(busy_job)["verdict"] == "All 2 GPUs busy: mean utilisation 60 %"
    idle_job = _running_job(world, slurm_job_id=2)
    gpu_usage_record([_series(idle_job, "0", [0, 0, 0, 50], start=start)], step=STEP)
    assert job_gpu_report(idle_job)["verdict"] == "All 1 GPU idle for 75 % of the run"


def _store_summary(job, series, *, minimum_width=300):
    """What the finalisation stores for an ended job, from the points Prometheus would give back."""
    rows = list(JobGpuUsage.objects.filter(job=job).order_by("task_index", "host", "gpu"))
    by_key = {(s.job, s.host, s.gpu): s.points for s in series}
    points = {i: by_key[(str(r.slurm_job_id), r.host, r.gpu)] for i, r in enumerate(rows)}
    JobGpuSummary.objects.create(job=job, ended_at=timezone.now(), data=summary_encode(rows, points, minimum_width=minimum_width))
    return rows


def test_the_stored_chart_of_8_gpus_over_72_hours_has_at_most_240_points_each_and_the_same_figures(world, django_assert_num_queries):
    job = _running_job(world, gpus=8, minutes_ago=72 * 60)
    start = timezone.now() - dt.timedelta(hours=72)
    points = 72 * 60  # one a minute
    series = [_series(job, str(g), [float(g * 10)] * points, start=start) for g in range(8)]
    gpu_usage_record(series, step=STEP)
    before = job_gpu_report(job, chart=False)
    rows = _store_summary(job, series)
    JobGpuUsage.objects.filter(job=job).delete()  # retention took the working rows: the record is enough
    with django_assert_num_queries(2):  # the record, the status: no Prometheus call for an ended job
        report = job_gpu_report(job)
    chart = report["chart"]
    assert len(chart["labels"]) <= GPU_CHART_POINTS and len(chart["series"]) == 8 and len(rows) == 8
    assert all(len(s["util"]) == len(chart["labels"]) for s in chart["series"])
    assert {v for v in chart["series"][3]["util"] if v is not None} == {30.0}  # means of equal values
    assert {v for v in chart["series"][3]["mem_mib"] if v is not None} == {1000}
    unfrozen = lambda gpus: [g | {"final": None} for g in gpus]  # noqa: E731
    assert unfrozen(report["gpus"]) == unfrozen(before["gpus"]) and report["verdict"] == before["verdict"]
    assert len(JobGpuSummary.objects.get(job=job).data) < 2000  # 34 560 points kept as one small record


def test_a_short_jobs_stored_series_has_buckets_of_at_least_the_minimum_width(world):
    job = _running_job(world, gpus=1, minutes_ago=20)
    series = [_series(job, "0", [10.0] * 10 + [90.0] * 10, start=timezone.now() - dt.timedelta(minutes=20))]
    gpu_usage_record(series, step=STEP)
    _store_summary(job, series, minimum_width=300)
    chart = job_gpu_report(job)["chart"]
    assert chart["bucket_seconds"] == 300 and len(chart["labels"]) == 4  # 20 one-minute points
    assert chart["series"][0]["util"][0] == 10.0 and chart["series"][0]["util"][-1] == 90.0


def test_rows_of_an_ended_job_are_frozen_after_its_last_points_into_its_summary(world, settings):
    settings.PROMETHEUS_URL = ""  # the series is read from the real one in test_gpu_usage_prometheus.py
    job = _running_job(world)
    start = timezone.now() - dt.timedelta(minutes=10)
    gpu_usage_record([_series(job, "0", [40, 40], start=start)], step=STEP)
    now = timezone.now()
    type(job).objects.filter(pk=job.pk).update(state=JobState.COMPLETED, ended_at=now - dt.timedelta(seconds=STEP))
    assert gpu_usage_finalise(now=now, step=STEP) == 0  # its last points may still come
    assert gpu_usage_finalise(now=now + dt.timedelta(seconds=STEP), step=STEP) == 1
    late = _series(job, "0", [100], start=timezone.now())
    assert gpu_usage_record([late], step=STEP) == {"gpus": 0, "points": 0}
    assert JobGpuUsage.objects.get(job=job).samples == 2
    [row] = job_gpu_report(job)["gpus"]  # from the record
    assert (row["samples"], row["util_mean"], row["final"]) == (2, 40.0, True)
    assert JobGpuSummary.objects.get(job=job).ended_at == now - dt.timedelta(seconds=STEP)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def test_prometheus_down_is_recorded_and_the_job_page_and_api_still_answer_saying_so(world, settings, client_for):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{_closed_port()}"
    job = _running_job(world)
    result = gpu_usage_sync()
    assert result["queries"] == 1 and "unreachable" in result["error"]
    status = SyncStatus.objects.get(kind="gpu-usage")
    assert status.failing_since is not None
    page = client_for("member").get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    assert b"GPU figures are delayed: Prometheus has not answered since" in page.content
    api = APIClient()
    api.force_authenticate(world.alice)
    body = api.get(f"/api/v1/jobs/{job.pk}/").json()["gpu_usage"]
    assert body["status"]["failing_since"] and body["gpus"] == []


def test_without_prometheus_url_the_sync_does_nothing_and_the_page_says_monitoring_is_off(world, settings, client_for):
    settings.PROMETHEUS_URL = ""
    job = _running_job(world)
    assert gpu_usage_sync() == {"skipped": "PROMETHEUS_URL is not set"}
    assert b"GPU monitoring is off" in client_for("member").get(f"/jobs/{job.pk}/").content


def test_the_query_uses_the_configured_names_for_nvidia_gpu_exporter(settings):
    settings.GPU_METRIC_UTIL, settings.GPU_METRIC_MEMORY = "nvidia_smi_utilization_gpu_ratio", "nvidia_smi_memory_used_bytes"
    settings.GPU_LABEL_JOB = "slurm_job"
    query = prometheus.gpu_query(30)
    assert 'avg_over_time(nvidia_smi_utilization_gpu_ratio{slurm_job!=""}[30s])' in query
    assert 'avg_over_time(nvidia_smi_memory_used_bytes{slurm_job!=""}[30s])' in query


class _Receiver(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook_receiver():
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Receiver.bodies
    server.shutdown()


def test_an_idle_job_alerts_its_submitter_and_the_team_webhook_once_and_a_busy_or_young_one_not(
    world, settings, webhook_receiver, django_capture_on_commit_callbacks
):
    url, bodies = webhook_receiver
    world.vision.alert_webhook_url = url
    world.vision.save()
    world.alice.email = "alice@example.org"
    world.alice.save()
    settings.GPU_IDLE_ALERT_MINUTES = 30
    now = timezone.now()
    idle = _running_job(world, slurm_job_id=11)
    gpu_usage_record([_series(idle, g, [0.0] * 40, start=now - dt.timedelta(minutes=40)) for g in ("0", "1")], step=STEP)
    busy = _running_job(world, slurm_job_id=12)
    gpu_usage_record([_series(busy, "0", [0.0] * 40, start=now - dt.timedelta(minutes=40)),
                      _series(busy, "1", [0.0] * 30 + [50.0] * 10, start=now - dt.timedelta(minutes=40))], step=STEP)  # fmt: skip
    young = _running_job(world, slurm_job_id=13, minutes_ago=10)
    gpu_usage_record([_series(young, "0", [0.0] * 10, start=now - dt.timedelta(minutes=10))], step=STEP)

    with django_capture_on_commit_callbacks(execute=True):
        created = gpu_idle_alerts_check(now=now)
        assert gpu_idle_alerts_check(now=now + dt.timedelta(minutes=5)) == []  # once per job
    assert [a.job_id for a in created] == [idle.pk]
    alert = JobGpuIdleAlert.objects.get(job=idle)
    assert alert.gpus == 2 and alert.emailed_at and alert.webhook_delivered_at
    [message] = mail.outbox
    assert message.to == ["alice@example.org"] and f"/jobs/{idle.pk}/" in message.body and "Cost of the allocation so far" in message.body
    [body] = bodies
    assert body["event"] == "job.gpus_idle" and body["job_id"] == str(idle.pk) and body["gpus"] == 2


# ---------------------------------------------------------------- the emulated parts, as processes


def _cluster_dir(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm.conf").write_text("ClusterName=testcl\n")
    (tmp_path / "etc" / "gres.conf").write_text(f"AutoDetect=off\nNodeName=a100-01 Name=gpu Type=a100 File={tmp_path}/dev/a100-01/nvidia[0-3]\n")
    return tmp_path


def _render(tmp_path: Path, action: str) -> Path:
    text = (ROOT / "scripts" / "slurm" / "gpu-job-map.in").read_text()
    script = tmp_path / f"gpu-{action.lower()}"
    script.write_text(text.replace("@DIR@", str(tmp_path)).replace("@ACTION@", action))
    script.chmod(0o755)
    return script


def _slurmd_env(**values) -> dict:
    # what slurmd gives a Prolog/Epilog (measured on 22.05: SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES both set)
    return {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "a100-01", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", **values}


def test_the_prolog_maps_the_jobs_gpus_and_the_epilog_unmaps_them(tmp_path):
    prolog, epilog = _render(tmp_path, "Prolog"), _render(tmp_path, "Epilog")
    subprocess.run([prolog], env=_slurmd_env(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,2", CUDA_VISIBLE_DEVICES="0,2"), check=True)
    subprocess.run([prolog], env=_slurmd_env(SLURM_JOB_ID="8", CUDA_VISIBLE_DEVICES="2"), check=True)  # no SLURM_JOB_GPUS
    subprocess.run([prolog], env=_slurmd_env(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,2"), check=True)  # twice: once
    mapping = tmp_path / "hpc-jobs" / "a100-01"
    assert (mapping / "0").read_text() == "7\n" and (mapping / "2").read_text() == "7\n8\n"
    subprocess.run([epilog], env=_slurmd_env(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,2"), check=True)
    assert not (mapping / "0").exists() and (mapping / "2").read_text() == "8\n"
    # no GPUs, no job id: nothing to do, and never a failure (a failing Prolog drains the node)
    assert subprocess.run([prolog], env=_slurmd_env(SLURM_JOB_ID="9")).returncode == 0


def test_the_exporter_serves_dcgm_exporters_format_with_the_jobs_declared_load(tmp_path):
    directory = _cluster_dir(tmp_path)
    mapping = directory / "hpc-jobs" / "a100-01"
    mapping.mkdir(parents=True)
    (mapping / "1").write_text("31337\n")
    (mapping / "2").write_text("31337\n")
    # a process of job 31337 bound to GPU 1 that declares 75 % and 5000 MiB (GPU 2: held, idle)
    load = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "31337", "SLURMD_NODENAME": "a100-01",
                                                  "CUDA_VISIBLE_DEVICES": "1", "GPUPORTAL_GPU_UTIL": "75", "GPUPORTAL_GPU_MEM_MIB": "5000"})  # fmt: skip
    # the same job id and node name on another cluster (the local clusters share node names): not this one's
    other = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "31337", "SLURMD_NODENAME": "a100-01",
                                                   "SLURM_CLUSTER_NAME": "othercl", "CUDA_VISIBLE_DEVICES": "2", "GPUPORTAL_GPU_UTIL": "50"})  # fmt: skip
    try:
        out = subprocess.run([ROOT / "scripts" / "gpu-exporter", "--cluster", directory, "--targets-file", tmp_path / "t.json",
                              "--once", "a100-01"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    finally:
        for process in (load, other):
            process.kill()
            process.wait()
    lines = out.splitlines()
    assert lines[:2] == ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %)." in lines and "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB)." in lines
    util = {line.split('gpu="')[1].split('"')[0]: line for line in lines if line.startswith("DCGM_FI_DEV_GPU_UTIL{")}
    assert util["1"].endswith('Hostname="a100-01",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="31337"} 75')
    assert util["2"].endswith('hpc_job="31337"} 0') and util["0"].endswith('DCGM_FI_DRIVER_VERSION="550.54.15"} 0')
    assert 'modelName="NVIDIA A100-SXM4-80GB"' in util["1"] and 'UUID="GPU-' in util["1"]
    assert any(line.startswith('DCGM_FI_DEV_FB_USED{gpu="1"') and line.endswith(" 5000") for line in lines)


def test_managers_see_their_teams_idle_allocations_on_the_team_page_and_members_do_not(world, client_for):
    now = timezone.now()
    job = _running_job(world, slurm_job_id=21)
    gpu_usage_record([_series(job, "0", [0.0] * 5, start=now - dt.timedelta(minutes=5)),
                      _series(job, "1", [80.0] * 5, start=now - dt.timedelta(minutes=5))], step=STEP)  # fmt: skip
    page = client_for("manager").get(f"/teams/{world.vision.slug}/")
    assert page.status_code == 200
    assert b"Idle GPU allocations now" in page.content and job.name.encode() in page.content
    assert b"1 of 2" in page.content
    assert b"Idle GPU allocations now" not in client_for("member").get(f"/teams/{world.vision.slug}/").content


def test_the_budget_page_shows_gpu_hours_paid_and_busy(world, client_for):
    page = client_for("manager").get(f"/accounting/budget/?team={world.vision.slug}")
    assert page.status_code == 200
    assert b"GPU-hours paid and busy" in page.content and b"GPU-hours busy" in page.content


def test_an_arrays_tasks_get_rows_of_their_own_by_their_own_slurm_ids(world):
    from jobs.models import JobArrayTask

    job = _running_job(world, gpus=1, slurm_job_id=700, array="0-1", array_tasks=2)
    for index, slurm_id in ((0, 701), (1, 702)):
        JobArrayTask.objects.create(job=job, index=index, slurm_job_id=slurm_id, state=JobState.RUNNING)
    start = timezone.now() - dt.timedelta(minutes=5)
    series = [prometheus.GpuSeries(cluster="gpuportal", job=str(sid), host="a100-01", gpu=gpu, model="",
                                   points=[(start, util, None), (start + dt.timedelta(seconds=STEP), util, None)])
              for sid, gpu, util in (("701", "0", 80.0), ("702", "1", 0.0))]  # fmt: skip
    assert gpu_usage_record(series, step=STEP)["gpus"] == 2
    report = job_gpu_report(job)
    assert [(g["task_index"], g["gpu"], g["util_mean"]) for g in report["gpus"]] == [(0, "0", 80.0), (1, "1", 0.0)]
    _store_summary(job, series)
    report = job_gpu_report(job)
    assert [(g["task_index"], g["gpu"], g["util_mean"]) for g in report["gpus"]] == [(0, "0", 80.0), (1, "1", 0.0)]
    assert [s["label"] for s in report["chart"]["series"]] == ["task 0 · a100-01 GPU 0", "task 1 · a100-01 GPU 1"]


def _cycle_queries(world, *, jobs: int, first_id: int) -> int:
    """The queries of one cycle's database part (record, freeze, busy hand-over, alerts) for ``jobs``
    running jobs of 4 GPUs each, half of which ended long enough ago to be frozen."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.services.gpu_usage import gpu_busy_hand_over

    start = timezone.now() - dt.timedelta(minutes=10)
    made = [_running_job(world, slurm_job_id=first_id + i) for i in range(jobs)]
    series = [_series(job, str(g), [50.0] * 5, start=start) for job in made for g in range(4)]
    gpu_usage_record(series, step=STEP)
    now = timezone.now()
    type(made[0]).objects.filter(pk__in=[j.pk for j in made[: jobs // 2]]).update(
        state=JobState.COMPLETED, ended_at=now - dt.timedelta(minutes=5))  # fmt: skip
    later = [_series(job, str(g), [60.0], start=now) for job in made for g in range(4)]
    with CaptureQueriesContext(connection) as queries:
        gpu_usage_record(later, step=STEP)
        assert gpu_usage_finalise(now=now, step=STEP) == 4 * (jobs // 2)
        gpu_busy_hand_over(job_ids=[j.pk for j in made], now=now)
        gpu_idle_alerts_check(now=now)
    return len(queries)


def test_the_sync_cycles_query_count_does_not_grow_with_the_jobs_and_gpus(world, settings):
    settings.PROMETHEUS_URL = ""  # the freeze's series are read from the real Prometheus in test_gpu_usage_prometheus.py
    few = _cycle_queries(world, jobs=2, first_id=100)
    many = _cycle_queries(world, jobs=40, first_id=1000)
    assert few == many, (few, many)
    assert JobGpuSummary.objects.count() == 1 + 20


def test_a_cycle_freezes_whole_jobs_at_most_its_share_and_the_rest_the_next(world, settings, monkeypatch):
    from jobs.services import gpu_usage

    settings.PROMETHEUS_URL = ""
    monkeypatch.setattr(gpu_usage, "FINALISE_JOBS_PER_CYCLE", 1)
    start = timezone.now() - dt.timedelta(minutes=10)
    jobs = [_running_job(world, gpus=4, slurm_job_id=600 + i) for i in range(2)]
    gpu_usage_record([_series(j, str(g), [30.0] * 3, start=start) for j in jobs for g in range(4)], step=STEP)
    now = timezone.now()
    type(jobs[0]).objects.filter(pk__in=[j.pk for j in jobs]).update(state=JobState.COMPLETED, ended_at=now - dt.timedelta(minutes=5))
    assert gpu_usage_finalise(now=now, step=STEP) == 4  # one job, all of its GPUs
    assert gpu_usage_finalise(now=now, step=STEP) == 4
    assert gpu_usage_finalise(now=now, step=STEP) == 0
    assert sorted(len(job_gpu_report(j)["gpus"]) for j in jobs) == [4, 4] and JobGpuSummary.objects.count() == 2
