"""Hand-made AccountingRecords for accounting tests (the sacct parse is the gateway's); the text of a PDF."""

from __future__ import annotations

import datetime as dt
import itertools
import subprocess

from portal.slurm import AccountingRecord

UTC = dt.timezone.utc
_ids = itertools.count(1000)


def at(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def acct(
    *,
    account: str = "vision",
    user: str = "alice",
    start: dt.datetime | None = None,
    hours: float | None = 1.0,
    gpus: int = 1,
    gpu_type: str = "a100",
    partition: str = "gpu",
    state: str = "COMPLETED",
    time_limit_minutes: int | None = 120,
    job_id: int | None = None,
    comment: str = "",
    num_nodes: int = 1,
    cluster: str = "gpuportal",
) -> AccountingRecord:
    """A job that ran ``hours`` (None: still running, elapsed so far = 1 h) from ``start``."""
    start = start or at(2026, 1, 10, 8)
    seconds = int((hours if hours is not None else 1.0) * 3600)
    end = start + dt.timedelta(seconds=seconds) if hours is not None else None
    tres = {"cpu": gpus, "mem": 1024, "node": num_nodes}
    if gpus:
        tres |= {"gres/gpu": gpus, f"gres/gpu:{gpu_type}": gpus}
    return AccountingRecord(
        job_id=job_id if job_id is not None else next(_ids),
        name="train",
        user=user,
        account=account,
        partition=partition,
        state=state if hours is not None else "RUNNING",
        exit_code=0,
        submit_time=start - dt.timedelta(minutes=1),
        start_time=start,
        end_time=end,
        elapsed_seconds=seconds,
        time_limit_minutes=time_limit_minutes,
        num_nodes=num_nodes,
        nodes="a100-01",
        alloc_tres=tres,
        req_tres=tres,
        comment=comment,
        cluster=cluster,
    )


def never_started(*, account: str = "vision", user: str = "alice") -> AccountingRecord:
    t = at(2026, 1, 10, 8)
    return AccountingRecord(
        job_id=next(_ids), name="x", user=user, account=account, partition="gpu", state="CANCELLED",
        exit_code=0, submit_time=t, start_time=t + dt.timedelta(minutes=5), end_time=t + dt.timedelta(minutes=5),
        elapsed_seconds=0, time_limit_minutes=60, num_nodes=1, nodes="", alloc_tres={},
        req_tres={"gres/gpu": 1}, comment="", cluster="gpuportal",
    )  # fmt: skip


def pdf_text(pdf: bytes) -> str:
    """The text of a PDF as poppler's pdftotext reads it (Debian poppler-utils: scripts/pdf)."""
    result = subprocess.run(["pdftotext", "-layout", "-enc", "UTF-8", "-", "-"], input=pdf, capture_output=True, check=True)
    return result.stdout.decode("utf-8")
