"""The CLI's HTTP behaviour against the real portal (pytest-django's live_server), and the CLI as a
site installs it on a login node: the zipapp of `make cli-zipapp`, run by a bare Python 3.9 and by
the system python3, outside any virtualenv."""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuportal_cli.client import ApiError, Client
from gpuportal_cli.main import main
from jobs.models import Job
from portal.services import api_token_create
from tests.jobs.test_clusters_jobs import two_inventories  # noqa: F401  (a fixture)
from tests.support import job_payload

ROOT = Path(__file__).resolve().parents[2]
CLI_PACKAGE = ROOT / "cli" / "gpuportal_cli"
SBATCH_PACKAGE = ROOT / "sbatch" / "gpuportal_sbatch"  # the #SBATCH parser the CLI depends on
sys.path.insert(0, str(ROOT / "cli"))
import build_pyz  # noqa: E402  (cli/build_pyz.py: what `make cli-zipapp` runs)


def python39() -> str:
    """A Python 3.9 interpreter: $PYTHON39, python3.9 on PATH, or pyenv's 3.9."""
    candidates = [os.environ.get("PYTHON39", ""), shutil.which("python3.9") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")), reverse=True)
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 9)"],
                                        capture_output=True).returncode == 0:  # fmt: skip
            return candidate
    pytest.fail("no Python 3.9 interpreter found (set PYTHON39=/path/to/python3.9)")


@pytest.fixture
def alice_key(world):
    return api_token_create(user=world.alice, name="cli http")[1]


@pytest.mark.django_db(transaction=True)
def test_a_post_the_portal_redirects_is_refused_and_creates_nothing(world, inventory_small, relays, live_server, alice_key):
    """Django's APPEND_SLASH answers a POST to /api/v1/jobs with a 301: urllib re-sent it as a GET
    (and `submit` printed the job list); the client refuses it."""
    client = Client(live_server.url, alice_key)
    with pytest.raises(ApiError) as caught:
        client.post("jobs", job_payload(), idempotency_key="k-301")
    assert caught.value.status == 301
    assert f"POST {live_server.url}/api/v1/jobs was redirected (301) to {live_server.url}/api/v1/jobs/; not followed" in caught.value.detail
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_requests_reuse_one_kept_alive_connection(world, live_server, alice_key):
    client = Client(live_server.url, alice_key)
    for _ in range(6):  # as `logs --follow` polls
        assert client.get("jobs/")["results"] == []
    assert client.get("teams/")["count"] == 1
    assert client.connections_opened == 1


@pytest.mark.django_db(transaction=True)
def test_a_get_redirect_within_the_portal_is_followed(world, live_server, alice_key):
    client = Client(live_server.url, alice_key)
    teams = client.get("teams")  # APPEND_SLASH: 301 to teams/
    assert [t["slug"] for t in teams["results"]] == ["vision"]


