"""The benchmarks still run: ``bench/run_all.py --quick`` end to end (its own database, Redis
databases and port, the real cluster, gunicorn and Celery) writes every section with figures and
exits 0. No figure is judged here — timings belong to bench/, not to tests — only that each
benchmark finished and printed what it measures, so a schema change cannot silently break them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import skip_unless_ci

ROOT = Path(__file__).resolve().parents[2]

SECTIONS = {  # heading start → a figure its table must hold
    "## Profile of one single-job POST": "queries per single-job POST",
    "## Relay:": "ratio portal batch / raw",
    "## Single-job POSTs on the demo's processes:": "open loop 20/s: p99",
    "## API accept latency:": "accept latency p99",
    "## Sync at scale:": "Slurm calls per cycle",
    "## Ingestion:": "ingest, sacct read + upsert",
    "## Pages:": "POST /api/v1/jobs/ (one job) with these jobs in the team's history",
    "## Accounting:": "sreport GPU-minutes per account",
    "## GPU usage:": "next cycles:",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slurm
@pytest.mark.celery
def test_every_benchmark_runs_at_quick_sizes_and_writes_its_figures(tmp_path):
    from tests.conftest import _cluster_reachable

    problem = _cluster_reachable()
    if problem:
        skip_unless_ci(f"local Slurm cluster not reachable (scripts/cluster up): {problem}")
    results = tmp_path / "results.md"
    env = os.environ | {
        "BENCH_DB": f"gpuportal_bench_t{os.getpid()}",  # never the one `make bench` uses
        "BENCH_REDIS_DB": "10",  # 10 and 11: not the demo's, the tests' or `make bench`'s
        "BENCH_PORT": str(_free_port()),
    }
    proc = subprocess.run(
        [sys.executable, "bench/run_all.py", "--quick", "--results", str(results)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    text = results.read_text()
    assert "Quick mode" in text
    for heading, figure in SECTIONS.items():
        assert heading in text, f"missing section {heading}"
        section = text[text.index(heading):].split("\n## ", 1)[0]
        assert figure in section, f"{heading} lacks {figure!r}"
        assert "failed" not in section.splitlines()[0] and "exited with" not in section
    # every figure row carries a number and says over how many runs
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith(("| what", "| |"))]
    figure_rows = [row for row in rows if row.count("|") == 4]
    assert len(figure_rows) > 30
    assert all(re.search(r"\| [\d,.]+ ", row) for row in figure_rows), [r for r in figure_rows if not re.search(r"\| [\d,.]+ ", r)][:3]
    # and the cluster is left without bench jobs
    from django.conf import settings

    squeue = subprocess.run(["squeue", "-h", "-A", "gpbench", "-o", "%i"], capture_output=True, text=True, timeout=60,
                            env=os.environ | ({"SLURM_CONF": settings.SLURM_CONF} if settings.SLURM_CONF else {}))  # fmt: skip
    assert squeue.returncode == 0 and squeue.stdout.strip() == "", squeue.stdout
