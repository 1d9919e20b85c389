"""Parsing of real Slurm 22.05.8 output (captured from the local cluster, scripts/cluster up)."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from portal.slurm import cli, parsing
from portal.slurm.types import AssociationLimits

US = parsing.FIELD_SEP  # "\x1f", shown as ^_ by cat -A


def _captured(*lines: str) -> str:
    """Output captured with cat -A, one record a line: each ^_ back to the field separator."""
    return "\n".join(line.replace("^_", US) for line in lines)


# squeue -h -a -t all -o <cli.QUEUE_FORMAT> (%Q, the priority, before %j)
SQUEUE_SAMPLE = _captured(
    "6^_zzslurmtest^_zztestacct^_gpu^_COMPLETED^_None^_h100-01^_1^_2026-11-30T11:11:39^_2026-11-30T11:11:40^_2026-11-30T11:11:40^_1:00:00^_gres:gpu:h100:1^_(null)^_6^_6^_N/A^_0^_sbatch^_(null)",
    "13^_root^_zzprobe^_gpu^_PENDING^_Resources^_^_2^_2026-11-30T11:11:49^_2026-11-30T12:11:49^_2026-11-30T13:11:49^_1:00:00^_gres:gpu:a100:2^_(null)^_13^_13^_N/A^_4294901755^_sbatch^_two",
    "11^_zzslurmtest^_zztestacct^_gpu^_PENDING^_AssocGrpGRES^_^_1^_2026-11-30T11:11:49^_N/A^_N/A^_1:00:00^_gres:gpu:1^_(null)^_11^_11^_N/A^_4294901757^_sbatch^_(null)",
    "12^_root^_zzprobe^_gpu^_RUNNING^_None^_a100-02^_1^_2026-11-30T11:11:49^_2026-11-30T11:11:50^_2026-11-30T11:16:50^_5:00^_gres:gpu:a100:1^_(null)^_12^_12^_N/A^_0^_x;rm -rf /|$(id)^_gpuportal:abc|def",
    "3^_zzslurmtest^_zztestacct^_gpu^_COMPLETED^_None^_a100-01^_1^_2026-11-30T11:11:18^_2026-11-30T11:11:19^_2026-11-30T11:11:19^_3-00:00:00^_N/A^_resv1^_3^_3^_N/A^_0^_sbatch^_(null)",
    "20_[1-4]^_root^_zzprobe^_gpu^_PENDING^_None^_^_1^_2026-11-30T11:11:49^_N/A^_N/A^_UNLIMITED^_N/A^_(null)^_20^_20^_1-4^_4294901750^_arr^_(null)",
)

# sacct -X -a --parsable2 --noheader --delimiter=$'\x1f' -o <cli.SACCT_FIELDS>
SACCT_SAMPLE = _captured(
    "1^_zzslurmtest^_zztestacct^_gpu^_COMPLETED^_0:0^_2026-11-30T11:11:13^_2026-11-30T11:11:13^_2026-11-30T11:11:13^_0^_60^_1^_a100-01^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_^_gpuportal^_1^_sbatch^_",
    "11^_zzslurmtest^_zztestacct^_gpu^_CANCELLED by 0^_0:0^_2026-11-30T11:11:49^_2026-11-30T11:11:51^_2026-11-30T11:11:51^_0^_60^_1^_None assigned^_^_billing=1,cpu=1,gres/gpu=1,mem=1G,node=1^_^_gpuportal^_11^_sbatch^_",
    "12^_root^_zzprobe^_gpu^_COMPLETED^_0:0^_2026-11-30T11:11:49^_2026-11-30T11:11:50^_2026-11-30T11:11:52^_2^_5^_1^_a100-02^_billing=2,cpu=2,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_^_gpuportal^_12^_x;rm -rf /|$(id)^_gpuportal:abc|def",
    "13^_root^_zzprobe^_gpu^_CANCELLED by 0^_0:0^_2026-11-30T11:11:49^_2026-11-30T11:11:51^_2026-11-30T11:11:52^_1^_60^_2^_a100-[01-02]^_billing=4,cpu=4,gres/gpu:a100=4,gres/gpu=4,mem=4G,node=2^_billing=2,cpu=2,gres/gpu:a100=4,gres/gpu=4,mem=2G,node=2^_^_gpuportal^_13^_sbatch^_two",
    "15^_zzslurmtest^_zztestacct^_gpu^_FAILED^_1:0^_2026-11-30T11:11:52^_None^_2026-11-30T11:11:55^_0^_UNLIMITED^_1^_None assigned^_^_billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=1G,node=1^_resv1^_gpuportal^_15^_sbatch^_",
    # 22.05, 2026-12-07: a batch script that ran `kill -9 $$`; one whose --output its user could not write
    "18063^_alice^_vision^_gpu^_FAILED^_0:9^_2026-12-07T23:56:00^_2026-12-07T23:56:00^_2026-12-07T23:56:00^_0^_1^_1^_a100-01^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_^_gpuportal^_18063^_k.sh^_",
    "18061^_alice^_vision^_gpu^_FAILED^_0:53^_2026-12-07T23:54:56^_2026-12-07T23:54:57^_2026-12-07T23:54:57^_0^_2^_1^_a100-01^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,mem=1G,node=1^_^_gpuportal^_18061^_resnet^_gpuportal:d0e70a4d-2da6-43c0-8cfa-2b9c3d83596d",
)

SCONTROL_PARTITIONS = """\
PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A DefaultTime=01:00:00 DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=3-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=a100-[01-02],h100-01 PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=96 TotalNodes=3 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=96,mem=750G,node=3,billing=96,gres/gpu=12,gres/gpu:a100=8,gres/gpu:h100=4
PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A DefaultTime=00:10:00 DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=01:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=a100-[01-02],h100-01 PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=96 TotalNodes=3 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=96,mem=750G,node=3,billing=96,gres/gpu=12,gres/gpu:a100=8,gres/gpu:h100=4
PartitionName=long AllowGroups=ALL Default=NO DefaultTime=NONE MaxTime=UNLIMITED Nodes=(null) State=DOWN
"""

SCONTROL_NODES = """\
NodeName=a100-01 Arch=x86_64 CoresPerSocket=16  CPUAlloc=2 CPUEfctv=32 CPUTot=32 CPULoad=0.31 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:4 NodeAddr=127.0.0.1 NodeHostName=vm Port=6821 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=256000 AllocMem=2048 FreeMem=23276 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,debug  BootTime=2026-11-30T11:04:19 SlurmdStartTime=2026-11-30T11:11:08 LastBusyTime=2026-11-30T11:11:23 CfgTRES=cpu=32,mem=250G,billing=32,gres/gpu=4,gres/gpu:a100=4 AllocTRES=cpu=2,mem=2G,gres/gpu=2,gres/gpu:a100=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=a100-02 Arch=x86_64 CoresPerSocket=16  CPUAlloc=0 CPUEfctv=32 CPUTot=32 CPULoad=0.31 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:4(S:0-1) NodeAddr=127.0.0.1 NodeHostName=vm Port=6822 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=256000 AllocMem=0 FreeMem=23276 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,debug  BootTime=2026-11-30T11:04:19 SlurmdStartTime=2026-11-30T11:11:08 LastBusyTime=2026-11-30T11:11:08 CfgTRES=cpu=32,mem=250G,billing=32,gres/gpu=4,gres/gpu:a100=4 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=gres/gpu count reported lower than configured (0 < 4) [root@2026-11-30T11:10:00]
NodeName=h100-01 Arch=x86_64 CoresPerSocket=16  CPUAlloc=0 CPUEfctv=32 CPUTot=32 CPULoad=0.31 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:4 NodeAddr=127.0.0.1 NodeHostName=vm Port=6823 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=256000 AllocMem=0 FreeMem=23276 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,debug  BootTime=2026-11-30T11:04:19 SlurmdStartTime=2026-11-30T11:11:08 LastBusyTime=2026-11-30T11:11:29 CfgTRES=cpu=32,mem=250G,billing=32,gres/gpu=4,gres/gpu:h100=4 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
"""

SCONTROL_RESERVATIONS = (
    "ReservationName=zzprobe_r StartTime=2026-12-30T10:00:00 EndTime=2026-12-30T11:00:00 Duration=01:00:00 "
    "Nodes=h100-01 NodeCnt=1 CoreCnt=32 Features=(null) PartitionName=(null) Flags=IGNORE_JOBS,SPEC_NODES "
    "TRES=cpu=32 Users=(null) Groups=(null) Accounts=zzprobe,vision Licenses=(null) State=INACTIVE "
    "BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
)

SACCTMGR_ASSOC = "gpuportal|root||||\ngpuportal|root|root|||\ngpuportal|zztestacct||root||\ngpuportal|zztestacct|zzslurmtest|||\ngpuportal|zzprobe|root|||\n"
SACCTMGR_USERS = "root|root\nzzslurmtest|zztestacct\n"


@pytest.fixture
def berlin_tz(monkeypatch):
    """Run with the host's local zone set to Europe/Berlin: Slurm's times must not depend on it."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_parse_time_is_utc_whatever_the_host_zone(berlin_tz):
    # The gateway runs Slurm with TZ=UTC: what it prints is UTC, in winter and summer time.
    assert parsing.parse_time("2026-11-30T11:11:39") == dt.datetime(2026, 11, 30, 11, 11, 39, tzinfo=dt.UTC)
    assert parsing.parse_time("2026-07-01T12:00:00") == dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.UTC)
    for empty in ("N/A", "Unknown", "None", "", "(null)"):
        assert parsing.parse_time(empty) is None


