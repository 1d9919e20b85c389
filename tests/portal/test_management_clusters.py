"""portal.management.clusters: the --cluster choice and the per-cluster loop of sync_cluster and
ingest_usage (one cluster's Slurm error stops only a run for that one cluster)."""

from __future__ import annotations

import io

import pytest
from django.core.management.base import BaseCommand, CommandError

from portal.management.clusters import cluster_names, for_each_cluster
from portal.slurm import SlurmUnavailable, configured_clusters


def test_cluster_names_every_configured_one_or_the_one_named():
    every = [c.name for c in configured_clusters()]
    assert cluster_names("") == every
    assert cluster_names(every[0]) == [every[0]]
    with pytest.raises(CommandError, match="Unknown cluster 'nowhere': configured are"):
        cluster_names("nowhere")


def _command() -> tuple[BaseCommand, io.StringIO]:
    err = io.StringIO()
    return BaseCommand(stdout=io.StringIO(), stderr=err), err


def test_for_each_cluster_goes_on_past_a_failing_cluster_and_names_it():
    ran = []

    def run(name: str) -> None:
        if name == "down":
            raise SlurmUnavailable("slurmctld does not answer")
        ran.append(name)

    command, err = _command()
    assert for_each_cluster(command, ["down", "up"], run) == ["down"]
    assert ran == ["up"]
    assert err.getvalue() == "down: Slurm: slurmctld does not answer\n"


def test_for_each_cluster_of_one_cluster_raises_its_slurm_error():
    def run(name: str) -> None:
        raise SlurmUnavailable("slurmctld does not answer")

    with pytest.raises(CommandError, match="^Slurm: slurmctld does not answer$"):
        for_each_cluster(_command()[0], ["only"], run)
