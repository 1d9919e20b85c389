"""What the management commands that take ``--cluster`` share (sync_cluster, ingest_usage): which
clusters to run for, and running for each with one cluster's Slurm error not stopping the others."""

from __future__ import annotations

from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError

from portal.slurm import SlurmError, configured_clusters


def cluster_names(name: str) -> list[str]:
    """Every configured cluster, or only ``name`` (CommandError when it is not configured)."""
    names = [c.name for c in configured_clusters()]
    if name:
        if name not in names:
            raise CommandError(f"Unknown cluster {name!r}: configured are {', '.join(names)}.")
        names = [name]
    return names


def for_each_cluster(command: BaseCommand, names: list[str], run: Callable[[str], None]) -> list[str]:
    """``run(name)`` for each cluster. A Slurm error is the CommandError of a run for one cluster;
    with several, it is written to stderr and the others still run. Returns the clusters that failed."""
    failed = []
    for name in names:
        try:
            run(name)
        except SlurmError as exc:
            if len(names) == 1:
                raise CommandError(f"Slurm: {exc.message}") from exc
            command.stderr.write(f"{name}: Slurm: {exc.message}")
            failed.append(name)
    return failed
