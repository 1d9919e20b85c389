"""Several clusters: one inventory sync and one jobs sync cycle per cluster, for the two local
clusters (22.05 cli, 25.11 cli) and for a third whose controller port nothing listens on (a copy of
the 22.05 configuration: the shared daemons are never touched), and what a submission costs in
queries with one cluster and with two.

    eval "$(scripts/services up)" && BENCH_DB=gpuportal_bench_clusters .venv/bin/python bench/bench_clusters.py [--runs 5]

Prints per cluster: the median time of ``cluster_sync(cluster=…)`` and of ``jobs_sync(cluster=…)``
(no live jobs: one squeue each when there are some, none here; the figure is the cycle's fixed cost),
the gateway calls of one cycle, and how long the dead cluster takes to fail (bounded by
SLURM_TIMEOUT). No thresholds."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


def cluster25_env() -> dict[str, str]:
    proc = subprocess.run([str(common.ROOT / "scripts" / "cluster"), "env", "--slurm", "25.11"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if proc.returncode:
        sys.exit(f"no Slurm 25.11 cluster: {proc.stderr.strip()}")
    return dict(line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def dead_conf(conf: str) -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    lines = [f"SlurmctldPort={port}" if line.startswith("SlurmctldPort=") else line for line in Path(conf).read_text().splitlines()]
    path = Path(tempfile.mkdtemp(prefix="gpuportal-bench-dead-")) / "slurm.conf"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    common.setup(fresh=True)
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import portal.slurm as slurm
    from jobs.services import job_submit, jobs_sync
    from portal.models import TeamClusterAccount
    from portal.services import cluster_row, cluster_sync, clusters_record
    from portal.slurm import ClusterConfig, SlurmError
    from tests.support import CountingGateway

    env25 = cluster25_env()
    settings.SLURM_TIMEOUT = 3
    old = ClusterConfig(settings.SLURM_CLUSTER, "cli", settings.SLURM_CONF, settings.SLURM_BIN_DIR)
    new = ClusterConfig(env25["SLURM_CLUSTER"], "cli", env25["SLURM_CONF"], env25["SLURM_BIN_DIR"], env25.get("SLURM_LIB_DIR", ""))
    dead = ClusterConfig("benchdown", "cli", dead_conf(settings.SLURM_CONF))
    common.print_header("Several clusters: per-cluster sync cycles (bench_clusters.py)")
    print(common.machine())

    # submission queries: one cluster, then two (the team's accounts per cluster: one query more)
    settings.GPUPORTAL_CLUSTERS = (old,)
    slurm.reset_gateway()
    clusters_record()
    cluster_sync()
    world = common.world(slurm=False)
    script = "#!/bin/bash\ntrue\n"
    counts = {}
    for label, clusters in (("one cluster", (old,)), ("two clusters", (old, new))):
        settings.GPUPORTAL_CLUSTERS = clusters
        slurm.reset_gateway()
        clusters_record()
        for config in clusters:
            cluster_sync(cluster=config.name)
        if len(clusters) > 1:
            TeamClusterAccount.objects.get_or_create(team=world.team, cluster=cluster_row(new.name),
                                                     defaults={"slurm_account": world.team.slurm_account})  # fmt: skip
        kwargs = {"cluster": old.name} if len(clusters) > 1 else {}
        job_submit(user=world.user, team=world.team, script=script, gpus=1, partition="debug", time_limit_minutes=1, **kwargs)
        with CaptureQueriesContext(connection) as queries:
            job_submit(user=world.user, team=world.team, script=script, gpus=1, partition="debug", time_limit_minutes=1, **kwargs)
        counts[label] = len(queries)
    print("submission queries: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    from jobs.models import Job

    Job.objects.all().delete()  # never relayed: nothing in Slurm

    settings.GPUPORTAL_CLUSTERS = (old, new, dead)
    slurm.reset_gateway()
    clusters_record()
    for config in (old, new, dead):
        slurm._gateways[config.name] = CountingGateway(slurm.get_gateway(config.name))
    for config in (old, new, dead):
        inventory, jobs, failed = [], [], []
        for _ in range(args.runs):
            started = time.monotonic()
            try:
                cluster_sync(cluster=config.name)
                inventory.append(time.monotonic() - started)
            except SlurmError:
                failed.append(time.monotonic() - started)
            started = time.monotonic()
            jobs_sync(cluster=config.name)
            jobs.append(time.monotonic() - started)
        calls = dict(slurm._gateways[config.name].calls)
        per_cycle = {name: count / args.runs for name, count in sorted(calls.items())}
        if failed:
            print(f"{config.name}: down: cluster_sync fails in {common.median(failed) * 1000:.0f} ms (median of {len(failed)}; "
                  f"SLURM_TIMEOUT {settings.SLURM_TIMEOUT} s); jobs_sync {common.median(jobs) * 1000:.1f} ms; calls per cycle {per_cycle}")
        else:
            print(f"{config.name}: cluster_sync {common.median(inventory) * 1000:.1f} ms, jobs_sync {common.median(jobs) * 1000:.1f} ms "
                  f"(medians of {args.runs}); calls per cycle {per_cycle}")
    slurm.reset_gateway()


if __name__ == "__main__":
    main()