def test_format_time_is_utc(berlin_tz):
    assert parsing.format_time(dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC)) == "2026-11-30T10:00:00"
    berlin = dt.timezone(dt.timedelta(hours=2))
    assert parsing.format_time(dt.datetime(2026, 10, 25, 2, 30, tzinfo=berlin)) == "2026-10-25T00:30:00"


def test_slurm_commands_run_with_tz_utc(berlin_tz):
    from portal.slurm.cli import CliGateway

    assert CliGateway(cluster="c", timeout=5)._env["TZ"] == "UTC"


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("1:00:00", 60), ("5:00", 5), ("3-00:00:00", 4320), ("00:10:00", 10), ("60", 60), ("1-12", 2160),
     ("2-01:30", 2970), ("UNLIMITED", None), ("Partition_Limit", None), ("N/A", None), ("NONE", None)],
)  # fmt: skip
def test_parse_duration_minutes(text, minutes):
    assert parsing.parse_duration_minutes(text) == minutes


def test_parse_tres_mem_in_mib_and_ints():
    assert parsing.parse_tres("billing=1,cpu=1,gres/gpu:a100=2,gres/gpu=2,mem=1G,node=1") == {
        "billing": 1, "cpu": 1, "gres/gpu:a100": 2, "gres/gpu": 2, "mem": 1024, "node": 1,
    }  # fmt: skip
    assert parsing.parse_tres("mem=500M")["mem"] == 500
    assert parsing.parse_tres("mem=2048K")["mem"] == 2
    assert parsing.parse_tres("mem=1.50G")["mem"] == 1536
    assert parsing.parse_tres("mem=2T")["mem"] == 2 * 1024 * 1024
    assert parsing.parse_tres("gres/gpu=-1") == {"gres/gpu": -1}
    assert parsing.parse_tres("") == {}


