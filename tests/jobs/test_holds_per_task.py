"""What the budget holds until Slurm has charged it (issue 33), on recorded inventories and usage:
the estimate in GPU-seconds with the cluster's overrun past the time limit (OverTimeLimit, the
time-limit check, KillWait as the inventory sync reads them) and the partitions' allocation flags;
an array's hold released task by task; running usage without its tag matched by Slurm id and
counted once; a job without a GPU type held against every type it can land on; each job's real
cost in the API; the cost report over any ISO datetime range. The real cluster's side:
tests/accounting/test_holds_slurm.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from decimal import Decimal

import pytest
from django.utils import timezone

from accounting.models import BudgetHold, BudgetTotal, Rate
from accounting.services import budget_holds_identify, budget_holds_tasks_settle, usage_records_upsert
from jobs.models import Job
from jobs.services import job_quote, job_submit
from portal.exceptions import ApplicationError, Conflict
from portal.models import ClusterPolicyInfo, default_cluster_id
from portal.slurm.cli_output import parse_overrun_config, parse_partitions
from portal.slurm.types import OVER_TIME_UNLIMITED, PartitionLimits
from tests.accounting.helpers import acct
from tests.factories import QuotaFactory

pytestmark = pytest.mark.django_db

PARTITIONS = (
    "PartitionName=gpu AllowGroups=ALL Default=YES DefaultTime=01:00:00 ExclusiveUser=NO MaxTime=3-00:00:00 "
    "Nodes=a100-[01-02],h100-01 OverSubscribe=NO OverTimeLimit=NONE State=UP JobDefaults=(null) "
    "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED\n"
    "PartitionName=train Default=NO ExclusiveUser=YES MaxTime=3-00:00:00 Nodes=a100-01 OverSubscribe=EXCLUSIVE "
    "OverTimeLimit=UNLIMITED State=UP JobDefaults=DefMemPerGPU=16384 MaxMemPerNode=65536\n"
)


def test_scontrol_output_gives_the_overrun_and_each_partitions_allocation_flags():
    """The partitions' flags are read with the partitions themselves (Partition.limits): no second
    ``scontrol show partition``."""
    assert parse_overrun_config("KillWait                = 5 sec\nOverTimeLimit           = 0 min\n") == (0, 5)
    assert parse_overrun_config("KillWait = 30 sec\nOverTimeLimit = UNLIMITED\n") == (OVER_TIME_UNLIMITED, 30)
    assert parse_overrun_config("MaxArraySize = 1001\n") == (0, 30)  # Slurm's defaults
    limits = {partition.name: partition.limits for partition in parse_partitions(PARTITIONS)}
    assert limits["gpu"] == PartitionLimits()
    assert limits["train"] == PartitionLimits(exclusive=True, exclusive_user=True, over_time_limit_minutes=OVER_TIME_UNLIMITED,
                                              def_mem_per_gpu_mb=16384, max_mem_per_node_mb=65536)  # fmt: skip


def _policy(**fields) -> ClusterPolicyInfo:
    from portal.snapshots import INVENTORY, snapshot_changed

    policy = ClusterPolicyInfo.objects.create(cluster_id=default_cluster_id(), seen_at=timezone.now(), **fields)
    snapshot_changed(INVENTORY)
    return policy


def shape(**fields) -> dict:
    return {"team": None, "script": "", "partition": "gpu", "gpu_type": "a100", "gpus": 2, "nodes": None,
            "cpus_per_gpu": None, "memory_gb": None, "time_limit_minutes": 10} | fields  # fmt: skip


def quote(**fields):
    fields = shape(**fields)
    fields.pop("team")
    return job_quote(**fields)


def test_the_estimate_adds_what_the_cluster_lets_a_job_run_past_its_limit(inventory):
    # OverTimeLimit 1 min, KillWait 5 s: ended at the first 30 s check after limit + 1 min, + KillWait
    _policy(over_time_limit_minutes=1, kill_wait_seconds=5, partition_limits={"debug": {"over_time_limit_minutes": 0}})
    gpu = quote()
    assert (gpu.overrun_seconds, gpu.gpu_seconds) == (95, 2 * (600 + 95))
    assert gpu.gpu_hours == Decimal("0.386112")  # 1390 GPU-s to six places, rounded up: never below the charge
    debug = quote(partition="debug")  # the partition's own OverTimeLimit wins
    assert (debug.overrun_seconds, debug.gpu_seconds) == (35, 2 * 635)


def test_an_exclusive_partition_is_held_as_whole_nodes_and_unbounded_overtime_is_refused(inventory):
    _policy(kill_wait_seconds=5, partition_limits={"gpu": {"exclusive": True}, "debug": {"over_time_limit_minutes": -1}})
    whole = quote(gpus=1)
    assert whole.gpu_seconds == 4 * (600 + 35) and "OverSubscribe=EXCLUSIVE" in whole.note
    with pytest.raises(ApplicationError) as refused:
        quote(partition="debug")
    assert "OverTimeLimit=UNLIMITED" in refused.value.message and "time_limit_minutes" in refused.value.errors


def test_the_partitions_memory_limits_are_applied(inventory):
    _policy(partition_limits={"gpu": {"max_mem_per_node_mb": 8192}, "debug": {"def_mem_per_gpu_mb": 100000}})
    with pytest.raises(ApplicationError) as capped:
        quote(memory_gb=16)  # MaxMemPerNode 8 GB
    assert "memory_gb" in capped.value.errors and "8 GB" in capped.value.errors["memory_gb"][0]
    with pytest.raises(ApplicationError) as defaults:
        quote(partition="debug", gpus=4)  # DefMemPerGPU × 4 GPUs is more than a node has
    assert "Memory specification can not be satisfied" in defaults.value.errors["memory_gb"][0]
    assert quote(partition="debug", gpus=4, memory_gb=64).gpu_seconds == 4 * (600 + 60)  # memory asked: no default applies


# ---------------------------------------------------------------- holds follow each task


def _task(job, *, task_id: int, index: int, start, seconds: int | None, tagged: bool = True, gpu_type: str = "a100"):
    """One array task's sacct record (``seconds`` None: running, 60 s so far; untagged: Comment empty)."""
    record = acct(start=start, hours=(seconds / 3600) if seconds is not None else None, gpus=1, job_id=task_id,
                  comment=job.slurm_tag if tagged else "", gpu_type=gpu_type, state="COMPLETED" if seconds else "RUNNING")  # fmt: skip
    if seconds is None:
        record = dataclasses.replace(record, elapsed_seconds=60)
    return dataclasses.replace(record, array_job_id=job.slurm_job_id if job.array else None, array_tasks=str(index) if job.array else "")


