"""SLURM_BACKEND=auto against the real local clusters: pyslurm is chosen only for the Slurm release it
was built for (pyslurm 25.11 cannot talk to a 22.05 controller), the CLI otherwise."""

from __future__ import annotations

import pytest

import portal.slurm as slurm
from portal.slurm.pyslurm import pyslurm_version
from tests.support import skip_unless_ci, use_slurm_target

pytestmark = pytest.mark.slurm


def test_auto_picks_pyslurm_only_for_its_own_release(settings):
    if pyslurm_version() is None:
        skip_unless_ci("pyslurm is not installed in this venv (scripts/pyslurm)")
    try:
        use_slurm_target(settings, "auto", "22.05")
        assert slurm.get_gateway().name == "cli"
        use_slurm_target(settings, "auto", "25.11")
        assert slurm.get_gateway().name == "pyslurm"
        assert slurm.get_gateway().ping() is True
    finally:
        slurm.reset_gateway()


@pytest.mark.parametrize(("a", "b", "same"), [("25.11.2", "25.11.7", True), ("25.11.2", "22.05.8", False),
                                              ("25.11.2", "", False), ("25.1", "25.11.0", False)])  # fmt: skip
def test_same_release(a, b, same):
    assert slurm.same_release(a, b) is same
