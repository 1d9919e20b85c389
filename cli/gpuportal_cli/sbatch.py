"""Pure functions for the CLI's own flags: time limits (Slurm's formats and 2h / 90m), memory sizes
and GPU requests. A script's ``#SBATCH`` lines are read by ``sbatch_directives`` (the server's parser
too). No I/O, no network: unit-tested directly."""

from __future__ import annotations

import re

from gpuportal_sbatch.directives import DirectiveError, memory_gb, parse_memory_mb, parse_time_limit_minutes

__all__ = ["parse_memory_gb", "parse_time_minutes", "gpu_request"]

# One converter for a typed time limit, shared with the server's form: the parser package owns it.
parse_time_minutes = parse_time_limit_minutes


def parse_memory_gb(value: str) -> int:
    """``--mem`` (per node) as sbatch reads it (a bare number is MiB; K/M/G/T), in whole GiB rounded
    up: the parser package's converters, the server's own."""
    try:
        megabytes = parse_memory_mb(value or "")
    except DirectiveError as exc:
        raise ValueError(f"memory {value!r}: use e.g. 32G, 64000M or 512 (MiB), as sbatch ({exc.message})") from None
    if megabytes <= 0:
        raise ValueError(f"memory {value!r}: give a positive size (--mem=0, 'all memory', is not supported)")
    return memory_gb(megabytes)


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