def test_a_throttled_array_keeps_holding_the_tasks_still_to_run_and_running_usage_counts_once(world, inventory, relays):
    job, _ = job_submit(user=world.alice, team=world.vision, script="#!/bin/bash\n#SBATCH --array=0-2%1\ntrue\n",
                        partition="gpu", gpu_type="a100", gpus=1, time_limit_minutes=10)  # fmt: skip
    start = timezone.now() - dt.timedelta(minutes=20)
    Job.objects.filter(pk=job.pk).update(slurm_job_id=500, slurm_cluster="gpuportal")
    BudgetHold.objects.filter(pk=job.pk).update(created_at=start - dt.timedelta(minutes=1))  # placed before Slurm had it
    job.refresh_from_db()
    hold = BudgetHold.objects.get(pk=job.pk)
    assert (hold.tasks, hold.task_gpu_hours, hold.held_gpu_hours) == (3, Decimal("0.166667"), Decimal("0.500000"))

    usage_records_upsert(records=[_task(job, task_id=501, index=0, start=start, seconds=300)])  # task 0 final
    hold.refresh_from_db()
    assert hold.released_at is None and hold.held_gpu_hours == Decimal("0.333334")  # tasks 1, 2 still held

    # task 1 runs; sacct gives no Comment while it runs: matched by the id the sync told the hold
    assert budget_holds_identify(jobs=[(job.pk, "gpuportal", 500, start)]) == 1
    # an array's tasks carry the array's submit time (the portal learnt its id at ``start``)
    task = _task(job, task_id=502, index=1, start=start + dt.timedelta(minutes=6), seconds=None, tagged=False)
    usage_records_upsert(records=[dataclasses.replace(task, submit_time=start - dt.timedelta(seconds=30))])
    hold.refresh_from_db()
    assert hold.held_gpu_hours == Decimal("0.316667")  # task 2's share + task 1's share less its 60 s so far
    used = Decimal(300 + 60) / 3600
    total = BudgetTotal.objects.get(team=world.vision, gpu_type="")
    # used + held: task 0's real use, task 1's share (used so far + still held), task 2's share
    assert abs(total.used_gpu_hours + total.held_gpu_hours - (Decimal(300) / 3600 + 2 * Decimal("0.166667"))) <= Decimal("0.000003")
    assert abs(total.used_gpu_hours - used) <= Decimal("0.000001")

    usage_records_upsert(records=[_task(job, task_id=502, index=1, start=start + dt.timedelta(minutes=6), seconds=240),
                                  _task(job, task_id=503, index=2, start=start + dt.timedelta(minutes=11), seconds=120)])  # fmt: skip
    hold.refresh_from_db()
    assert hold.released_at is not None and hold.held_gpu_hours == 0  # the last task's final record