def test_parse_gres_variants():
    assert parsing.parse_gres("gpu:a100:4(S:0)") == [("gpu", "a100", 4)]
    assert parsing.parse_gres("gpu:a100:4") == [("gpu", "a100", 4)]
    assert parsing.parse_gres("gpu:4") == [("gpu", "", 4)]
    assert parsing.parse_gres("gpu:a100:2(IDX:0,2),gpu:h100:0(IDX:N/A)") == [("gpu", "a100", 2), ("gpu", "h100", 0)]
    assert parsing.parse_gres("(null)") == []


def test_state_and_exit_code():
    assert parsing.base_state("CANCELLED by 0") == "CANCELLED"
    assert parsing.base_state("RUNNING") == "RUNNING"
    assert parsing.parse_exit_status("0:0") == (0, 0)
    assert parsing.parse_exit_status("1:0") == (1, 0)
    assert parsing.parse_exit_status("0:15") == (0, 15)  # the batch shell killed by SIGTERM
    assert parsing.parse_exit_status("0:53") == (0, 53)
    assert parsing.parse_exit_status("") == (None, None)


def test_expand_hostlist():
    assert parsing.expand_hostlist("a100-[01-02],h100-01") == ("a100-01", "a100-02", "h100-01")
    assert parsing.expand_hostlist("n[1-3,7]") == ("n1", "n2", "n3", "n7")
    assert parsing.expand_hostlist("(null)") == ()


