"""What ``pip install .`` and ``pip install ./cli`` ask for (setup.py, cli/setup.py): the #SBATCH parser
(sbatch/) and the CLI (cli/) from this checkout by their paths, never from an index where anyone may
register the names gpuportal-sbatch and gpuportal-cli; every runtime dependency of the three
distributions bounded above. Read from pip's own resolution of this checkout (not from what is
installed in the venv, which may be another checkout's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"gpuportal": ROOT, "gpuportal-cli": ROOT / "cli", "gpuportal-sbatch": ROOT / "sbatch"}


def _resolve_with_no_index(target: Path, tmp: Path) -> dict[str, dict]:
    """``pip install TARGET`` with every index turned off (a dry run, the venv's own setuptools
    building the metadata of the setup.py files): {name: pip's report entry} of what it would install.
    With a bare name pip would count an installed copy as satisfying it and not say where it comes from."""
    report = tmp / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-build-isolation",
         "--report", str(report), str(target)],
        capture_output=True, text=True, timeout=300, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {item["metadata"]["name"]: item for item in json.loads(report.read_text())["install"]}


@pytest.fixture(scope="module")
def server_install(tmp_path_factory) -> dict[str, dict]:
    return _resolve_with_no_index(ROOT, tmp_path_factory.mktemp("pip-server"))


def test_pip_install_dot_resolves_with_no_index_and_takes_the_parser_and_the_cli_from_their_paths(server_install):
    sources = {name: item["download_info"]["url"] for name, item in server_install.items()}
    assert {name: sources.get(name) for name in LOCAL} == {name: path.as_uri() for name, path in LOCAL.items()}


def test_the_server_and_the_cli_require_the_parser_by_its_path(server_install):
    for name in ("gpuportal", "gpuportal-cli"):
        requires = [Requirement(line) for line in server_install[name]["metadata"].get("requires_dist", [])]
        (parser,) = [req for req in requires if req.name == "gpuportal-sbatch"]
        assert parser.url == LOCAL["gpuportal-sbatch"].as_uri(), name


@pytest.mark.process
def test_pip_install_cli_alone_takes_the_parser_from_its_path_and_nothing_else(tmp_path):
    """On a login node: ``pip install ./cli`` from the checkout is one step, with no index at all."""
    install = _resolve_with_no_index(ROOT / "cli", tmp_path)
    assert {name: item["download_info"]["url"] for name, item in install.items()} == {
        "gpuportal-cli": LOCAL["gpuportal-cli"].as_uri(), "gpuportal-sbatch": LOCAL["gpuportal-sbatch"].as_uri(),
    }  # fmt: skip
    assert install["gpuportal-sbatch"]["metadata"].get("requires_dist", []) == []  # the standard library only


def test_every_dependency_of_the_three_distributions_is_bounded_above(server_install):
    """The runtime ones and the extras' (ldap, oidc, pyslurm, dev); the local ones by their paths."""
    checked, unbounded = 0, []
    for name in LOCAL:
        for line in server_install[name]["metadata"].get("requires_dist", []):
            req = Requirement(line)
            if req.name == name:
                continue  # dev's own gpuportal[ldap,oidc]
            checked += 1
            if req.url is None and not any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier):
                unbounded.append(f"{name}: {req}")
    assert checked >= 10 and unbounded == []
