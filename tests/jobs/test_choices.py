"""The state machine: terminal states are never left, live jobs never go backwards except via REQUEUED."""

import pytest

from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState, state_from_slurm, transition_allowed


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATES))
def test_terminal_states_are_never_left(terminal):
    assert not any(transition_allowed(terminal, other) for other in JobState.values)


@pytest.mark.parametrize(
    ("current", "new", "allowed"),
    [
        (JobState.ACCEPTED, JobState.PENDING, True),
        (JobState.PENDING, JobState.RUNNING, True),
        (JobState.RUNNING, JobState.PENDING, False),
        (JobState.COMPLETING, JobState.RUNNING, False),
        (JobState.RUNNING, JobState.SUSPENDED, True),
        (JobState.SUSPENDED, JobState.RUNNING, True),
        (JobState.RUNNING, JobState.REQUEUED, True),
        (JobState.REQUEUED, JobState.PENDING, True),
        (JobState.PENDING, JobState.REQUEUED, False),
        (JobState.PENDING, JobState.CANCELLED, True),
        (JobState.RUNNING, JobState.RUNNING, False),
    ],
)
def test_live_transitions_only_go_forward(current, new, allowed):
    assert transition_allowed(current, new) is allowed


def test_slurm_states_map_to_portal_states():
    assert state_from_slurm("CANCELLED by 0") == JobState.CANCELLED
    assert state_from_slurm("OUT_OF_MEMORY") == JobState.OUT_OF_MEMORY
    assert state_from_slurm("CONFIGURING") == JobState.RUNNING
    assert state_from_slurm("ACCEPTED") is None  # a portal-only state never comes from Slurm
    assert state_from_slurm("WHATEVER") is None
    assert LIVE_STATES.isdisjoint(TERMINAL_STATES)
