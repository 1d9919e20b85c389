"""The layers of the import contract (pyproject.toml [tool.importlinter], issue 29): the project
(portal.project) over jobs over accounting over the core (every other child of portal/). lint-imports
checks the imports between the layers; this checks that no module of portal/ stands outside them."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import portal

ROOT = Path(__file__).resolve().parents[2]


def _layers() -> list[set[str]]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers" and "portal.project" in c["layers"]]
    return [{name.strip() for name in layer.split(":")} for layer in layers]


def test_the_project_stands_over_jobs_over_accounting_over_the_core():
    project, jobs, accounting, core = _layers()
    assert (project, jobs, accounting) == ({"portal.project"}, {"jobs"}, {"accounting"})
    assert {"portal.models", "portal.services", "portal.slurm", "portal.tasks"} <= core


def test_every_module_of_portal_stands_in_a_layer():
    """A module put directly in portal/ is core only when the contract says so: one that imports an app
    belongs in portal/project/. scripts/dev/split-portal-layers writes the core layer from the tree."""
    children = {f"portal.{module.name}" for module in pkgutil.iter_modules(portal.__path__)}
    listed = set().union(*_layers())
    assert children - listed == set(), "modules of portal/ in no layer of pyproject.toml's layers contract"
    assert {name for name in listed if name.startswith("portal.")} - children == set(), "layers naming no module"


def _cycles_within(graph, app: str) -> list[tuple[str, ...]]:
    """Each import cycle inside ``app`` as the shortest chain back (module-level and function-level
    imports alike: grimp reads both), between two modules neither of which contains the other."""
    modules = sorted(m for m in graph.modules if m == app or m.startswith(f"{app}."))
    found = set()
    for importer in modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            inside = imported.startswith(f"{app}.") and not imported.startswith(f"{importer}.") and not importer.startswith(f"{imported}.")
            if inside and graph.chain_exists(importer=imported, imported=importer):
                found.add((importer, *graph.find_shortest_chain(importer=imported, imported=importer)))
    return sorted(found)


def test_no_import_cycle_inside_an_app():
    """Issue 38: one direction inside each app (a tasks module imports its services; services name the
    tasks they enqueue, portal.outbox.task_named; models never import services)."""
    import grimp

    graph = grimp.build_graph("portal", "jobs", "accounting", include_external_packages=False)
    for app in ("portal", "jobs", "accounting"):
        assert _cycles_within(graph, app) == [], f"import cycles inside {app}"
