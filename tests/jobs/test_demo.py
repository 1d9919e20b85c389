"""The demo: jobs.demo.seed (site templates, idempotent) and what `make demo` runs like production —
scripts/supervise (restarts, process groups), the web server (deploy/gunicorn.conf.py with
portal/project/serve.py's settings and application), static files without DEBUG."""

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


def _web_environ(**extra) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WEB_", "GUNICORN_"))}
    return environ | extra


GUNICORN = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "deploy" / "gunicorn.conf.py")]


@pytest.mark.process
def test_gunicorn_config_is_valid_and_its_environment_is_read_strictly():
    ok = subprocess.run([*GUNICORN, "--check-config"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env=_web_environ(), check=False)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for name in ("WEB_WORKERS", "GUNICORN_WORKERS"):  # the old names too
        bad = subprocess.run([*GUNICORN, "--check-config"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             check=False, env=_web_environ(**{name: "many"}))  # fmt: skip
        assert bad.returncode != 0
        assert f"{name}='many'" in bad.stdout + bad.stderr


def _printed_config(environ: dict) -> dict:
    done = subprocess.run([*GUNICORN, "--print-config"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False, env=_web_environ(**environ))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in done.stdout.splitlines()) if v}


@pytest.mark.process
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, {"bind": "['127.0.0.1:8000']", "threads": "4", "accesslog": "-", "wsgi_app": "portal.project.serve:wsgi_application()"}),
        ({"WEB_BIND": "[::1]:8001", "WEB_WORKERS": "3", "WEB_THREADS": "2"}, {"bind": "['[::1]:8001']", "workers": "3", "threads": "2"}),
        ({"GUNICORN_BIND": "0.0.0.0:9000", "GUNICORN_TIMEOUT": "90"}, {"bind": "['0.0.0.0:9000']", "timeout": "90"}),  # a site's old variables
        ({"WEB_BIND": "127.0.0.1:9001", "GUNICORN_BIND": "0.0.0.0:9000"}, {"bind": "['127.0.0.1:9001']"}),
        ({"WEB_ACCESS_LOG": "0"}, {"accesslog": "None"}),
    ],
)
def test_the_web_servers_settings_come_from_the_environment(environ, expected):
    printed = _printed_config(environ)
    assert {key: printed.get(key) for key in expected} == expected