def test_running_usage_of_a_job_that_reused_the_id_is_not_charged_to_the_hold(world, inventory, relays):
    """Slurm lost its state after the portal learnt job 700; a later job got id 700 and runs: its
    sacct record has no Comment. It is not the hold's job (submitted after the portal learnt the id:
    portal.slurm.tags.record_is_job), so it changes neither the hold nor who the usage belongs to;
    the same record submitted while the portal sent the job is the hold's."""
    from accounting.models import UsageRecord

    job, _ = job_submit(user=world.alice, team=world.vision, script="true", partition="gpu", gpu_type="a100", gpus=1,
                        time_limit_minutes=60)  # fmt: skip
    sent = timezone.now() - dt.timedelta(hours=3)
    BudgetHold.objects.filter(pk=job.pk).update(created_at=sent)
    assert budget_holds_identify(jobs=[(job.pk, "gpuportal", 700, sent + dt.timedelta(seconds=1))]) == 1
    held = BudgetHold.objects.get(pk=job.pk).held_gpu_hours

    start = timezone.now() - dt.timedelta(minutes=30)  # the other job: submitted a minute before it started
    usage_records_upsert(records=[acct(start=start, hours=None, job_id=700, comment="")])
    row = UsageRecord.objects.get(job_id=700)
    assert row.portal_job_uuid is None
    assert BudgetHold.objects.get(pk=job.pk).held_gpu_hours == held

    ours = dataclasses.replace(acct(start=start, hours=None, job_id=700, comment=""), submit_time=sent + dt.timedelta(seconds=1))
    usage_records_upsert(records=[ours])
    assert UsageRecord.objects.get(job_id=700, submit_time=ours.submit_time).portal_job_uuid == job.pk
    assert BudgetHold.objects.get(pk=job.pk).held_gpu_hours < held


def test_tasks_cancelled_before_they_ran_stop_holding_when_the_array_ends(world, inventory, relays):
    job, _ = job_submit(user=world.alice, team=world.vision, script="#!/bin/bash\n#SBATCH --array=0-3\ntrue\n",
                        partition="gpu", gpu_type="a100", gpus=1, time_limit_minutes=6)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(slurm_job_id=600, slurm_cluster="gpuportal")
    job.refresh_from_db()
    usage_records_upsert(records=[_task(job, task_id=601, index=0, start=timezone.now() - dt.timedelta(minutes=9), seconds=60)])
    hold = BudgetHold.objects.get(pk=job.pk)
    assert hold.released_at is None and hold.held_gpu_hours == 3 * Decimal("0.1")  # tasks 1-3 may still run
    assert budget_holds_tasks_settle(ran={job.pk: 1}) == 1  # the sync: the array ended, one task ran
    hold.refresh_from_db()
    assert hold.released_at is not None and hold.held_gpu_hours == 0 and hold.tasks == 1
    assert budget_holds_tasks_settle(ran={job.pk: 1}) == 0  # idempotent


