"""Helpers shared by tests (not fixtures): a call-counting wrapper for the real gateway, polling,
Slurm tags, a valid job body."""

from __future__ import annotations

import time
from collections import Counter

import pytest


class CountingGateway:
    """Wraps the real gateway; counts every method call by name."""

    def __init__(self, real):
        self._real = real
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


def slurm_tags() -> set[str]:
    """Tags (comments) of every job the controller holds now."""
    from portal.slurm import get_gateway

    return {e.comment for e in get_gateway().queue() if e.comment}


def wait_for(predicate, *, timeout: float = 60.0, interval: float = 0.2):
    """Poll until predicate() is truthy; returns its value or fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


def job_payload(**overrides) -> dict:
    """A valid submit body for team vision."""
    body = {
        "team": "vision",
        "name": "train-resnet",
        "script": "#!/bin/bash\necho hello\n",
        "partition": "gpu",
        "gpu_type": "a100",
        "gpus": 2,
        "nodes": 1,
        "cpus_per_gpu": 2,
        "memory_gb": 16,
        "time_limit_minutes": 30,
        "environment": {"EPOCHS": "3"},
    }
    body.update(overrides)
    return body


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose real service is missing — but fail under CI (CI=true), where every service
    the suite needs must have been installed and started by .ci/run: a skip there would hide it."""
    import os

    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)
