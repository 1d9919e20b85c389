"""Pure functions for the CLI's own flags: time limits (Slurm's formats and 2h / 90m), memory sizes
and GPU requests. A script's ``#SBATCH`` lines are read by ``sbatch_directives`` (the server's parser
too). No I/O, no network: unit-tested directly."""

from __future__ import annotations

import math
import re

from gpuportal_sbatch.directives import parse_time_limit_minutes

__all__ = ["parse_memory_gb", "parse_time_minutes", "gpu_request"]

# One converter for a typed time limit, shared with the server's form: the parser package owns it.
parse_time_minutes = parse_time_limit_minutes


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
