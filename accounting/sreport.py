"""The one sreport call of the reconciliation. It belongs behind the Slurm gateway
(``SlurmGateway.sreport_account_gpu_minutes``); it lives here until the gateway grows it. argv list,
no shell, the gateway's environment (SLURM_CONF from settings), the billing time zone as TZ so that
sreport's Start=/End= days are the portal's months."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import zoneinfo

from django.conf import settings

from portal.slurm import SlurmUnavailable


def _exe(name: str) -> str:
    if settings.SLURM_BIN_DIR:
        return os.path.join(settings.SLURM_BIN_DIR, name)
    return shutil.which(name) or name


def sreport_argv(start: dt.datetime, end: dt.datetime) -> list[str]:
    fmt = "%Y-%m-%dT%H:%M:%S"
    argv = [
        _exe("sreport"), "-n", "-P", "cluster", "AccountUtilizationByUser",
        f"Start={start.strftime(fmt)}", f"End={end.strftime(fmt)}", "-T", "gres/gpu", "-t", "Minutes",
    ]  # fmt: skip
    if settings.SLURM_CLUSTER:
        argv.append(f"Clusters={settings.SLURM_CLUSTER}")
    return argv


def parse_account_minutes(output: str) -> dict[str, int]:
    """Rows are Cluster|Account|Login|Proper Name|TRES Name|Used; account totals have an empty Login
    (the "root" account total, the sum over everything, is dropped)."""
    minutes: dict[str, int] = {}
    for line in output.splitlines():
        parts = line.split("|")
        if len(parts) < 6:
            continue
        account, login, used = parts[1].strip(), parts[2].strip(), parts[-1].strip()
        if login or not account or account == "root":
            continue
        try:
            minutes[account] = int(used)
        except ValueError:
            continue
    return minutes


def sreport_account_gpu_minutes(start: dt.datetime, end: dt.datetime) -> dict[str, int]:
    """GPU-minutes per account that slurmdbd has rolled up in [start, end) (whole hours only).
    ``start``/``end`` are aware; they are given to sreport as local times of the billing zone."""
    zone = settings.TIME_ZONE
    local_start = start.astimezone(zoneinfo.ZoneInfo(zone))
    local_end = end.astimezone(zoneinfo.ZoneInfo(zone))
    env = {**os.environ, "TZ": zone}
    if settings.SLURM_CONF:
        env["SLURM_CONF"] = settings.SLURM_CONF
    argv = sreport_argv(local_start, local_end)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=settings.SLURM_TIMEOUT, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"sreport failed: {exc}", command=" ".join(argv)) from exc
    if proc.returncode != 0:
        raise SlurmUnavailable(f"sreport: {proc.stderr.strip() or proc.stdout.strip()}", command=" ".join(argv))
    return parse_account_minutes(proc.stdout)