@pytest.mark.process
@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("WEB_BIND", "8000", "host:port"),
        ("WEB_BIND", "127.0.0.1:http", "host:port"),
        ("WEB_BIND", "127.0.0.1:70000", "host:port"),
        ("WEB_WORKERS", "0", ">= 1"),
        ("WEB_THREADS", "four", "a whole number"),
        ("WEB_TIMEOUT", "1", ">= 5"),
        ("WEB_ACCESS_LOG", "maybe", "one of 1/0"),
        ("GUNICORN_THREADS", "-1", ">= 1"),
    ],
)
def test_the_web_server_refuses_a_bad_variable_naming_it(name, value, reason):
    done = subprocess.run([*GUNICORN, "--check-config"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False, env=_web_environ(**{name: value}))  # fmt: skip
    assert done.returncode != 0
    assert f"{name}={value!r} is invalid" in done.stderr and reason in done.stderr


def test_the_web_workers_heap_is_frozen_after_its_first_requests(monkeypatch):
    """portal.project.serve.gc_settled: gc.freeze() once, at the n-th request (the collector then leaves the
    objects of the process's life alone), never before, and each request still reaches the app.
    The calls are counted, not gc.get_freeze_count(): a frozen object that is freed later leaves the
    permanent generation, so the count can drop by itself between two requests."""
    import gc

    from portal.project.serve import gc_settled

    calls = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(len(served)) or freeze())
    served = []
    app = gc_settled(lambda environ, start_response: served.append(environ["n"]) or [b""], after=3)
    frozen = gc.get_freeze_count()
    try:
        for n in range(2):
            app({"n": n}, None)
        assert calls == [] and gc.get_freeze_count() == frozen
        keep = [[n] for n in range(1000)]  # tracked objects that exist at the third request
        app({"n": 2}, None)
        assert calls == [2]  # frozen before the third request reached the app
        assert gc.get_freeze_count() >= frozen + len(keep)
        for n in range(3, 6):
            app({"n": n}, None)
        assert calls == [2]  # once only
        assert served == [0, 1, 2, 3, 4, 5]
    finally:
        gc.unfreeze()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, dict]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def _children(pid: int) -> set[int]:
    try:
        return {int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


@pytest.mark.process
def test_the_web_server_serves_the_api_logs_each_request_and_replaces_a_killed_worker(tmp_path):
    """gunicorn with the demo's configuration, for real: two workers answer the API's JSON errors
    through the application factory (portal.project.serve.wsgi_application), every request is in the access
    log, and a worker killed with SIGKILL is replaced while the other serves."""
    port = _free_port()
    log = tmp_path / "web.log"
    environ = _web_environ(WEB_BIND=f"127.0.0.1:{port}", WEB_WORKERS="2", WEB_THREADS="2", DEBUG="1",
                           DJANGO_SETTINGS_MODULE="portal.project.settings")  # fmt: skip
    with open(log, "w") as out:
        server = subprocess.Popen(GUNICORN, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:

        def answers():
            try:
                return _get(port, "/api/v1/jobs/")
            except OSError:
                assert server.poll() is None, log.read_text()
                return None

        status, body = wait_for(answers, timeout=60, interval=0.2, what="gunicorn to answer")
        assert status == 401 and body["detail"] == "Authentication credentials were not provided."
        workers = wait_for(lambda: len(c := _children(server.pid)) == 2 and c, timeout=30, what="two workers")
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        assert [_get(port, "/api/v1/no-such-endpoint/")[0] for _ in range(5)] == [404] * 5  # the other one serves
        replaced = wait_for(lambda: len(c := _children(server.pid)) == 2 and victim not in c and c, timeout=30,
                            what="a new worker")  # fmt: skip
        assert len(replaced - workers) == 1
        status, body = _get(port, "/api/v1/no-such-endpoint/")
        assert status == 404 and body["detail"]
        wait_for(lambda: log.read_text().count('"GET /api/v1/no-such-endpoint/ HTTP/1.1" 404') >= 6, timeout=10,
                 interval=0.05, what="every request in the access log")  # fmt: skip
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


@pytest.mark.django_db
def test_static_files_are_served_without_debug_from_static_root(settings, tmp_path):
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", "--noinput", verbosity=0)
    response = Client().get("/static/portal/site.css")
    assert response.status_code == 200
    assert "text/css" in response["Content-Type"]
    assert b"".join(response.streaming_content) == (tmp_path / "static" / "portal" / "site.css").read_bytes()


# ---------------------------------------------------------------- scripts/demo env: a shell Slurm still works in

# Two clusters served: before issue 38 this was exported as SLURM_CLUSTERS, which sinfo, squeue and
# scripts/cluster then read as --clusters ("No cluster 'name=gpuportal' known by database").
TWO_CLUSTERS = "name=gpuportal,backend=auto,conf=/x/slurm.conf;name=gpuportal25,backend=auto,conf=/y/slurm.conf"


def _demo_env_run(tmp_path: Path, *then: str) -> subprocess.CompletedProcess:
    """`eval "$(scripts/demo env)"` with a run directory of its own (the clusters file of a two-cluster
    demo in it), then the commands ``then`` in that shell; `env` at the end prints what it exports. The
    shell is a new user's: no Slurm variable of the caller's (a developer's shell after
    `eval "$(scripts/cluster env)"` has SLURM_CLUSTER, which is not the demo's to export)."""
    (tmp_path / "gpuportal_clusters").write_text(TWO_CLUSTERS + "\n")
    script = 'eval "$(scripts/demo env)" || exit 9\n' + "\n".join(then) + "\necho '--- env'; env"
    environ = {k: v for k, v in os.environ.items() if k != "GPUPORTAL_CLUSTERS" and not k.startswith("SLURM_")}
    environ["GPUPORTAL_RUN_DIR"] = str(tmp_path)
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=180, check=False)


def test_demo_env_exports_no_name_a_slurm_command_reads_but_slurm_conf(tmp_path):
    done = _demo_env_run(tmp_path)
    assert done.returncode == 0, done.stderr
    exported = dict(line.split("=", 1) for line in done.stdout.partition("--- env\n")[2].splitlines() if "=" in line)
    assert exported["GPUPORTAL_CLUSTERS"] == TWO_CLUSTERS and "SLURM_CLUSTERS" not in exported
    assert exported["GPUPORTAL_RUN_DIR"] == str(tmp_path) and exported["DATABASE_URL"].startswith("postgres://")
    assert sorted(name for name in exported if name.startswith("SLURM_")) == ["SLURM_CONF"]


@pytest.mark.django_db
def test_after_demo_env_slurms_commands_and_scripts_cluster_answer(cluster, tmp_path):
    done = _demo_env_run(tmp_path, "sinfo -h -o '%P' || exit 11", "squeue -h -o '%i' >/dev/null || exit 12",
                         "scripts/cluster status; echo \"cluster status exit $?\"")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu*" in done.stdout.split() and "known by database" not in done.stderr
    assert "controller not answering" not in done.stdout and "  slurmctld        running" in done.stdout
