"""Pure functions for the CLI's own flags: time limits (Slurm's formats and 2h / 90m), memory sizes
and GPU requests. A script's ``#SBATCH`` lines are read by ``sbatch_directives`` (the server's parser
too). No I/O, no network: unit-tested directly."""

from __future__ import annotations

import math
import re

__all__ = ["parse_memory_gb", "parse_time_minutes", "gpu_request"]

_UNITS_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_HUMAN_TIME_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?:in)?)?(?:(\d+)s)?$")


def parse_time_minutes(value: str) -> int:
    """A time limit in whole minutes (seconds round up, as Slurm does).

    Every sbatch ``--time`` format — ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` — and
    the shorter ``2h``, ``90m``, ``1h30m``, ``2d``, ``45s``. ``UNLIMITED`` is refused: the portal
    needs a number to estimate the cost."""
    text = (value or "").strip().lower()
    if not text:
        raise ValueError("empty time limit")
    if text in ("unlimited", "infinite", "-1"):
        raise ValueError(f"time limit {value!r}: give a finite limit (the portal estimates the cost from it)")
    seconds: int
    human = _HUMAN_TIME_RE.match(text)
    if human and any(human.groups()) and not text.isdigit():
        d, h, m, s = (int(g) if g else 0 for g in human.groups())
        seconds = d * 86400 + h * 3600 + m * 60 + s
    else:
        days = 0
        rest = text
        if "-" in text:
            day_part, rest = text.split("-", 1)
            if not day_part.isdigit() or not rest:
                raise ValueError(f"time limit {value!r}: expected D-H[:M[:S]]")
            days = int(day_part)
            parts = rest.split(":")
            if len(parts) > 3 or not all(p.isdigit() for p in parts):
                raise ValueError(f"time limit {value!r}: expected D-H[:M[:S]]")
            h, m, s = ([int(p) for p in parts] + [0, 0])[:3]
        else:
            parts = rest.split(":")
            if len(parts) > 3 or not all(p.isdigit() for p in parts):
                raise ValueError(
                    f"time limit {value!r}: use minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or 2h / 90m / 1h30m"
                )
            if len(parts) == 1:
                h, m, s = 0, int(parts[0]), 0
            elif len(parts) == 2:
                h, m, s = 0, int(parts[0]), int(parts[1])
            else:
                h, m, s = (int(p) for p in parts)
        seconds = days * 86400 + h * 3600 + m * 60 + s
    minutes = math.ceil(seconds / 60)
    if minutes <= 0:
        raise ValueError(f"time limit {value!r} is zero")
    return minutes


_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?$")
_MEM_FACTOR_MB = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_memory_gb(value: str) -> int:
    """sbatch ``--mem`` (per node) in whole GiB, rounded up. A bare number is MiB, as in Slurm."""
    text = (value or "").strip().lower()
    match = _MEM_RE.match(text)
    if not match:
        raise ValueError(f"memory {value!r}: use e.g. 32G, 64000M or 512 (MiB)")
    number, unit = float(match.group(1)), match.group(2)
    megabytes = number * _MEM_FACTOR_MB[unit]
    if megabytes <= 0:
        raise ValueError(f"memory {value!r}: give a positive size (--mem=0, 'all memory', is not supported)")
    return max(1, math.ceil(megabytes / 1024))


def gpu_request(value: str) -> tuple[str, int]:
    """``[type:]N`` → (type, N). ``a100`` alone means one GPU of that type."""
    text = value.strip()
    if not text:
        raise ValueError("empty GPU request")
    type_, _, count = text.rpartition(":")
    if not count.isdigit():
        if ":" not in text and re.fullmatch(r"[A-Za-z][\w.-]*", text):
            return text, 1
        raise ValueError(f"GPU request {value!r}: expected [type:]count, e.g. a100:2 or 2")
    if ":" in type_:
        raise ValueError(f"GPU request {value!r}: expected [type:]count")
    return type_, int(count)