def test_parse_kv_line_values_with_spaces():
    kv = parsing.parse_kv_line(SCONTROL_NODES.splitlines()[1])
    assert kv["OS"] == "Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0"
    assert kv["Reason"] == "gres/gpu count reported lower than configured (0 < 4) [root@2026-11-30T11:10:00]"
    assert kv["AllocTRES"] == ""


def test_parse_queue_sample():
    entries = {entry.job_id: entry for entry in cli.parse_queue(SQUEUE_SAMPLE)}
    assert set(entries) == {3, 6, 11, 12, 13, 20}
    assert (entries[20].array_job_id, entries[20].array_tasks) == (20, "1-4")  # the pending tasks of array 20
    assert (entries[12].array_job_id, entries[12].array_tasks) == (None, "")
    running = entries[12]
    assert running.name == "x;rm -rf /|$(id)"  # "|" and ";" inside fields are harmless
    assert running.comment == "gpuportal:abc|def"
    assert running.state == "RUNNING"
    assert running.nodes == "a100-02"
    assert running.time_limit_minutes == 5
    assert running.tres_per_node == "gres:gpu:a100:1"
    assert running.start_time is not None and running.start_time.tzinfo is not None
    pending = entries[11]
    assert (pending.state, pending.reason, pending.nodes) == ("PENDING", "AssocGrpGRES", "")
    assert pending.start_time is None and pending.end_time is None
    assert pending.comment == ""
    assert entries[13].num_nodes == 2
    # a pending job's %S is the scheduler's expected start (squeue --start's column), %Q its priority
    assert entries[13].start_time.isoformat() == "2026-11-30T12:11:49+00:00" and entries[13].priority == 4294901755
    assert (entries[13].gpu_type, entries[11].gpu_type, entries[3].gpu_type) == ("a100", "", "")
    assert entries[3].reservation == "resv1"
    assert entries[3].time_limit_minutes == 4320
    assert entries[6].reservation == ""


def test_parse_sacct_sample():
    records = {record.job_id: record for record in cli.parse_sacct(SACCT_SAMPLE)}
    first = records[1]
    assert (first.gpus, first.gpu_type, first.requested_gpus) == (1, "a100", 1)
    assert first.alloc_tres["mem"] == 1024
    assert first.state == "COMPLETED" and (first.exit_code, first.exit_signal) == (0, 0)
    assert first.time_limit_minutes == 60
    assert first.cluster == "gpuportal"
    cancelled = records[11]
    assert cancelled.state == "CANCELLED"
    assert cancelled.nodes == "" and cancelled.alloc_tres == {} and cancelled.gpus == 0
    assert cancelled.requested_gpus == 1
    tagged = records[12]
    assert tagged.name == "x;rm -rf /|$(id)"
    assert tagged.comment == "gpuportal:abc|def"
    assert tagged.elapsed_seconds == 2
    two = records[13]
    assert (two.num_nodes, two.nodes, two.gpus, two.alloc_tres["mem"]) == (2, "a100-[01-02]", 4, 4096)
    failed = records[15]
    assert (failed.exit_code, failed.exit_signal) == (1, 0) and failed.start_time is None and failed.time_limit_minutes is None
    assert (records[18063].state, records[18063].exit_code, records[18063].exit_signal) == ("FAILED", 0, 9)
    assert (records[18061].exit_code, records[18061].exit_signal) == (0, 53)
    assert failed.reservation == "resv1"
    assert failed.req_tres["gres/gpu:h100"] == 1


def test_parse_partitions_sample():
    parts = {p.name: p for p in cli.parse_partitions(SCONTROL_PARTITIONS)}
    assert parts["gpu"].is_default and parts["gpu"].max_time_minutes == 4320
    assert parts["gpu"].default_time_minutes == 60
    assert parts["gpu"].nodes == ("a100-01", "a100-02", "h100-01")
    assert not parts["debug"].is_default and parts["debug"].max_time_minutes == 60
    assert parts["long"].max_time_minutes is None and parts["long"].default_time_minutes is None
    assert parts["long"].state == "DOWN" and parts["long"].nodes == ()


