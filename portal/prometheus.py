"""The portal's one door to Prometheus: its HTTP API (``/api/v1/query_range``), nothing else.

A site points PROMETHEUS_URL at its own Prometheus and names the metrics and labels its GPU exporter
prints (settings GPU_METRIC_*, GPU_LABEL_*): dcgm-exporter's by default (``DCGM_FI_DEV_GPU_UTIL`` in
%, ``DCGM_FI_DEV_FB_USED`` in MiB, labels ``hpc_job``, ``Hostname``, ``gpu``), nvidia_gpu_exporter's
``nvidia_smi_*`` with the scales set (its utilisation is a ratio, its memory in bytes). The figures
come back in the portal's units: utilisation in %, memory in MiB."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import urllib.error
import urllib.parse
import urllib.request

from django.conf import settings


class PrometheusUnavailable(Exception):
    """Prometheus did not answer, or answered with an error (the message says which)."""


@dataclasses.dataclass(frozen=True)
class GpuSeries:
    """One GPU held by one job, over the queried range: ``points`` are (time, utilisation %, memory
    MiB or None), one per step."""

    cluster: str
    job: str
    host: str
    gpu: str
    model: str
    points: list[tuple[dt.datetime, float, float | None]]


def enabled() -> bool:
    return bool(settings.PROMETHEUS_URL)


def _selector(metric: str, jobs: list[int] | None) -> str:
    if jobs is None:
        return f'{metric}{{{settings.GPU_LABEL_JOB}!=""}}'
    return f'{metric}{{{settings.GPU_LABEL_JOB}=~"{"|".join(str(int(j)) for j in sorted(set(jobs)))}"}}'


def gpu_query(step_seconds: int, *, jobs: list[int] | None = None) -> str:
    """The PromQL of one range query for every GPU a job holds (``jobs``: only these Slurm ids): each
    point is the mean over the step before it (avg_over_time), utilisation and memory told apart by
    a ``portal_metric`` label."""
    window = f"{int(step_seconds)}s"
    parts = []
    for name, metric in (("util", settings.GPU_METRIC_UTIL), ("mem", settings.GPU_METRIC_MEMORY)):
        if metric:
            parts.append(f'label_replace(avg_over_time({_selector(metric, jobs)}[{window}]), "portal_metric", "{name}", "", "")')
    return " or ".join(parts)


def _get(path: str, params: dict, *, timeout: float | None = None) -> dict:
    url = f"{settings.PROMETHEUS_URL.rstrip('/')}{path}"
    body = urllib.parse.urlencode(params).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout or settings.PROMETHEUS_TIMEOUT) as response:
            payload = json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            detail = json.load(exc).get("error", "")
        except ValueError:
            detail = ""
        raise PrometheusUnavailable(f"Prometheus answered {exc.code}: {detail or exc.reason}") from None
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        raise PrometheusUnavailable(f"Prometheus at {settings.PROMETHEUS_URL} unreachable: {exc}") from None
    if payload.get("status") != "success":
        raise PrometheusUnavailable(f"Prometheus: {payload.get('error', 'no success status')}")
    return payload["data"]


# Prometheus refuses a range query of more points than this per series
MAX_POINTS_PER_SERIES = 11_000


def gpu_series(
    start: dt.datetime, end: dt.datetime, step_seconds: int, *, jobs: list[int] | None = None, timeout: float | None = None
) -> list[GpuSeries]:
    """Every GPU a job held between start and end (both included, one point per step; ``jobs``: only
    the GPUs of these Slurm ids), in one range query. Raises PrometheusUnavailable."""
    data = _get("/api/v1/query_range", {
        "query": gpu_query(step_seconds, jobs=jobs), "start": f"{start.timestamp():.3f}", "end": f"{end.timestamp():.3f}",
        "step": str(int(step_seconds)),
    }, timeout=timeout)  # fmt: skip
    util_scale, mem_scale = settings.GPU_METRIC_UTIL_SCALE, settings.GPU_METRIC_MEMORY_SCALE
    merged: dict[tuple, dict] = {}
    models: dict[tuple, str] = {}
    for result in data.get("result", []):
        labels = result["metric"]
        key = (labels.get(settings.GPU_LABEL_CLUSTER, "") if settings.GPU_LABEL_CLUSTER else "",
               labels.get(settings.GPU_LABEL_JOB, ""), labels.get(settings.GPU_LABEL_HOST, ""),
               labels.get(settings.GPU_LABEL_GPU, ""))  # fmt: skip
        models.setdefault(key, labels.get(settings.GPU_LABEL_MODEL, "") if settings.GPU_LABEL_MODEL else "")
        kind = labels.get("portal_metric")
        points = merged.setdefault(key, {})
        for stamp, value in result.get("values", []):
            number = float(value)
            if math.isnan(number):
                continue
            at = dt.datetime.fromtimestamp(float(stamp), tz=dt.timezone.utc)
            util, mem = points.get(at, (None, None))
            if kind == "util":
                util = number * util_scale
            else:
                mem = number * mem_scale
            points[at] = (util, mem)
    out = []
    for key, points in merged.items():
        rows = [(at, util, mem) for at, (util, mem) in sorted(points.items()) if util is not None]
        if rows:
            out.append(GpuSeries(*key, model=models.get(key, ""), points=rows))
    return out
