"""Build the ``gpuportal`` CLI, with the #SBATCH parser it reads scripts with (sbatch/), as one
zipapp file that runs with a bare ``python3`` (>= 3.9), for login nodes where nothing can be
installed: ``python3 cli/build_pyz.py [OUT]`` (``make cli-zipapp`` writes dist/gpuportal.pyz). Copy
the file anywhere and run it: ``./gpuportal.pyz login``."""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "gpuportal_cli"
# the #SBATCH parser the CLI reads scripts with (../sbatch, the distribution gpuportal-sbatch)
PACKAGES = (PACKAGE, Path(__file__).resolve().parent.parent / "sbatch" / "gpuportal_sbatch")


def build(out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for package in PACKAGES:
            shutil.copytree(package, Path(tmp) / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        zipapp.create_archive(tmp, out, interpreter="/usr/bin/env python3", main="gpuportal_cli.main:main", compressed=True)
    return out


if __name__ == "__main__":
    path = build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist/gpuportal.pyz"))
    print(path)
