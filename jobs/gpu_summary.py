"""A job's GPU record as the portal keeps it once the job has ended (JobGpuSummary.data): per GPU its
summary (the JobGpuUsage figures) and ONE downsampled series — at most GPU_CHART_POINTS points, buckets
of at least GPU_SERIES_MIN_BUCKET_SECONDS — what the chart shows after Prometheus has forgotten the raw
points. The raw points are never stored in PostgreSQL: a running job's chart reads them from Prometheus.

One shape, one owner: ``buckets`` is the chart's downsampling (a running job's chart from Prometheus,
an ended job's stored series, the legacy rows' compaction), ``summary_encode``/``summary_decode`` the
record's format. The record is a version byte (1) then JSON compressed by zlib with a preset
dictionary: ``{"o": origin epoch s, "w": bucket s, "gpus": [{"t", "j", "h", "g", "m", "s", "n", "us",
"up", "i", "ms", "mn", "mp", "f", "l", "u": [%, …], "mem": [MiB, …]}]}`` (the JobGpuUsage fields by
their initials; first and last sample in seconds from the origin); utilisation in whole %, memory to three figures, null where a bucket had no point. bench/bench_gpu_storage.py measures what it costs."""

from __future__ import annotations

import datetime as dt
import json
import math
import zlib

from django.conf import settings

from jobs.models import JobGpuUsage
from portal import prometheus

# The chart of a job has at most this many points per GPU (means over equal buckets): 8 GPUs x 72 h
# at one point a minute are 34 560 points, shown as 8 x 240.
GPU_CHART_POINTS = 240
FORMAT_VERSION = 1


def chart_frame(rows: list[JobGpuUsage], *, minimum_width: int = 0) -> tuple[int, int, int]:
    """(origin epoch s, bucket width s, buckets) covering the rows' samples: at most GPU_CHART_POINTS
    buckets, each at least one step (and ``minimum_width``) wide."""
    step = max(r.step_seconds for r in rows)
    start = min(r.first_at for r in rows) - dt.timedelta(seconds=step)
    end = max(r.last_at for r in rows)
    span = (end - start).total_seconds()
    width = max(step, minimum_width, math.ceil(span / GPU_CHART_POINTS))
    return int(start.timestamp()), width, max(1, math.ceil(span / width))


def buckets(points, *, origin: int, width: int, count: int) -> tuple[list, list]:
    """Means of (time, utilisation %, memory MiB or None) points over ``count`` buckets of ``width``
    seconds from ``origin`` (a point at t belongs to the bucket ending at or after it): two lists,
    None where a bucket had no point."""
    util = [[0.0, 0] for _ in range(count)]
    mem = [[0.0, 0] for _ in range(count)]
    for at, u, m in points:
        b = min(max(math.ceil((at.timestamp() - origin) / width) - 1, 0), count - 1)
        util[b][0] += u
        util[b][1] += 1
        if m is not None:
            mem[b][0] += m
            mem[b][1] += 1
    return ([round(s / n, 1) if n else None for s, n in util], [round(s / n) if n else None for s, n in mem])


def chart_labels(*, origin: int, width: int, count: int) -> list[str]:
    return [dt.datetime.fromtimestamp(origin + width * (b + 1), tz=dt.UTC).isoformat() for b in range(count)]


def gpu_label(row: JobGpuUsage) -> str:
    task = f"task {row.task_index} · " if row.task_index is not None else ""
    return f"{task}{row.host} GPU {row.gpu}"


def chart(rows: list[JobGpuUsage], series: dict[int, tuple[list, list]], *, origin: int, width: int, count: int) -> dict:
    """The chart the job page and the API show: ``series`` maps a row's position to its two lists."""
    empty = ([None] * count, [None] * count)
    return {
        "labels": chart_labels(origin=origin, width=width, count=count),
        "bucket_seconds": width,
        "series": [
            {"label": gpu_label(r), "util": series.get(i, empty)[0], "mem_mib": series.get(i, empty)[1]}
            for i, r in enumerate(rows)
        ],
    }


def series_of_rows(rows: list[JobGpuUsage], series: list[prometheus.GpuSeries]) -> dict[int, list]:
    """Position in ``rows`` → the points of the series that is that GPU of that job (its cluster's,
    when GPU_LABEL_CLUSTER is set and the row carries ``cluster_name``), within the row's span."""
    index = {}
    for i, r in enumerate(rows):
        index[(str(r.slurm_job_id), r.host, r.gpu)] = i
    out: dict[int, list] = {}
    for s in series:
        i = index.get((s.job, s.host, s.gpu))
        if i is None:
            continue
        row = rows[i]
        cluster = getattr(row, "cluster_name", None)
        if settings.GPU_LABEL_CLUSTER and cluster is not None and s.cluster != cluster:
            continue
        low = row.first_at - dt.timedelta(seconds=row.step_seconds)
        out[i] = [p for p in s.points if low <= p[0] <= row.last_at]
    return out


def _epoch(at: dt.datetime) -> int | float:
    stamp = at.timestamp()
    return int(stamp) if stamp.is_integer() else stamp  # the sync's points are on whole seconds


