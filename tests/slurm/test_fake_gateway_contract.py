"""The gateway contract (tests/slurm/test_gateway_contract.py) run on the fake gateway (tests/fakes.py):
the contract tests that need no controller, so that the fake the unit tests use keeps the contract
the real backends keep. Marked ``fake`` (and so in the fast tier); nothing about Slurm is proven
here — that is the real backends' run of the same tests."""

from __future__ import annotations

import pytest

from tests.fakes import FakeGateway
from tests.slurm import test_gateway_contract as contract
from tests.slurm.test_gateway_contract import ci_association  # noqa: F401 — a fixture of the contract

pytestmark = pytest.mark.fake


@pytest.fixture
def gateway(use_gateway):
    return use_gateway(FakeGateway.like_local_cluster())


@pytest.fixture
def ci_user():
    """The fake runs nothing: no Unix user is needed."""
    return None


@pytest.fixture
def accounts_ever():
    """The fake deletes nothing it reports usage for."""
    return set()


test_version_and_ping = contract.test_version_and_ping
test_partitions = contract.test_partitions
test_nodes = contract.test_nodes
test_account_gpu_minutes_is_sreports_answer = contract.test_account_gpu_minutes_is_sreports_answer
test_usage_rolled_up_is_false_for_hours_to_come = contract.test_usage_rolled_up_is_false_for_hours_to_come
test_account_and_user_add_twice_is_fine = contract.test_account_and_user_add_twice_is_fine
test_user_remove_missing_is_fine = contract.test_user_remove_missing_is_fine
test_limits_round_trip = contract.test_limits_round_trip
test_limits_of_unknown_account_rejected = contract.test_limits_of_unknown_account_rejected


def test_the_fake_is_a_slurm_gateway():
    from portal.slurm import SlurmGateway

    assert isinstance(FakeGateway(), SlurmGateway)