def test_a_job_without_a_type_is_held_against_every_type_it_can_land_on_and_charged_at_the_one_it_got(world, inventory, relays):
    today = timezone.localdate()
    period = {"period_start": today - dt.timedelta(days=1), "period_end": today + dt.timedelta(days=2)}
    QuotaFactory(team=world.vision, gpu_hours=100, **period)
    QuotaFactory(team=world.vision, gpu_type="a100", gpu_hours=10, **period)
    QuotaFactory(team=world.vision, gpu_type="h100", gpu_hours=3, **period)
    with pytest.raises(Conflict) as refused:  # 4 GPU-h could land on h100, whose budget has 3
        job_submit(user=world.alice, team=world.vision, script="true", partition="gpu", gpu_type="", gpus=4, time_limit_minutes=60)
    assert "h100 GPU-h left" in refused.value.message
    job, _ = job_submit(user=world.alice, team=world.vision, script="true", partition="gpu", gpu_type="", gpus=2, time_limit_minutes=60)
    hold = BudgetHold.objects.get(pk=job.pk)
    assert hold.gpu_types == ("a100", "h100")
    held = {t.gpu_type: t.held_gpu_hours for t in BudgetTotal.objects.filter(team=world.vision)}
    assert held == {"": 2, "a100": 2, "h100": 2}
    # it runs on h100: the a100 budget stops holding it, the h100 one holds what it has not used yet
    Job.objects.filter(pk=job.pk).update(slurm_job_id=700, slurm_cluster="gpuportal")
    job.refresh_from_db()
    running = dataclasses.replace(acct(start=timezone.now() - dt.timedelta(minutes=30), hours=None, gpus=2, job_id=700,
                                       comment=job.slurm_tag, gpu_type="h100"), elapsed_seconds=1800)  # fmt: skip
    usage_records_upsert(records=[running])
    hold.refresh_from_db()
    assert hold.gpu_types == ("h100",)
    totals = {t.gpu_type: (t.held_gpu_hours, t.used_gpu_hours) for t in BudgetTotal.objects.filter(team=world.vision)}
    assert totals == {"": (1, 1), "a100": (0, 0), "h100": (1, 1)}


# ---------------------------------------------------------------- what it really cost


@pytest.fixture
def costed_array(world, inventory, relays):
    """A two-task array of 1 a100 (10 CNY/GPU-h) whose tasks ran 900 s and 1800 s, as sacct records them."""
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), currency="CNY", effective_from=dt.date(2020, 1, 1))
    job, _ = job_submit(user=world.alice, team=world.vision, script="#!/bin/bash\n#SBATCH --array=0-1\ntrue\n",
                        partition="gpu", gpu_type="a100", gpus=1, time_limit_minutes=30)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(slurm_job_id=800, slurm_cluster="gpuportal")
    job.refresh_from_db()
    start = timezone.now() - dt.timedelta(hours=1)
    usage_records_upsert(records=[_task(job, task_id=801, index=0, start=start, seconds=900),
                                  _task(job, task_id=802, index=1, start=start, seconds=1800)])  # fmt: skip
    from jobs.models import JobArrayTask

    JobArrayTask.objects.create(job=job, index=0, slurm_job_id=801, state="COMPLETED")
    JobArrayTask.objects.create(job=job, index=1, slurm_job_id=802, state="COMPLETED")
    return job


