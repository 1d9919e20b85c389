"""Build the ``gpuportal`` CLI as one zipapp file that runs with a bare ``python3`` (>= 3.9), for
login nodes where nothing can be installed: ``python3 cli/build_pyz.py [OUT]`` (``make cli-zipapp``
writes dist/gpuportal.pyz). Copy the file anywhere and run it: ``./gpuportal.pyz login``."""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "gpuportal_cli"


def build(out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(PACKAGE, Path(tmp) / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        zipapp.create_archive(tmp, out, interpreter="/usr/bin/env python3", main="gpuportal_cli.main:main", compressed=True)
    return out


if __name__ == "__main__":
    path = build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist/gpuportal.pyz"))
    print(path)
