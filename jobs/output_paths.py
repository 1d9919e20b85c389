"""Where Slurm writes a job's output: sbatch's ``--output``/``--error`` filename patterns resolved
for one job (or one array task), so the portal reads the files the script put them in.

Patterns as sbatch expands them for the batch step (``man sbatch``, "filename pattern"): ``%%``,
``%A`` array master id, ``%a`` array index, ``%j`` job id, ``%x`` job name, ``%u`` user name,
``%N`` first node's short name, ``%n`` node index (0 for the batch script), ``%t`` task id (0),
``%s`` step ("batch"), each with an optional zero-padding width (``%4a``). A relative path is
relative to the job's working directory (the portal stores it absolute)."""

from __future__ import annotations

import re

_PATTERN_RE = re.compile(r"%(\d*)([%AajxuNnts])")


def expand_output_pattern(
    pattern: str, *, job_id: int, name: str, user: str, array_job_id: int | None = None,
    array_index: int | None = None, node: str = "",
) -> str | None:  # fmt: skip
    """The file a pattern names, or None when it needs something not known (a node before the job
    ran). ``job_id``: the job's (or the array task's own) Slurm id."""
    missing = []

    def one(match: re.Match) -> str:
        width, letter = match.group(1), match.group(2)
        if letter == "%":
            return "%"
        value = {
            "A": array_job_id if array_job_id is not None else job_id,
            "a": array_index if array_index is not None else 4294967294,  # sbatch's NO_VAL for a plain job
            "j": job_id, "x": name, "u": user, "N": node.split(".")[0], "n": 0, "t": 0, "s": "batch",
        }[letter]  # fmt: skip
        if letter == "N" and not node:
            missing.append(letter)
        text = str(value)
        return text.zfill(int(width)) if width and text.isdigit() else text

    path = _PATTERN_RE.sub(one, pattern)
    return None if missing else path
