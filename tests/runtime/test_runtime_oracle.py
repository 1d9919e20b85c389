"""A differential runtime oracle: jobs run through the portal as they run under sbatch (issue 28).

Every script of tests/runtime/corpus/ (researchers' shapes: srun/torchrun-like multi-task and
multi-node jobs, --gpus-per-task, arrays with %a outputs, cd $SLURM_SUBMIT_DIR, relative outputs
and inputs, --chdir, a variable of the user's login environment, a variable given at submission,
set -euo pipefail, a python3 script) is submitted, on one cluster and backend:

- ``sbatch``: by alice in a login shell, ``su - alice -c 'cd DIR && sbatch job.sh'``, with the
  cluster's own Slurm first on PATH and its SLURM_CONF (the oracle);
- ``api``: POST /api/v1/jobs/ with ``submit_dir`` = DIR (what a script of the user's would send);
- ``cli``: the body ``gpuportal submit job.sh`` builds when run in DIR, posted to the API;
- ``form``: the job page's form (no directory: the user's default, JOB_DEFAULT_WORKDIR, which the
  relay creates when missing).

Each in a directory of its own holding the same input files. The portal's jobs are relayed by the
real relay (``job_relay_run``, the gateway of the target). Everything is submitted first, then
waited for. Compared: the final state and exit code of each job (each array task), every file the
job left in its directories (names with job ids normalised, contents), the batch script's and each
step's environment (``env.*`` files: PATH, HOME, the user's variables, the SLURM_* variables,
values with the run's directory and job ids normalised), the working directory and SLURM_SUBMIT_DIR
(files the scripts write), and for the API's jobs the output API's answer against the file.

Differences fail, except those in ``ALLOWED`` (with the reason). Runs on cli 22.05, cli 25.11 and
pyslurm 25.11 (marker slurm; `.ci/run` runs it through `make test`).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.test import APIClient

from gpuportal_cli.main import build_parser
from gpuportal_cli.submit import build_submission
from jobs.models import Job
from jobs.services import job_relay_run
from tests.support import DEFAULT_RELEASE, cluster_env, use_slurm_target

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

CORPUS = Path(__file__).parent / "corpus"
SCRIPTS = sorted(CORPUS.glob("*.sh"))
MODES = ("sbatch", "api", "cli", "form")
TARGETS = (("cli", "22.05"), ("cli", "25.11"), ("pyslurm", "25.11"))
USER = "alice"
LOGIN_VARIABLE = ("GPUPORTAL_ORACLE_LOGIN", "from-the-login-profile")

# What a case is submitted with besides its script: sbatch's command line / the portal's fields.
CASE_OPTIONS = {
    "10-chdir-flag": {"chdir": "sub2"},
    "13-python3-script": {"environment": {"DATASET": "imagenet-1k"}},
    "14-user-variable": {"environment": {"DATASET": "imagenet-1k", "SEED": "a b,c'd"}},
}
# The files every directory holds before the job (the inputs beside the script)
INPUTS = {"data/input.txt": "42\n", "sub/.keep": "", "sub2/.keep": "", "helper.sh": 'echo "helper in $(pwd) as $(id -un)"\n'}

# The cases whose scripts read files beside them (in the form's default directory too)
NEEDS_INPUTS = {"08-relative-input", "09-chdir-relative", "10-chdir-flag", "22-helper-beside-script"}
# Environment variables whose value depends on the allocation, not on how the job was submitted:
# their presence is compared, not their value.
ALLOCATION = {
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_ARRAY_JOB_ID", "SLURM_TASK_PID", "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT", "SLURM_JOB_NODELIST",
    "SLURM_NODELIST", "SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR", "SLURM_STEP_NODELIST", "SLURM_NODEID",
    "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_STEPID", "SLURM_STEP_ID",
}  # fmt: skip
# Differences that remain, and why (variable -> reason). Neither presence nor value is compared.
ALLOWED = {
    "_": "the last command of the shell that ran sbatch (the login shell's /usr/bin/sbatch); the portal "
         "submits from no shell, so slurmd's login environment (su - user -c env) leaves /usr/bin/env",
    "OLDPWD": "the login shell's previous directory (`cd DIR && sbatch`): the portal runs no shell",
    "TERM": "the terminal of the shell that ran sbatch: the portal's jobs come from no terminal",
    "SLURM_EXPORT_ENV": "ALL through the portal (srun steps then inherit the job's environment, as under sbatch's "
                        "default --export=ALL, where it is unset: sbatch's documented remedy for --export=NONE)",
    "SLURM_GET_USER_ENV": "1 through the portal: the job's environment is the user's login environment, read on the "
                          "node (su - user -c env), not copied from the root worker that submits it",
}  # fmt: skip
# ... and those of one backend only
ALLOWED_BY_BACKEND = {
    "pyslurm": {
        "SLURM_NTASKS": "pyslurm 25.11.2 always sends a task count (submission.pyx _set_defaults: ntasks=1) where "
                        "sbatch sends none, so slurmd sets SLURM_NTASKS=1 / SLURM_NPROCS=1 for a script without one",
        "SLURM_NPROCS": "as SLURM_NTASKS",
        "SLURM_PROFILE": "None through pyslurm: pyslurm 25.11.2 cannot send sbatch's 'not set' (it sends NO_VAL, "
                         "which slurmd reads as every profile), so the portal asks for none: no profile is gathered",
    },
}  # fmt: skip
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


@pytest.fixture(params=TARGETS, ids=[f"{b}-{r}" for b, r in TARGETS])
def target(request, settings):
    """The fixture world on one cluster and backend (inventory synced, teams mirrored)."""
    backend, release = request.param
    use_slurm_target(settings, backend, release)
    request.getfixturevalue("cluster")
    env = cluster_env(release) if release != DEFAULT_RELEASE else {"SLURM_CONF": settings.SLURM_CONF, "SLURM_BIN_DIR": ""}
    return backend, release, env


def _as_user(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", USER, "--", *argv], capture_output=True, text=True, check=check,
                          timeout=60, **kwargs)  # fmt: skip


def _login_profile() -> None:
    """The user's login profile exports a variable of their own (as a researcher's ~/.profile does)."""
    name, value = LOGIN_VARIABLE
    profile = Path(pwd.getpwnam(USER).pw_dir) / ".profile"
    line = f"export {name}={value}  # gpuportal tests/runtime: a variable of the login environment\n"
    text = profile.read_text() if profile.exists() else ""
    if line not in text:
        _as_user("sh", "-c", f"printf '%s' {shlex.quote(line)} >> {shlex.quote(str(profile))}")


def _prepare(directory: Path, script: str) -> None:
    """The directory with the inputs and the script, the user's own (made here, then given to the user:
    one process, where the user's own mkdir would be a dozen)."""
    entry = pwd.getpwnam(USER)
    directory.mkdir(parents=True, exist_ok=True)
    for relative, content in {**INPUTS, "job.sh": script}.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    home = Path(entry.pw_dir)
    for path in [directory, *directory.rglob("*"), *(p for p in directory.parents if home in p.parents)]:
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _sbatch(directory: Path, case: str, env: dict[str, str]) -> int:
    """sbatch as the user types it in a login shell, in ``directory``."""
    options = CASE_OPTIONS.get(case, {})
    exports = [f"export SLURM_CONF={shlex.quote(env['SLURM_CONF'])}"]
    if env.get("SLURM_BIN_DIR"):
        exports.append(f"export PATH={shlex.quote(env['SLURM_BIN_DIR'])}:$PATH")
    exports += [f"export {name}={shlex.quote(value)}" for name, value in options.get("environment", {}).items()]
    flags = " ".join(shlex.quote(f) for f in (["--chdir", options["chdir"]] if "chdir" in options else []))
    command = "; ".join(exports) + f"; cd {shlex.quote(str(directory))} && sbatch --parsable -A vision {flags} job.sh"
    done = subprocess.run(["su", "-", USER, "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{case}: sbatch refused it: {done.stderr}"
    return int(done.stdout.strip().split(";")[0])


def _portal(mode: str, directory: Path, case: str, script: str, world, settings) -> Job:
    """Submit through the portal's API, CLI or form; relay it (the real relay) and return the job."""
    options = CASE_OPTIONS.get(case, {})
    environment = options.get("environment", {})
    if mode == "api":
        body = {"team": "vision", "script": script, "submit_dir": str(directory), "environment": environment}
        if "chdir" in options:
            body["workdir"] = str(directory / options["chdir"])
        response = _api(world).post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, (case, response.json())
        job_id = response.json()["id"]
    elif mode == "cli":
        argv = ["submit", "job.sh", "--team", "vision"]
        argv += ["--workdir", options["chdir"]] if "chdir" in options else []
        for name, value in environment.items():
            argv += ["--env", f"{name}={value}"]
        args = build_parser().parse_args(argv)
        cwd = os.getcwd()
        os.chdir(directory)  # the CLI runs in the user's directory (it sends it as submit_dir)
        try:
            body, _notes = build_submission(args, script, "job.sh")
        finally:
            os.chdir(cwd)
        response = _api(world).post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, (case, response.json())
        job_id = response.json()["id"]
    else:  # the form: no directory field, the user's default directory
        settings.JOB_DEFAULT_WORKDIR = str(directory).replace(f"/{USER}/", "/{user}/", 1)
        data = {"team": "vision", "script": script, "idempotency_key": uuid.uuid4().hex,
                "environment": "\n".join(f"{k}={v}" for k, v in environment.items())}  # fmt: skip
        if "chdir" in options:
            data["workdir"] = str(directory / options["chdir"])
        client = Client()
        client.force_login(world.alice)
        response = client.post("/jobs/new/", data)
        assert response.status_code == 302, (case, response.content.decode()[:2000])
        job_id = response.url.rstrip("/").split("/")[-1]
    job = Job.objects.get(pk=job_id)
    assert job.submit_dir == str(directory), (case, mode, job.submit_dir)
    outcome = job_relay_run(job.pk)
    job.refresh_from_db()
    assert outcome == "submitted" and job.slurm_job_id, (case, mode, outcome, job.state_reason)
    return job


def _api(world) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=world.alice)
    return client


def _sacct(env: dict[str, str], ids: list[int]) -> dict[int, list[tuple[str, str, str]]]:
    """Each job's allocations (array tasks): [(task index or "", state, exit code, raw id, ReqTRES, nodes)]."""
    sacct = os.path.join(env["SLURM_BIN_DIR"], "sacct") if env.get("SLURM_BIN_DIR") else "sacct"
    done = subprocess.run(
        [sacct, "-n", "-P", "-X", "-j", ",".join(map(str, ids)), "-o", "JobID,JobIDRaw,State,ExitCode,ReqTRES,NNodes"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "SLURM_CONF": env["SLURM_CONF"]}, check=True,
    )  # fmt: skip
    rows: dict[int, list] = {}
    for line in done.stdout.splitlines():
        job_id, raw, state, exit_code, requested, nodes = line.split("|")
        head, _, index = job_id.partition("_")
        if index.startswith("["):
            continue  # a pending remainder of an array
        rows.setdefault(int(head), []).append((index, state.split()[0], exit_code, raw, requested, nodes))
    return rows


def _wait(env: dict[str, str], expected: dict[int, int], timeout: float = 240.0) -> dict[int, list]:
    """Until every job (and each of its ``expected`` array tasks) ended and its accounting record is
    whole (slurmdbd may hold a job's end before its start record: ReqTRES empty for a moment); its
    sacct rows."""
    deadline = time.monotonic() + timeout
    while True:
        rows = _sacct(env, list(expected))
        done = all(len(rows.get(j, [])) >= n and all(r[1] in TERMINAL and r[4] for r in rows[j]) for j, n in expected.items())
        if done or time.monotonic() > deadline:
            return rows
        time.sleep(1.0)


def _files(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` but the inputs and the script: relative path -> content."""
    found = {}
    for path in sorted(directory.rglob("*")):
        relative = str(path.relative_to(directory))
        if path.is_file() and relative not in INPUTS and relative != "job.sh":
            found[relative] = path.read_text(errors="replace")
    return found


# srun's notes when a step waits for the previous one's resources: timing, not how the job was submitted
STEP_WAIT = re.compile(r"^srun: ([Jj]ob \d+ step creation (temporarily disabled|still disabled), retrying.*"
                       r"|Step created for (job \d+|StepId=\d+\.\d+))\n", re.M)  # 22.05's, 25.11's


def _normalise(text: str, directory: Path, raw_ids: list[str]) -> str:
    text = STEP_WAIT.sub("", text.replace(str(directory), "DIR"))
    for raw in sorted(raw_ids, key=len, reverse=True):
        text = re.sub(rf"(?<![0-9])(?<![0-9]\.){raw}(?![0-9]|\.[0-9])", "JOBID", text)  # not in 127.0.0.1
    return re.sub(r"\b(a100|h100)-0[0-9]\b", "NODE", text)


def _environment(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            env[name] = value
    return env


# How the tasks of one request were laid out on the nodes: Slurm chooses that from what is free at
# the moment (`--ntasks=2 --gpus-per-task=1` fits one node or two). Compared when Slurm gave the
# sbatch job and the portal's the same number of nodes for the same ReqTRES; when it did not, the
# requests are still compared (ReqTRES) and these are not: they describe the placement, not the request.
PLACEMENT = {
    "SLURM_CPUS_ON_NODE", "SLURM_DISTRIBUTION", "SLURM_GPUS_ON_NODE", "SLURM_GTIDS", "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_LOCALID", "SLURMD_TRES_BIND",
}  # fmt: skip


def _tres_per_task(value: str, cpus_per_task: str | None) -> str:
    """SLURM_TRES_PER_TASK as one spelling: sbatch sends `cpu=2,gres/gpu=2`; a descriptor (pyslurm)
    `gres/gpu:2` with the CPUs as cpus_per_task (then in SLURM_CPUS_PER_TASK, which srun reads too)."""
    parts = sorted(re.sub(r"^(gres/[^:=]+(?::[^:=]+)?):(\d+)$", r"\1=\2", p) for p in value.split(",") if p)
    return ",".join(p for p in parts if p != f"cpu={cpus_per_task}")


def _compare_env(where: str, oracle: str, portal: str, backend: str, placed_alike: bool = True) -> list[str]:
    a, b = _environment(oracle), _environment(portal)
    for env in (a, b):
        if "SLURM_TRES_PER_TASK" in env:
            env["SLURM_TRES_PER_TASK"] = _tres_per_task(env["SLURM_TRES_PER_TASK"], env.get("SLURM_CPUS_PER_TASK"))
    problems = []
    skipped = set(ALLOWED) | set(ALLOWED_BY_BACKEND.get(backend, {})) | (set() if placed_alike else PLACEMENT)
    for name in sorted((set(a) | set(b)) - skipped):
        if name not in a or name not in b:
            problems.append(f"{where}: {name} only {'under sbatch' if name in a else 'through the portal'} "
                            f"({a.get(name, b.get(name))!r})")  # fmt: skip
        elif name not in ALLOCATION and a[name] != b[name]:
            problems.append(f"{where}: {name}={a[name]!r} under sbatch, {b[name]!r} through the portal")
    return problems


def test_the_corpus_covers_the_shapes_researchers_use():
    text = "\n".join(p.read_text() for p in SCRIPTS)
    assert len(SCRIPTS) >= 20
    for shape in ("srun", "--ntasks-per-node", "-N 2", "--gpus-per-task", "--array", "%a", "cd \"$SLURM_SUBMIT_DIR\"",
                  "--output=%x-%j.out", "data/input.txt", "--chdir", "GPUPORTAL_ORACLE_LOGIN", "set -euo pipefail",
                  "#!/usr/bin/env python3", "DATASET"):  # fmt: skip
        assert shape in text, shape


def test_jobs_run_through_the_portal_as_under_sbatch(target, relays, settings, cluster):
    backend, release, env = target
    _login_profile()
    root = Path(pwd.getpwnam(USER).pw_dir) / "gpuportal-oracle" / f"{os.getpid()}-{backend}-{release}"
    started = time.monotonic()
    runs: dict[tuple[str, str], dict] = {}  # (case, mode) -> {"dir", "id", "job"}
    for path in SCRIPTS:
        case, script = path.stem, path.read_text()
        for mode in MODES:
            directory = root / case / mode
            if mode != "form" or case in NEEDS_INPUTS:  # else the default directory does not exist: the relay creates it
                _prepare(directory, script)
            if mode == "sbatch":
                runs[case, mode] = {"dir": directory, "id": _sbatch(directory, case, env), "job": None}
            else:
                job = _portal(mode, directory, case, script, cluster, settings)
                runs[case, mode] = {"dir": directory, "id": job.slurm_job_id, "job": job}
    submitted = time.monotonic()
    expected = {run["id"]: (run["job"].array_tasks if run["job"] else _tasks(run["dir"])) for run in runs.values()}
    rows = _wait(env, expected)
    print(f"\n{len(runs)} jobs ({len(SCRIPTS)} scripts x {len(MODES)}) on {backend}-{release}: submitted in "
          f"{submitted - started:.1f} s, all ended {time.monotonic() - submitted:.1f} s later")  # fmt: skip

    problems: list[str] = []
    for path in SCRIPTS:
        case = path.stem
        oracle = runs[case, "sbatch"]
        oracle_rows = rows.get(oracle["id"], [])
        if not oracle_rows or any(r[1] not in TERMINAL for r in oracle_rows):
            problems.append(f"{case}: the sbatch job did not end ({oracle_rows})")
            continue
        oracle_files = {_normalise(name, oracle["dir"], [r[3] for r in oracle_rows]): _normalise(text, oracle["dir"], [r[3] for r in oracle_rows])
                        for name, text in _files(oracle["dir"]).items()}  # fmt: skip
        for mode in MODES[1:]:
            run = runs[case, mode]
            where = f"{case} [{mode}]"
            portal_rows = rows.get(run["id"], [])
            raw = [r[3] for r in portal_rows]
            if [r[:3] for r in portal_rows] != [r[:3] for r in oracle_rows]:
                problems.append(f"{where}: state/exit {[r[:3] for r in portal_rows]} vs sbatch {[r[:3] for r in oracle_rows]}")
            if [r[4] for r in portal_rows] != [r[4] for r in oracle_rows]:
                problems.append(f"{where}: ReqTRES {[r[4] for r in portal_rows]} vs sbatch {[r[4] for r in oracle_rows]}")
            placed_alike = [r[5] for r in portal_rows] == [r[5] for r in oracle_rows]
            files = {_normalise(name, run["dir"], raw): _normalise(text, run["dir"], raw) for name, text in _files(run["dir"]).items()}
            if set(files) != set(oracle_files):
                problems.append(f"{where}: files {sorted(files)} vs sbatch {sorted(oracle_files)}")
            for name in sorted(set(files) & set(oracle_files)):
                if os.path.basename(name).startswith("env.") or name == "py-env.txt":
                    problems += _compare_env(f"{where} {name}", oracle_files[name], files[name], backend, placed_alike)
                elif files[name] != oracle_files[name]:
                    problems.append(f"{where} {name}: {files[name]!r} vs sbatch {oracle_files[name]!r}")
            if mode == "api":
                problems += _output_api_agrees(run, cluster, where)
    assert not problems, f"{len(problems)} differences from sbatch (the jobs' directories: {root}):\n" + "\n".join(problems)
    shutil.rmtree(root)  # kept when something differs, to look at


def _tasks(directory: Path) -> int:
    match = re.search(r"--array=(\d+)-(\d+)", (directory / "job.sh").read_text())
    return int(match[2]) - int(match[1]) + 1 if match else 1


def _output_api_agrees(run: dict, world, where: str) -> list[str]:
    """GET /api/v1/jobs/{id}/output/ answers the job's stdout file, wherever its directory is."""
    job: Job = run["job"]
    job.refresh_from_db()
    from jobs.selectors import job_output_path

    path = job_output_path(job, "stdout")
    if not path or not os.path.exists(path):
        return []  # no stdout file (e.g. an array's first task wrote elsewhere): nothing to read
    answer = _api(world).get(f"/api/v1/jobs/{job.pk}/output/?stream=stdout&offset=0&length=100000").json()
    expected = Path(path).read_text(errors="replace")
    return [] if answer.get("data") == expected else [f"{where}: the output API answered {answer!r}, the file holds {expected!r}"]
