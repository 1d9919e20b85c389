"""What ``pip install .`` asks for (setup.py): the CLI from this checkout by its path, never from an
index where anyone may register the name gpuportal-cli; every runtime dependency bounded above."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _runtime_requirements() -> list[Requirement]:
    """The installed server's own requirements, less its extras (what make install put in the venv)."""
    parsed = [Requirement(line) for line in requires("gpuportal") or []]
    return [req for req in parsed if not (req.marker and "extra" in str(req.marker))]


def test_the_server_requires_the_cli_by_its_path_in_this_checkout():
    (cli,) = [req for req in _runtime_requirements() if req.name == "gpuportal-cli"]
    assert cli.url == (ROOT / "cli").as_uri()


def test_pip_install_dot_resolves_with_no_index_at_all_and_takes_the_cli_from_cli(tmp_path):
    """``pip install .`` with every index turned off (a dry run, the venv's own setuptools building the
    metadata of setup.py): it succeeds, and gpuportal-cli comes from cli/ by its path — with a bare
    name pip would count the installed copy as satisfying it and not say where it would come from."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-build-isolation",
         "--report", str(report), str(ROOT)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sources = {item["metadata"]["name"]: item["download_info"]["url"] for item in json.loads(report.read_text())["install"]}
    assert sources["gpuportal-cli"] == (ROOT / "cli").as_uri()
    assert sources["gpuportal"] == ROOT.as_uri()


def test_every_runtime_dependency_is_bounded_above():
    unbounded = [
        str(req) for req in _runtime_requirements()
        if req.url is None and not any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier)
    ]  # fmt: skip
    assert unbounded == []
