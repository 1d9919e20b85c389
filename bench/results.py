"""What a benchmark reports: medians and percentiles, its figures in a Section (printed as they
come), and bench/results.md — the whole file (run_all.py) or one section of it replaced
(bench_pyslurm.py)."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from environment import ROOT

RESULTS = ROOT / "bench" / "results.md"


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values, p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def _number(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3g}"


@dataclass
class Figure:
    what: str
    value: float
    unit: str
    runs: str  # how many runs / samples it is the median of, in words
    how: str = ""

    def line(self) -> str:
        return f"{self.what}: {_number(self.value)} {self.unit} ({self.runs})"


@dataclass
class Section:
    title: str
    method: str = ""
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_md: str = ""  # verbatim markdown (tables)
    failed: bool = False  # the benchmark did not finish: run_all exits nonzero

    def add(self, what: str, value: float, unit: str, runs: str, how: str = "") -> Figure:
        figure = Figure(what, value, unit, runs, how)
        self.figures.append(figure)
        print(f"  {figure.line()}", flush=True)
        return figure

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    def markdown(self) -> str:
        out = [f"## {self.title}", ""]
        if self.method:
            out += [self.method, ""]
        if self.figures:
            out += ["| what | figure | runs |", "|---|---:|---|"]
            for f in self.figures:
                what = f.what + (f" — {f.how}" if f.how else "")
                out.append(f"| {what} | {_number(f.value)} {f.unit} | {f.runs} |")
            out.append("")
        if self.extra_md:
            out += [self.extra_md, ""]
        for note in self.notes:
            out.append(f"- {note}")
        if self.notes:
            out.append("")
        return "\n".join(out)


def print_header(title: str) -> None:
    print(f"\n== {title}", flush=True)


def dump_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


def write_results(sections: list[Section], machine: dict, *, quick: bool, seconds: float, path: Path = RESULTS) -> None:
    """The whole results file: how and when it was written, the machine, every section."""
    lines = [
        "# gpuportal benchmarks",
        "",
        f"Written by `bench/run_all.py{' --quick' if quick else ''}` on {machine['date']} in {seconds / 60:.1f} min."
        + (
            " **Quick mode: small sizes, for checking the benchmarks, not for reading figures.**"
            if quick
            else ""
        ),
        (
            "Medians unless said otherwise; each figure says over how many runs. Figures from a shared or loaded "
            "machine are not comparable with those from a quiet one (see the load average)."
        ),
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in machine.items()],
        "",
    ]
    for section in sections:
        lines.append(section.markdown())
    path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"\nresults written to {path}")


def write_section(section: Section, path: Path = RESULTS) -> None:
    """Replace (or append) the section of this title in a results file, leaving the others as they are."""
    text = path.read_text() if path.exists() else "# gpuportal benchmarks\n"
    block = section.markdown().rstrip() + "\n"
    pattern = re.compile(rf"^## {re.escape(section.title)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    text = pattern.sub(lambda _: block + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    path.write_text(text.rstrip() + "\n")
    print(f"section written to {path}")