def test_parse_nodes_sample():
    nodes = {n.name: n for n in cli.parse_nodes(SCONTROL_NODES)}
    assert sum(n.gpus_total for n in nodes.values() if n.gpu_type == "a100") == 8
    assert nodes["h100-01"].gpu_type == "h100" and nodes["h100-01"].gpus_total == 4
    busy = nodes["a100-01"]
    assert (busy.gpus_allocated, busy.cpus_allocated, busy.cpus_total, busy.memory_mb) == (2, 2, 32, 256000)
    assert busy.partitions == ("gpu", "debug") and busy.available
    drained = nodes["a100-02"]
    assert drained.state == "IDLE+DRAIN" and not drained.available
    assert drained.reason.startswith("gres/gpu count reported lower")


def test_parse_policy_samples():
    with_features = SCONTROL_NODES.replace("AvailableFeatures=(null)", "AvailableFeatures=ib,nvlink", 1)
    features = {node.name: node.features for node in cli.parse_nodes(with_features)}  # read with the nodes
    assert features == {"a100-01": ("ib", "nvlink"), "a100-02": (), "h100-01": ()}
    assoc = "vision|normal\nvision|high,normal\nnlp|\nroot|normal\n"  # a user row may allow more; nlp: not known
    assert cli.parse_account_qos(assoc) == {"vision": ("high", "normal"), "root": ("normal",)}
    config = "Configuration data as of 2026-12-01T09:00:00\nMaxArraySize            = 1001\nMaxJobCount             = 10000\n"
    assert cli.parse_max_array_size(config) == 1001
    assert cli.parse_max_array_size("MaxJobCount = 10000\n") is None
    assoc_mgr = "Current Association Manager state\n\nQOS Records\n\nQOS=normal(1)\n    UsageRaw=923.000000\nQOS=high(2)\n    MaxWallPJ=\n"
    assert cli.parse_assoc_mgr_qos(assoc_mgr) == ("high", "normal")


def test_parse_reservations_sample():
    (resv,) = cli.parse_reservations(SCONTROL_RESERVATIONS)
    assert resv.name == "zzprobe_r"
    assert resv.accounts == ("zzprobe", "vision")
    assert resv.nodes == "h100-01" and resv.tres == "cpu=32" and resv.state == "INACTIVE"
    assert resv.end - resv.start == dt.timedelta(hours=1)
    assert cli.parse_reservations("No reservations in the system\n") == []


def test_parse_associations_sample():
    assocs = cli.parse_associations(SACCTMGR_ASSOC, SACCTMGR_USERS)
    by_key = {(a.account, a.user): a for a in assocs}
    assert by_key[("zztestacct", "")].parent == "root"
    assert by_key[("zztestacct", "zzslurmtest")].is_default
    assert not by_key[("zzprobe", "root")].is_default
    assert by_key[("root", "root")].is_default


def test_parse_limits_and_update():
    out = "zzprobe||gres/gpu:a100=300,gres/gpu=600|gres/gpu=4\nzzprobe|root||\n"
    limits = cli.parse_limits("zzprobe", out)
    assert limits == AssociationLimits(
        account="zzprobe", grp_tres_mins={"gres/gpu:a100": 300, "gres/gpu": 600}, grp_tres={"gres/gpu": 4}
    )
    # Absent managed keys are cleared with -1; unmanaged keys (cpu) are left alone.
    assert cli.limits_update({"gres/gpu": 600, "gres/gpu:a100": 300, "cpu": 10}, {"gres/gpu": 900}) == {
        "gres/gpu": 900, "gres/gpu:a100": -1,
    }  # fmt: skip
    assert parsing.format_tres({"gres/gpu:a100": -1, "gres/gpu": 900}) == "gres/gpu=900,gres/gpu:a100=-1"


def test_parse_job_id():
    assert cli.parse_job_id("123\n") == 123
    assert cli.parse_job_id("123;gpuportal\n") == 123


def test_quirks_by_version():
    assert not cli._Quirks.for_version("22.05.8").reservation_gpu_tres
    assert cli._Quirks.for_version("25.11.1").reservation_gpu_tres


@pytest.mark.parametrize(
    ("printed", "normal"),
    [("gres:gpu:a100:2", "gres:gpu:a100:2"), ("gres/gpu:a100:2", "gres:gpu:a100:2"), ("N/A", ""), ("", ""),
     ("gres/gpu:h100:1,gres/shard:2", "gres:gpu:h100:1,gres:shard:2")],
)  # fmt: skip
def test_tres_per_node_one_form_for_22_05_and_25_11(printed, normal):
    assert parsing.tres_per_node(printed) == normal
