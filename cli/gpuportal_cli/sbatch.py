"""Pure functions: Slurm time strings, memory sizes and the ``#SBATCH`` lines of a batch script,
turned into the fields of the portal's job API. No I/O, no network: unit-tested directly."""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field

__all__ = ["SbatchDefaults", "parse_memory_gb", "parse_sbatch", "parse_time_minutes", "gpu_request"]

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


def _gres_gpu(value: str) -> tuple[str, int] | None:
    """The GPU part of a ``--gres`` list (``gpu``, ``gpu:2``, ``gpu:a100:2``, ``gpu:a100:2,shard:1``)."""
    for item in value.split(","):
        name, _, rest = item.strip().partition(":")
        if name != "gpu":
            continue
        if not rest:
            return "", 1
        return gpu_request(rest)
    return None


@dataclass
class SbatchDefaults:
    """What a script's ``#SBATCH`` lines ask for, in the portal's terms (None = not given).

    ``gpus`` is the job's total (``--gpus``/``-G``), as the portal's API counts it; ``gpus_per_node``
    comes from ``--gres``/``--gpus-per-node`` and is multiplied by the final node count."""

    name: str | None = None
    partition: str | None = None
    nodes: int | None = None
    gpus: int | None = None
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    time_limit_minutes: int | None = None
    memory_gb: int | None = None
    cpus_per_gpu: int | None = None
    workdir: str | None = None
    ignored: list[str] = field(default_factory=list)  # directives gpuportal does not read
    problems: list[str] = field(default_factory=list)  # directives it could not understand

    def total_gpus(self, nodes: int | None = None) -> int | None:
        """The job's GPUs on ``nodes`` nodes (default: the script's own node count, else 1)."""
        if self.gpus is not None:
            return self.gpus
        if self.gpus_per_node is not None:
            return self.gpus_per_node * (nodes or self.nodes or 1)
        return None

    def as_api_fields(self) -> dict:
        """The job API's fields the script sets (GPUs as a total)."""
        keys = ("name", "partition", "nodes", "gpu_type", "time_limit_minutes", "memory_gb", "cpus_per_gpu", "workdir")
        fields = {key: getattr(self, key) for key in keys if getattr(self, key) is not None}
        if self.total_gpus() is not None:
            fields["gpus"] = self.total_gpus()
        return fields


# option → (canonical name, takes a value). Long options may be abbreviated by sbatch; we do not.
_OPTIONS = {
    "--gres": "gres",
    "--gpus": "gpus",
    "-G": "gpus",
    "--gpus-per-node": "gpus_per_node",
    "--time": "time",
    "-t": "time",
    "--partition": "partition",
    "-p": "partition",
    "--job-name": "name",
    "-J": "name",
    "--nodes": "nodes",
    "-N": "nodes",
    "--mem": "mem",
    "--cpus-per-gpu": "cpus_per_gpu",
    "--chdir": "workdir",
    "-D": "workdir",
}


def _directive_tokens(script: str) -> list[str]:
    """The options of the ``#SBATCH`` lines that sbatch reads: those before the first command."""
    tokens: list[str] = []
    for number, line in enumerate(script.splitlines()):
        stripped = line.strip()
        if number == 0 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break  # sbatch stops at the first command
        if not re.match(r"^#SBATCH(\s|$)", stripped):
            continue
        body = stripped[len("#SBATCH"):]
        try:
            tokens.extend(shlex.split(body, comments=True))
        except ValueError:
            tokens.extend(body.split("#", 1)[0].split())
    return tokens


def _split_options(tokens: list[str]) -> list[tuple[str, str | None, str]]:
    """(option, value, original text) from tokens such as ``--time=10``, ``--time 10``, ``-t10``, ``-t 10``."""
    pairs: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("--"):
            option, eq, value = token.partition("=")
            if eq:
                pairs.append((option, value, token))
                continue
            if option in _OPTIONS and i < len(tokens) and not tokens[i].startswith("-"):
                pairs.append((option, tokens[i], f"{token} {tokens[i]}"))
                i += 1
            else:
                pairs.append((option, None, token))
        elif token.startswith("-") and len(token) >= 2:
            option, value = token[:2], token[2:]
            if value.startswith("="):
                value = value[1:]
            if value:
                pairs.append((option, value, token))
            elif option in _OPTIONS and i < len(tokens):
                pairs.append((option, tokens[i], f"{token} {tokens[i]}"))
                i += 1
            else:
                pairs.append((option, None, token))
        else:
            pairs.append((token, None, token))
    return pairs


def parse_sbatch(script: str) -> SbatchDefaults:
    """Read the ``#SBATCH`` lines of a batch script. Later lines win, as in sbatch. Never raises:
    what it cannot read is listed in ``problems``, what it does not use in ``ignored``."""
    out = SbatchDefaults()
    gpus_total: tuple[str, int] | None = None
    gpus_per_node: tuple[str, int] | None = None
    for option, value, original in _split_options(_directive_tokens(script)):
        kind = _OPTIONS.get(option)
        if kind is None:
            out.ignored.append(original)
            continue
        if value is None or value == "":
            out.problems.append(f"{original}: missing value")
            continue
        try:
            if kind == "gres":
                found = _gres_gpu(value)
                if found is None:
                    out.ignored.append(original)
                else:
                    gpus_per_node = found
            elif kind == "gpus":
                gpus_total = gpu_request(value)
            elif kind == "gpus_per_node":
                gpus_per_node = gpu_request(value)
            elif kind == "time":
                out.time_limit_minutes = parse_time_minutes(value)
            elif kind == "partition":
                if "," in value:
                    out.problems.append(f"{original}: gpuportal submits to one partition; using the first")
                out.partition = value.split(",")[0]
            elif kind == "name":
                out.name = value
            elif kind == "nodes":
                low = value.split("-")[0]
                if not low.isdigit() or int(low) < 1:
                    raise ValueError(f"node count {value!r}: expected a positive number")
                if "-" in value:
                    out.problems.append(f"{original}: node ranges are not supported; using {low}")
                out.nodes = int(low)
            elif kind == "mem":
                out.memory_gb = parse_memory_gb(value)
            elif kind == "cpus_per_gpu":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"CPUs per GPU {value!r}: expected a positive number")
                out.cpus_per_gpu = int(value)
            elif kind == "workdir":
                out.workdir = value
        except ValueError as exc:
            out.problems.append(f"{original}: {exc}")
    # --gpus counts the job's GPUs, --gres and --gpus-per-node a node's; a script giving both is
    # ambiguous for sbatch too: the total wins here.
    if gpus_total is not None:
        out.gpu_type, out.gpus = gpus_total
    elif gpus_per_node is not None:
        out.gpu_type, out.gpus_per_node = gpus_per_node
    if out.gpu_type == "":
        out.gpu_type = None
    return out
