"""The CLI's one dependency, the #SBATCH parser (../sbatch, the distribution gpuportal-sbatch), by its
path in this checkout as a ``file:`` URL: ``pip install ./cli`` takes it from here and never asks a
package index for that name, where anyone may register it (pyproject.toml cannot say a path relative
to itself). Everything else is in pyproject.toml; tests/test_packaging.py checks both."""

from pathlib import Path

from setuptools import setup

SBATCH = Path(__file__).resolve().parent.parent / "sbatch"

setup(install_requires=[f"gpuportal-sbatch @ {SBATCH.as_uri()}"])
