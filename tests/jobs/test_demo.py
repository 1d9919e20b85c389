"""The demo: jobs.demo.seed (site templates, idempotent) and what `make demo` runs like production —
scripts/supervise (restarts, process groups), deploy/gunicorn.conf.py, static files without DEBUG."""

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from jobs.demo import SITE_TEMPLATES, seed
from jobs.models import JobTemplate
from tests.support import wait_for


@pytest.mark.django_db
def test_seed_creates_site_templates_once():
    out = io.StringIO()
    assert seed(stdout=out) == len(SITE_TEMPLATES)
    assert seed(stdout=out) == 0
    assert JobTemplate.objects.filter(scope="site", name="PyTorch DDP, 1 node, 4 GPUs", gpus=4, nodes=1).count() == 1


# ---------------------------------------------------------------- make demo's processes (scripts/demo)

ROOT = Path(__file__).resolve().parents[2]
SUPERVISE = ROOT / "scripts" / "supervise"


def _state(state_dir: Path, name: str) -> dict | None:
    try:
        return json.loads((state_dir / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def _grandchild(tmp_path: Path) -> int:
    path = tmp_path / "grandchild"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), timeout=20, interval=0.05))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.fixture
def supervised(tmp_path):
    """scripts/supervise running `sh -c 'sleep 300 & echo $! > grandchild; wait'` (a child with a child
    of its own, like a prefork worker and its pool); stopped by pid at the end."""
    state_dir = tmp_path / "state"
    command = ["sh", "-c", f"sleep 300 & echo $! > {tmp_path}/grandchild; wait"]
    started = []

    def start():
        proc = subprocess.Popen([sys.executable, str(SUPERVISE), "--state", str(state_dir), "--stop-timeout", "5",
                                 "probe", "--", *command], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        started.append(proc)
        wait_for(lambda: (_state(state_dir, "probe") or {}).get("supervisor_pid") == proc.pid, timeout=20, interval=0.05)
        return proc

    yield start, state_dir, tmp_path
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    state = _state(state_dir, "probe")
    if state and state.get("pid"):
        try:
            os.killpg(state["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_supervise_restarts_a_killed_process_within_seconds_and_counts_it(supervised):
    start, state_dir, tmp_path = supervised
    start()
    first = _state(state_dir, "probe")
    grandchild = _grandchild(tmp_path)
    (tmp_path / "grandchild").unlink()
    os.kill(first["pid"], signal.SIGKILL)

    # Within seconds: RESTART_DELAY 1 s, doubled once for a fast exit; wait_for fails after 20 s.
    second = wait_for(lambda: (s := _state(state_dir, "probe")) and s["restarts"] == 1 and s["pid"] != first["pid"] and s,
                      timeout=20, interval=0.05)  # fmt: skip
    assert second["last_exit"] == "signal 9"
    assert _alive(second["pid"])
    # What the killed process left behind (its own child) went with it.
    wait_for(lambda: not _alive(grandchild), timeout=20, interval=0.05)


def test_supervise_stops_its_process_group_on_sigterm_and_removes_its_state(supervised):
    start, state_dir, tmp_path = supervised
    proc = start()
    child = _state(state_dir, "probe")["pid"]
    grandchild = _grandchild(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert not _alive(child) and not _alive(grandchild)
    assert _state(state_dir, "probe") is None


def test_supervise_stops_the_process_a_killed_supervisor_left_behind(supervised):
    start, state_dir, _ = supervised
    proc = start()
    orphan = _state(state_dir, "probe")["pid"]
    proc.kill()  # the supervisor dies without stopping its child
    proc.wait(timeout=10)
    assert _alive(orphan)

    start()
    wait_for(lambda: (s := _state(state_dir, "probe")) and s["pid"] != orphan, timeout=20, interval=0.05)
    wait_for(lambda: not _alive(orphan), timeout=20, interval=0.05)


def test_gunicorn_config_is_valid_and_its_environment_is_read_strictly():
    gunicorn = [sys.executable, "-m", "gunicorn", "--check-config", "-c", str(ROOT / "deploy" / "gunicorn.conf.py"), "portal.wsgi"]
    ok = subprocess.run(gunicorn, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(gunicorn, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=os.environ | {"GUNICORN_WORKERS": "many"})  # fmt: skip
    assert bad.returncode != 0
    assert "GUNICORN_WORKERS='many'" in bad.stdout + bad.stderr


@pytest.mark.django_db
def test_static_files_are_served_without_debug_from_static_root(settings, tmp_path):
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", "--noinput", verbosity=0)
    response = Client().get("/static/portal/site.css")
    assert response.status_code == 200
    assert "text/css" in response["Content-Type"]
    assert b"".join(response.streaming_content) == (tmp_path / "static" / "portal" / "site.css").read_bytes()
