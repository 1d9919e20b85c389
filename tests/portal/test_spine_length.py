"""Issue 38 item 3: a spine a newcomer can follow. No function on the submission, relay or sync path
is over 60 lines, counted as its body without its docstring (a signature and what it says of itself
are not the steps a reader follows). A function that grows past it is split into named steps, as
validate_job_spec (jobs.spec) and jobs_sync (jobs.services.sync) are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60

# the modules a submission crosses from the form, the API or the CLI's request to the scheduler, and
# back through the sync (docs/architecture.md, "The data path")
SPINE = [
    "jobs/apis.py",
    "jobs/forms.py",
    "jobs/views.py",
    "jobs/job_fields.py",
    "jobs/script_fields.py",
    "jobs/spec.py",
    "jobs/spec_fields.py",
    "jobs/spec_policy.py",
    "jobs/estimate.py",
    "jobs/dependencies.py",
    "jobs/workdirs.py",
    "jobs/services/submit.py",
    "jobs/services/relay.py",
    "jobs/services/sync.py",
    "jobs/tasks.py",
    "accounting/services/budget.py",
    "portal/db.py",
    "portal/services.py",
    "portal/slurm/request.py",
    "portal/slurm/cli.py",
    "portal/slurm/cli_argv.py",
    "portal/slurm/pyslurm.py",
    "portal/slurm/pyslurm_request.py",
    "portal/slurm/kubernetes.py",
    "portal/slurm/kube_job.py",
    "portal/slurm/parsing.py",
]


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function's body, its docstring left out."""
    body = function.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return function.end_lineno - body[0].lineno + 1


def long_functions(path: Path, limit: int = LIMIT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {body_lines(node)} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and body_lines(node) > limit
    ]


def test_the_count_reads_a_body_without_its_docstring():
    source = 'def f():\n    """Doc.\n\n    More."""\n' + "    x = 1\n" * 61 + "\n\ndef g():\n" + "    y = 2\n" * 60
    lengths = {node.name: body_lines(node) for node in ast.parse(source).body}
    assert lengths == {"f": 61, "g": 60}


def test_no_function_on_the_spine_is_over_60_lines():
    found = [line for module in SPINE for line in long_functions(ROOT / module)]
    assert found == [], "split into named steps:\n" + "\n".join(found)