@pytest.mark.django_db(transaction=True)
def test_a_wrong_portal_url_is_a_one_line_error_naming_url_and_status(world, live_server, alice_key, tmp_path):
    """A URL with a path the portal does not serve answers with Django's HTML 404 page."""
    env = _env(tmp_path, GPUPORTAL_URL=live_server.url + "/gpu", GPUPORTAL_TOKEN=alice_key)
    result = subprocess.run([sys.executable, "-m", "gpuportal_cli", "teams"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 69
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"GET {live_server.url}/gpu/api/v1/teams/ answered 404 Not Found with text/html, not JSON" in err


@pytest.mark.django_db(transaction=True)
def test_submit_with_M_runs_the_job_on_that_cluster_over_the_scripts(world, two_inventories, relays, live_server, alice_key,
                                                                      cli_env, monkeypatch, tmp_path, capsys):  # fmt: skip
    monkeypatch.setenv("GPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("GPUPORTAL_TOKEN", alice_key)
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1 -t 10\n#SBATCH -M main\necho hi\n")

    assert main(["submit", str(script), "--team", "vision", "-M", "east"]) == 0
    assert main(["submit", str(script), "--team", "vision"]) == 0  # the script's -M main
    assert [job.cluster.name for job in Job.objects.order_by("created_at")] == ["east", "main"]
    capsys.readouterr()

    assert main(["submit", str(script), "--team", "vision", "--cluster", "west"]) == 65
    assert "cluster: No such cluster: 'west' (clusters here: east, main)." in capsys.readouterr().err
    assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_submit_after_makes_the_job_wait_for_the_named_jobs(world, inventory_small, relays, live_server, alice_key,
                                                           cli_env, monkeypatch, tmp_path, capsys):  # fmt: skip
    monkeypatch.setenv("GPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("GPUPORTAL_TOKEN", alice_key)
    script = tmp_path / "step.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1 -t 10\necho hi\n")
    assert main(["submit", str(script), "--team", "vision", "--json"]) == 0
    first = Job.objects.get()
    assert main(["submit", str(script), "--team", "vision", "--json", "--after", str(first.pk)]) == 0
    second = Job.objects.exclude(pk=first.pk).get()
    assert main(["submit", str(script), "--team", "vision", "--after", f"{first.pk},{second.pk}"]) == 0
    third = Job.objects.exclude(pk__in=[first.pk, second.pk]).get()
    assert [list(job.depends_on.order_by("created_at")) for job in (first, second, third)] == [[], [first], [first, second]]
    capsys.readouterr()
    assert main(["submit", str(script), "--team", "vision", "--after", "12345"]) == 65
    assert "depends_on" in capsys.readouterr().err
    assert Job.objects.count() == 3


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory) -> Path:
    return build_pyz.build(tmp_path_factory.mktemp("pyz") / "gpuportal.pyz")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("interpreter", ["python3.9", "system python3"])
def test_the_zipapp_runs_with_a_bare_python(world, live_server, alice_key, tmp_path, zipapp, interpreter):
    python = python39() if interpreter == "python3.9" else "/usr/bin/python3"
    env = _env(tmp_path)
    # the #SBATCH parser the CLI imports (sbatch/) is in the file: `python -I` finds nothing else
    assert {"gpuportal_sbatch/directives.py", "gpuportal_sbatch/options.py"} <= set(zipfile.ZipFile(zipapp).namelist())
    # -I: isolated (no PYTHONPATH, no user site, not this venv): only the zipapp and the stdlib
    login = subprocess.run([python, "-I", str(zipapp), "login", "--url", live_server.url, "--token", alice_key],
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert login.returncode == 0, login.stderr
    assert "Your teams: vision" in login.stdout
    teams = subprocess.run([python, "-I", str(zipapp), "teams"], env=env, capture_output=True, text=True, timeout=60)
    assert teams.returncode == 0, teams.stderr
    assert "vision" in teams.stdout and "nlp" not in teams.stdout


def test_the_cli_and_its_parser_parse_as_python_3_9_and_vermin_finds_nothing_newer():
    """No `match`, no 3.10+ syntax (ast with feature_version 3.9); vermin also checks the standard
    library names and calls the code uses (3.10+ modules, functions and keyword arguments). The CLI,
    its build script, and the #SBATCH parser it depends on (gpuportal-sbatch, and its generator)."""
    files = sorted(CLI_PACKAGE.glob("*.py")) + [ROOT / "cli" / "build_pyz.py", ROOT / "cli" / "setup.py"]
    files += sorted(SBATCH_PACKAGE.glob("*.py")) + [ROOT / "sbatch" / "generate_options.py"]
    assert len(files) >= 10 and SBATCH_PACKAGE / "directives.py" in files
    for path in files:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))
    vermin = shutil.which("vermin", path=os.path.dirname(sys.executable)) or shutil.which("vermin")
    assert vermin, "vermin is a dev dependency (pyproject.toml)"
    result = subprocess.run([vermin, "--no-tips", "--violations", "-t=3.9-", *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("package", "allowed"), [(CLI_PACKAGE, ("gpuportal_cli", "gpuportal_sbatch")), (SBATCH_PACKAGE, ("gpuportal_sbatch",))])
def test_the_cli_and_its_parser_import_nothing_but_the_standard_library(package, allowed):
    stdlib = set(sys.stdlib_module_names)
    seen = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                seen.add(top)
                assert top in stdlib or top in ("__future__", *allowed), f"{path.name} imports {name}"
    assert "re" in seen


def _env(tmp_path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env.update(extra)
    return env


def test_installing_the_server_gives_the_gpuportal_command():
    """The server depends on gpuportal-cli (by its path: setup.py), whose console script it is."""
    from importlib.metadata import distribution, requires

    assert any(r.split(";")[0].strip().startswith("gpuportal-cli") for r in requires("gpuportal") or [])
    scripts = {e.name: e.value for e in distribution("gpuportal-cli").entry_points if e.group == "console_scripts"}
    assert scripts == {"gpuportal": "gpuportal_cli.main:main"}
    command = Path(sys.executable).parent / "gpuportal"
    result = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "exit codes:" in result.stdout