def _short(value: float, places: int) -> float | int:
    """A sum or peak as stored: ``places`` decimals (utilisation sums to 0.1 %·sample, memory to the
    MiB·sample: the means shown to 0.1 % and 1 MiB do not move), an int when whole."""
    rounded = round(value, places)
    return int(rounded) if float(rounded).is_integer() else rounded


def _chart_mib(value: float | None) -> int | None:
    """Memory for the chart: three significant figures (70 321 MiB → 70 300; 0.1 %, invisible on it)."""
    if value is None:
        return None
    whole = round(value)
    scale = 10 ** max(0, len(str(abs(whole))) - 3)
    return round(whole / scale) * scale


# zlib's preset dictionary of format 1: what every record repeats, so a one-GPU job's record is a
# fraction of its JSON (bench/bench_gpu_storage.py). Changing it is a new format version.
_ZDICT_1 = (
    b'null,null,null,0,0,0,0,0,100,100,100,95,90,60,30,"NVIDIA H100 80GB HBM3","NVIDIA A100-SXM4-80GB",'
    b'{"o":1780000000,"w":300,"gpus":[{"t":null,"j":1000000,"h":"gpu-node-","g":"0","m":"NVIDIA A100-SXM4-80GB",'
    b'"s":60,"n":1,"us":0,"up":0,"i":0,"ms":0,"mn":0,"mp":0,"f":60,"l":300,"u":[0,0],"mem":[0,0]}]}'
)


def summary_encode(rows: list[JobGpuUsage], points: dict[int, list], *, minimum_width: int) -> bytes:
    """The record of an ended job: ``rows`` its GPU rows (final figures), ``points`` a row's position →
    its (time, util, mem) points (at the sync's step, or already bucketed: means of means weigh each
    stored point once). The figures' sums to 0.01 (the means are shown to 0.1); the series' utilisation
    to whole %, memory to three significant figures. One version byte, then zlib with _ZDICT_1."""
    sampled = [r for r in rows if r.samples]
    origin, width, count = chart_frame(sampled, minimum_width=minimum_width) if sampled else (0, 0, 0)
    gpus = []
    for i, r in enumerate(rows):
        util, mem = buckets(points.get(i, []), origin=origin, width=width, count=count) if count and r.samples else ([], [])
        gpus.append({
            "t": r.task_index, "j": r.slurm_job_id, "h": r.host, "g": r.gpu, "m": r.model_name, "s": r.step_seconds,
            "n": r.samples, "us": _short(r.util_sum, 1), "up": _short(r.util_peak, 1), "i": r.idle_samples,
            "ms": _short(r.mem_sum, 0), "mn": r.mem_samples, "mp": _short(r.mem_peak, 0), "f": _epoch(r.first_at) - origin,
            "l": _epoch(r.last_at) - origin, "u": [None if v is None else round(v) for v in util], "mem": [_chart_mib(v) for v in mem],
        })  # fmt: skip
    body = json.dumps({"o": origin, "w": width, "gpus": gpus}, separators=(",", ":")).encode()
    packer = zlib.compressobj(9, zdict=_ZDICT_1)
    return bytes([FORMAT_VERSION]) + packer.compress(body) + packer.flush()


def summary_decode(data: bytes, *, job_id) -> tuple[list[JobGpuUsage], dict | None]:
    """The rows (unsaved JobGpuUsage, final) and the chart of a stored record, in the rows' order
    (task, host, GPU)."""
    data = bytes(data)
    if data[0] != FORMAT_VERSION:
        raise ValueError(f"unknown GPU summary format {data[0]}")
    unpacker = zlib.decompressobj(zdict=_ZDICT_1)
    body = json.loads(unpacker.decompress(data[1:]) + unpacker.flush())
    body["origin"], body["width"] = body["o"], body["w"]
    at = lambda s: dt.datetime.fromtimestamp(body["o"] + s, tz=dt.UTC)
    rows, series = [], {}
    for i, g in enumerate(body["gpus"]):
        rows.append(JobGpuUsage(
            job_id=job_id, task_index=g["t"], slurm_job_id=g["j"], host=g["h"], gpu=g["g"], model_name=g["m"],
            step_seconds=g["s"], samples=g["n"], util_sum=g["us"], util_peak=g["up"], idle_samples=g["i"],
            mem_sum=g["ms"], mem_samples=g["mn"], mem_peak=g["mp"], first_at=at(g["f"]), last_at=at(g["l"]), final=True,
        ))  # fmt: skip
        if g["u"]:
            series[i] = ([None if v is None else float(v) for v in g["u"]], g["mem"])
    count = max((len(g["u"]) for g in body["gpus"]), default=0)
    shown = [i for i, r in enumerate(rows) if r.samples]
    if not count or not shown:
        return rows, None
    picked = [rows[i] for i in shown]
    return rows, chart(picked, {k: series[i] for k, i in enumerate(shown) if i in series},
                       origin=body["origin"], width=body["width"], count=count)  # fmt: skip