def test_the_job_api_shows_what_a_job_really_cost_beside_its_estimate(world, costed_array, api_client_for):
    job = costed_array
    client = api_client_for("member")
    detail = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["estimated_gpu_seconds"], detail["estimated_gpu_hours"], detail["estimated_cost"]) == (3600, "1.00", "10.00")
    assert (detail["gpu_seconds"], detail["gpu_hours"], detail["cost"], detail["usage_final"]) == (2700, "0.75", "7.50", True)
    assert [(t["index"], t["gpu_seconds"], t["cost"]) for t in detail["tasks"]] == [(0, 900, "2.50"), (1, 1800, "5.00")]
    listed = client.get("/api/v1/jobs/").json()["results"]
    assert [(j["gpu_seconds"], j["cost"]) for j in listed if j["id"] == str(job.pk)] == [(2700, "7.50")]
    from django.test import Client

    browser = Client()
    browser.force_login(world.alice)
    body = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "0.75 GPU-hours (2700 GPU-s), 7.50 CNY" in body
    for task in detail["tasks"]:  # the page's array table: each task's own figures, as the API's
        row = re.search(rf'<tr data-task="{task["index"]}".*?</tr>', body, re.DOTALL).group(0)
        assert re.findall(r'<td class="num">([0-9.]+)</td>', row)[-2:] == [task["gpu_hours"], task["cost"]], row
    assert "7.50 CNY" in browser.get("/jobs/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_cli_status_shows_the_real_cost_per_task_as_the_api_answers(world, costed_array, live_server, capsys, api_client_for):
    from gpuportal_cli.main import main

    from portal.services import api_token_create

    job = costed_array
    detail = api_client_for("member").get(f"/api/v1/jobs/{job.pk}/").json()
    key = api_token_create(user=world.alice, name="cli status")[1]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUPORTAL_URL", live_server.url)
        env.setenv("GPUPORTAL_TOKEN", key)
        assert main(["status", str(job.pk)]) == 0
    out = capsys.readouterr().out
    assert f"Used:        {detail['gpu_hours']} GPU-hours ({detail['gpu_seconds']} GPU-s), {detail['cost']} CNY" in out, out
    for task in detail["tasks"]:  # TASK STATE SLURM EXIT GPU-HOURS COST, one row per task
        exit_cell = "—" if task["exit_code"] is None else str(task["exit_code"])
        assert re.search(rf"^\s*{task['index']}\s+COMPLETED\s+{task['slurm_job_id']}\s+{exit_cell}\s+{re.escape(task['gpu_hours'])}\s+{re.escape(task['cost'])}\b",
                         out, re.MULTILINE), out  # fmt: skip


def test_the_cli_status_line_shows_the_real_cost():
    from gpuportal_cli.output import _used_line

    assert _used_line({"gpu_seconds": None}) == ""
    job = {"gpu_seconds": 2700, "gpu_hours": "0.75", "cost": "7.50", "currency": "CNY", "usage_final": False}
    assert _used_line(job) == "0.75 GPU-hours (2700 GPU-s), 7.50 CNY so far"


def test_the_cost_report_takes_one_hour_as_iso_datetimes(world, api_client_for):
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("10"), currency="CNY", effective_from=dt.date(2020, 1, 1))
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)
    # 2 GPUs from hh:30 to hh+1:30: half of it in the hour asked for
    usage_records_upsert(records=[acct(start=hour - dt.timedelta(minutes=30), hours=1.0, gpus=2)])
    client = api_client_for("finance")
    start, end = hour.strftime("%Y-%m-%dT%H:%M:%SZ"), (hour + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = client.get("/api/v1/reports/cost/", {"start": start, "end": end, "group_by": "team"}).json()
    assert [(r["key"], r["gpu_hours"], r["cost"]) for r in body["results"]] == [("vision", "1.00", "10.00")], body
    assert dt.datetime.fromisoformat(body["start_at"]) == hour and dt.datetime.fromisoformat(body["end_at"]) == hour + dt.timedelta(hours=1)
    backwards = client.get("/api/v1/reports/cost/", {"start": end, "end": start})
    assert backwards.status_code == 400 and "end" in backwards.json()["errors"]
    assert client.get("/api/v1/reports/cost/", {"start": "yesterday"}).json()["errors"]["start"]
