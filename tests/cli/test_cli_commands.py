"""The CLI's commands against a stand-in HTTP API: login and its config file, what submit sends,
retries with one Idempotency-Key, error printing and exit codes. No Django backend involved."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gpuportal_cli import config as cli_config
from gpuportal_cli.main import main

JOB_ID = "3f1c2e9a-1111-4222-8333-944455556666"
JOB_PATH = f"/api/v1/jobs/{JOB_ID}/"


def _job(state="ACCEPTED", **extra):
    return {"id": JOB_ID, "name": "train", "team": "vision", "state": state, "slurm_job_id": None, "gpus": 1, **extra}


# ---------------------------------------------------------------- login and config


def test_login_verifies_token_and_stores_config_with_mode_0600(fake_api, cli_env, monkeypatch, capsys):
    monkeypatch.delenv("GPUPORTAL_URL")
    monkeypatch.delenv("GPUPORTAL_TOKEN")
    fake_api.add("GET", "/api/v1/teams/", 200, {"count": 1, "next": None, "previous": None, "results": [{"slug": "vision"}]})

    assert main(["login", "--url", fake_api.url + "/", "--token", "gpp_secret"]) == 0

    path = cli_env / "xdg" / "gpuportal" / "config.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": fake_api.url, "token": "gpp_secret"}
    assert fake_api.requests_to("GET", "/api/v1/teams/")[0]["headers"]["Authorization"] == "Token gpp_secret"
    assert "vision" in capsys.readouterr().out


def test_login_keeps_mode_0600_when_rewriting_a_wider_file(fake_api, cli_env, monkeypatch):
    monkeypatch.delenv("GPUPORTAL_TOKEN")
    path = cli_env / "xdg" / "gpuportal" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    path.chmod(0o644)
    fake_api.add("GET", "/api/v1/teams/", 200, {"results": []})

    assert main(["login", "--token", "gpp_new"]) == 0

    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_login_prompts_for_missing_url_and_token(fake_api, cli_env, monkeypatch):
    monkeypatch.delenv("GPUPORTAL_URL")
    monkeypatch.delenv("GPUPORTAL_TOKEN")
    fake_api.add("GET", "/api/v1/teams/", 200, {"results": []})
    monkeypatch.setattr("builtins.input", lambda prompt: fake_api.url)
    monkeypatch.setattr("getpass.getpass", lambda prompt: "gpp_typed")

    assert main(["login"]) == 0

    assert cli_config.load().token == "gpp_typed"


def test_login_with_a_refused_token_exits_77_and_stores_nothing(fake_api, cli_env, monkeypatch, capsys):
    monkeypatch.delenv("GPUPORTAL_URL")
    fake_api.add("GET", "/api/v1/teams/", 401, {"detail": "Invalid or revoked API token.", "errors": {}})

    assert main(["login", "--url", fake_api.url, "--token", "gpp_bad"]) == 77

    assert not (cli_env / "xdg" / "gpuportal" / "config.json").exists()
    assert "Invalid or revoked API token." in capsys.readouterr().err


def test_environment_overrides_stored_config(cli_env, monkeypatch):
    cli_config.save(cli_config.Config(url="https://stored.example", token="gpp_stored"))
    assert cli_config.load() == cli_config.Config(url="https://stored.example", token="gpp_stored")
    monkeypatch.setenv("GPUPORTAL_URL", "https://env.example/api/v1/")
    monkeypatch.setenv("GPUPORTAL_TOKEN", "gpp_env")
    assert cli_config.load() == cli_config.Config(url="https://env.example", token="gpp_env")


def test_commands_without_login_exit_77(cli_env, capsys):
    assert main(["status"]) == 77
    assert "gpuportal login" in capsys.readouterr().err


# ---------------------------------------------------------------- submit


SCRIPT = """#!/bin/bash
#SBATCH --job-name=train
#SBATCH --gres=gpu:a100:1
#SBATCH --time=5
#SBATCH --partition=debug
echo CUDA=$CUDA_VISIBLE_DEVICES
"""


def test_submit_sends_the_script_and_only_the_flags_given_and_an_idempotency_key(fake_api, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    fake_api.add("POST", "/api/v1/jobs/", 201, _job(estimated_gpu_hours="0.17", estimated_cost="1.70", currency="CNY"))

    code = main(["submit", str(script), "--team", "vision", "--time", "2h", "--gpus", "2", "--mem", "16G"])

    assert code == 0
    (request,) = fake_api.requests_to("POST", "/api/v1/jobs/")
    # the server reads the #SBATCH lines (name, GPU type, partition); the flags override them
    assert request["json"] == {"team": "vision", "script": SCRIPT, "gpus": 2, "time_limit_minutes": 120, "memory_gb": 16,
                               "submit_dir": str(tmp_path)}  # submitted from where it runs, as sbatch  # fmt: skip
    assert len(request["headers"]["Idempotency-Key"]) >= 32
    assert request["headers"]["Authorization"] == "Token gpp_test"
    out = capsys.readouterr().out
    assert JOB_ID in out and "1.70 CNY" in out


def test_submit_retries_a_failed_post_with_the_same_idempotency_key(fake_api, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    fake_api.add("POST", "/api/v1/jobs/", 503, {"detail": "Service unavailable.", "errors": {}})
    fake_api.add("POST", "/api/v1/jobs/", 201, _job())

    assert main(["submit", str(script), "--team", "vision"]) == 0

    keys = [r["headers"]["Idempotency-Key"] for r in fake_api.requests_to("POST", "/api/v1/jobs/")]
    assert len(keys) == 2 and keys[0] == keys[1]


def test_submit_rides_out_a_failover_of_503s_with_one_job(fake_api, tmp_path):
    """A database failover keeps the portal answering 503 for 9–30 s (docs/reliability.md): a keyed
    submit retries through six of them (Retry-After honoured) and makes one job, not an error."""
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    for _ in range(6):
        fake_api.add("POST", "/api/v1/jobs/", 503, {"detail": "The portal's database or cache is not answering.", "errors": {}})
    fake_api.add("POST", "/api/v1/jobs/", 201, _job())

    assert main(["submit", str(script), "--team", "vision"]) == 0
    keys = {r["headers"]["Idempotency-Key"] for r in fake_api.requests_to("POST", "/api/v1/jobs/")}
    assert len(fake_api.requests_to("POST", "/api/v1/jobs/")) == 7 and len(keys) == 1


@pytest.mark.parametrize("flag", [["--cluster", "east"], ["-M", "east"], ["-Meast"], ["--clusters=east"]])
def test_submit_sends_the_cluster_flag_as_the_cluster_field(fake_api, tmp_path, flag):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.replace("#SBATCH --time=5", "#SBATCH --time=5 -M west"))
    fake_api.add("POST", "/api/v1/jobs/", 201, _job(cluster="east"))

    assert main(["submit", str(script), "--team", "vision", *flag]) == 0

    (request,) = fake_api.requests_to("POST", "/api/v1/jobs/")
    # the flag overrides the script's -M on the server, as sbatch's command line does; the script goes as it is
    assert request["json"]["cluster"] == "east" and "-M west" in request["json"]["script"]


def test_submit_sends_the_image_flag_as_the_image_field_and_none_without_it(fake_api, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    fake_api.add("POST", "/api/v1/jobs/", 201, _job(cluster="gpuportal-k8s"))
    fake_api.add("POST", "/api/v1/jobs/", 201, _job())
    assert main(["submit", str(script), "--team", "vision", "-M", "gpuportal-k8s", "--image", "registry.example.org/ml/pytorch:24.05"]) == 0
    assert main(["submit", str(script), "--team", "vision"]) == 0
    with_image, without = fake_api.requests_to("POST", "/api/v1/jobs/")
    assert with_image["json"]["image"] == "registry.example.org/ml/pytorch:24.05"  # the server checks it against the site's list
    assert "image" not in without["json"]


def test_submit_without_the_flag_sends_no_cluster_and_leaves_the_choice_to_the_script(fake_api, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.replace("#SBATCH --time=5", "#SBATCH --time=5\n#SBATCH -M east"))
    fake_api.add("POST", "/api/v1/jobs/", 201, _job())
    assert main(["submit", str(script), "--team", "vision"]) == 0
    assert "cluster" not in fake_api.requests_to("POST", "/api/v1/jobs/")[0]["json"]


def test_several_scripts_with_the_cluster_flag_each_carry_it(fake_api, tmp_path):
    paths = []
    for name in ("a.sh", "b.sh"):
        (tmp_path / name).write_text(SCRIPT)
        paths.append(str(tmp_path / name))
    fake_api.add("POST", "/api/v1/jobs/", 201, _jobs(2))
    assert main(["submit", *paths, "--team", "vision", "-M", "east"]) == 0
    (request,) = fake_api.requests_to("POST", "/api/v1/jobs/")
    assert [body["cluster"] for body in request["json"]] == ["east", "east"]


def test_submit_uses_the_given_idempotency_key(fake_api, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    fake_api.add("POST", "/api/v1/jobs/", 200, _job())

    assert main(["submit", str(script), "--team", "vision", "--idempotency-key", "run-42"]) == 0

    assert fake_api.requests_to("POST", "/api/v1/jobs/")[0]["headers"]["Idempotency-Key"] == "run-42"


def test_submit_prints_field_errors_and_exits_65(fake_api, tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    fake_api.add(
        "POST",
        "/api/v1/jobs/",
        400,
        {"detail": "Invalid input: gpus, time_limit_minutes.", "errors": {"gpus": ["At most 4 per node."], "time_limit_minutes": ["Partition debug allows at most 60 minutes."]}},
    )

    assert main(["submit", str(script), "--team", "vision"]) == 65

    err = capsys.readouterr().err
    assert "Invalid input: gpus, time_limit_minutes." in err
    assert "gpus: At most 4 per node." in err
    assert "time_limit_minutes: Partition debug allows at most 60 minutes." in err
    assert len(fake_api.requests_to("POST", "/api/v1/jobs/")) == 1  # a 400 is not retried


def test_submit_with_a_bad_time_flag_exits_64_before_any_request(fake_api, tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    assert main(["submit", str(script), "--team", "vision", "--time", "soon"]) == 64
    assert fake_api.requests == []
    assert "soon" in capsys.readouterr().err


def test_submit_refuses_directives_sbatch_refuses_naming_the_line_before_sending(fake_api, tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --time=forever\necho\n")
    assert main(["submit", str(script), "--team", "vision"]) == 64
    assert fake_api.requests == []
    assert "script: line 3: invalid time limit specification --time=forever" in capsys.readouterr().err
    script.write_text("#SBATCH --gpu-count=2\necho\n")
    assert main(["submit", str(script), "--team", "vision"]) == 64
    assert "line 1: unrecognized option '--gpu-count'" in capsys.readouterr().err


def test_submit_is_submitted_from_where_it_runs_and_the_server_resolves_a_relative_chdir(fake_api, tmp_path, monkeypatch):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -D runs/1 --gres=gpu:1\necho\n")
    fake_api.add("POST", "/api/v1/jobs/", 201, _job())
    monkeypatch.chdir(tmp_path)
    assert main(["submit", str(script), "--team", "vision"]) == 0
    (request,) = fake_api.requests_to("POST", "/api/v1/jobs/")
    # the script's -D stays the script's (the server resolves it against submit_dir, as sbatch against its cwd)
    assert request["json"]["submit_dir"] == str(tmp_path) and "workdir" not in request["json"]
    assert request["json"]["name"] == "job.sh"
    assert main(["submit", str(script), "--team", "vision", "-D", "other"]) == 0  # a flag: against the cwd too
    assert fake_api.requests_to("POST", "/api/v1/jobs/")[-1]["json"]["workdir"] == str(tmp_path / "other")


def test_unreachable_portal_exits_69(cli_env, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("GPUPORTAL_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("GPUPORTAL_TOKEN", "gpp_x")
    assert main(["teams"]) == 69
    assert "cannot reach" in capsys.readouterr().err


def test_usage_errors_exit_64_not_2(cli_env, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["submit"])
    assert exc.value.code == 64


def test_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out and "SUBMIT_FAILED" in out and "77" in out


@pytest.mark.parametrize(("final", "code"), [("COMPLETED", 0), ("FAILED", 1), ("CANCELLED", 2), ("TIMEOUT", 2), ("SUBMIT_FAILED", 3)])
def test_submit_wait_prints_state_changes_and_exits_by_final_state(fake_api, tmp_path, capsys, final, code):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    fake_api.add("POST", "/api/v1/jobs/", 201, _job())
    fake_api.add("GET", JOB_PATH, 200, _job("PENDING", slurm_job_id=17, state_reason="Resources"))
    fake_api.add("GET", JOB_PATH, 503, {"detail": "Service unavailable.", "errors": {}})  # retried
    fake_api.add("GET", JOB_PATH, 200, _job("RUNNING", slurm_job_id=17))
    fake_api.add("GET", JOB_PATH, 200, _job(final, slurm_job_id=17, exit_code=0 if final == "COMPLETED" else 1))

    assert main(["submit", str(script), "--team", "vision", "--wait", "--poll-interval", "0.01"]) == code

    lines = capsys.readouterr().out.splitlines()
    states = [line.split()[1] for line in lines[1:]]
    assert states == ["ACCEPTED", "PENDING", "RUNNING", final]
    assert "Resources" in lines[2]


def _jobs(n, state="ACCEPTED"):
    return [{**_job(state), "id": f"3f1c2e9a-1111-4222-8333-9444555566{i:02d}", "name": f"s{i}.sh"} for i in range(n)]


def test_several_scripts_go_in_one_array_post_with_their_own_directives(fake_api, tmp_path, capsys):
    paths = []
    for i, gres in enumerate(["gpu:a100:1", "gpu:h100:2", "gpu:1"]):
        path = tmp_path / f"s{i}.sh"
        path.write_text(f"#!/bin/bash\n#SBATCH --gres={gres}\necho {i}\n")
        paths.append(str(path))
    fake_api.add("POST", "/api/v1/jobs/", 201, _jobs(3))

    assert main(["submit", *paths, "--team", "vision", "--time", "30"]) == 0

    (request,) = fake_api.requests_to("POST", "/api/v1/jobs/")
    body = request["json"]
    assert isinstance(body, list) and [b["name"] for b in body] == ["s0.sh", "s1.sh", "s2.sh"]
    assert [b["script"].splitlines()[1] for b in body] == ["#SBATCH --gres=gpu:a100:1", "#SBATCH --gres=gpu:h100:2", "#SBATCH --gres=gpu:1"]
    assert not any("gpus" in b or "gpu_type" in b for b in body)  # the server reads them from each script
    assert {b["time_limit_minutes"] for b in body} == {30} and {b["team"] for b in body} == {"vision"}
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(f"(s{i}.sh) ACCEPTED" in line for i, line in enumerate(out))


def test_more_scripts_than_one_batch_holds_are_split_with_derived_keys(fake_api, tmp_path, monkeypatch):
    monkeypatch.setattr("gpuportal_cli.submit.BATCH_MAX", 2)
    paths = []
    for i in range(3):
        path = tmp_path / f"s{i}.sh"
        path.write_text(SCRIPT)
        paths.append(str(path))
    fake_api.add("POST", "/api/v1/jobs/", 201, _jobs(2))
    fake_api.add("POST", "/api/v1/jobs/", 201, _jobs(1))

    assert main(["submit", *paths, "--team", "vision", "--idempotency-key", "sweep-7"]) == 0

    posts = fake_api.requests_to("POST", "/api/v1/jobs/")
    assert [len(p["json"]) for p in posts] == [2, 1]
    assert [p["headers"]["Idempotency-Key"] for p in posts] == ["sweep-7", "sweep-7.1"]


def test_several_scripts_wait_for_all_and_exit_with_the_worst_ending(fake_api, tmp_path, capsys):
    jobs = _jobs(2)
    paths = []
    for i in range(2):
        path = tmp_path / f"s{i}.sh"
        path.write_text(SCRIPT)
        paths.append(str(path))
    fake_api.add("POST", "/api/v1/jobs/", 201, jobs)
    fake_api.add("GET", f"/api/v1/jobs/{jobs[0]['id']}/", 200, {**jobs[0], "state": "COMPLETED", "exit_code": 0})
    fake_api.add("GET", f"/api/v1/jobs/{jobs[1]['id']}/", 200, {**jobs[1], "state": "FAILED", "exit_code": 1})

    assert main(["submit", *paths, "--team", "vision", "--wait", "--poll-interval", "0.01"]) == 1

    out = capsys.readouterr().out
    assert f"{jobs[0]['id'][:8]} " in out and "COMPLETED" in out and "FAILED" in out


def test_standard_input_cannot_be_one_of_several_scripts(fake_api, tmp_path, capsys):
    path = tmp_path / "a.sh"
    path.write_text(SCRIPT)
    assert main(["submit", str(path), "-", "--team", "vision"]) == 64
    assert fake_api.requests == [] and "standard input" in capsys.readouterr().err


# ---------------------------------------------------------------- status, logs, cancel, quote, teams


def test_status_lists_jobs_and_says_what_to_do_when_there_are_none(fake_api, capsys):
    fake_api.add("GET", "/api/v1/jobs/", 200, {"count": 0, "next": None, "previous": None, "results": []})
    assert main(["status"]) == 0
    assert "gpuportal submit" in capsys.readouterr().out

    fake_api.routes.clear()
    fake_api.add("GET", "/api/v1/jobs/", 200, {"count": 1, "next": None, "previous": None, "results": [_job("RUNNING", slurm_job_id=99)]})
    assert main(["status", "--team", "vision", "--state", "RUNNING"]) == 0
    out = capsys.readouterr().out
    assert "RUNNING" in out and "99" in out and JOB_ID[:8] in out
    assert fake_api.requests_to("GET", "/api/v1/jobs/")[-1]["query"] == {"team": "vision", "state": "RUNNING"}


def test_status_resolves_an_id_prefix(fake_api, capsys):
    fake_api.add("GET", "/api/v1/jobs/", 200, {"count": 1, "next": None, "previous": None, "results": [_job()]})
    fake_api.add("GET", JOB_PATH, 200, _job("RUNNING", partition="gpu", time_limit_minutes=5))
    assert main(["status", JOB_ID[:6]]) == 0
    assert "RUNNING" in capsys.readouterr().out


def test_status_of_unknown_job_exits_65(fake_api, capsys):
    fake_api.add("GET", JOB_PATH, 404, {"detail": "Not found.", "errors": {}})
    assert main(["status", JOB_ID]) == 65
    assert "Not found." in capsys.readouterr().err


def test_logs_follow_reads_on_from_next_offset_until_the_job_ends(fake_api, capsys):
    out_path = JOB_PATH + "output/"
    fake_api.add("GET", out_path, 200, {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True, "message": "No output yet."})
    fake_api.add("GET", out_path, 200, {"data": "one\n", "offset": 0, "next_offset": 4, "size": 4, "eof": True, "message": ""})
    fake_api.add("GET", out_path, 200, {"data": "two\n", "offset": 4, "next_offset": 8, "size": 8, "eof": True, "message": ""})
    fake_api.add("GET", out_path, 200, {"data": "", "offset": 8, "next_offset": 8, "size": 8, "eof": True, "message": ""})
    fake_api.add("GET", JOB_PATH, 200, _job("RUNNING"))
    fake_api.add("GET", JOB_PATH, 200, _job("COMPLETED"))

    assert main(["logs", JOB_ID, "--follow", "--poll-interval", "0.01"]) == 0

    captured = capsys.readouterr()
    assert captured.out == "one\ntwo\n"
    assert "No output yet." in captured.err and "COMPLETED" in captured.err
    offsets = [r["query"]["offset"] for r in fake_api.requests_to("GET", out_path)]
    assert offsets[:3] == ["0", "0", "4"]
    assert all(r["query"]["stream"] == "stdout" for r in fake_api.requests_to("GET", out_path))


def test_logs_stderr_without_follow_prints_what_is_there(fake_api, capsys):
    fake_api.add("GET", JOB_PATH + "output/", 200, {"data": "oops\n", "offset": 0, "next_offset": 5, "size": 5, "eof": True, "message": ""})
    assert main(["logs", JOB_ID, "--stderr"]) == 0
    assert capsys.readouterr().out == "oops\n"
    assert fake_api.requests_to("GET", JOB_PATH + "output/")[0]["query"]["stream"] == "stderr"


def test_logs_prints_a_note_that_comes_with_data_once_on_stderr(fake_api, capsys):
    note = "The log was longer than the first 4 bytes the portal kept of it"  # a Kubernetes job's kept log, cut
    fake_api.add("GET", JOB_PATH + "output/", 200, {"data": "abcd", "offset": 0, "next_offset": 4, "size": 4, "eof": True,
                                                     "final": True, "message": note})  # fmt: skip
    assert main(["logs", JOB_ID]) == 0
    captured = capsys.readouterr()
    assert captured.out == "abcd" and captured.err.count(note) == 1


def test_cancel_of_an_ended_job_prints_the_conflict(fake_api, capsys):
    fake_api.add("POST", JOB_PATH + "cancel/", 409, {"detail": "The job has already ended (COMPLETED).", "errors": {}})
    assert main(["cancel", JOB_ID]) == 65
    assert "already ended" in capsys.readouterr().err


def test_cancel_requests_cancellation(fake_api, capsys):
    fake_api.add("POST", JOB_PATH + "cancel/", 202, _job("RUNNING"))
    assert main(["cancel", JOB_ID]) == 0
    assert "cancel requested" in capsys.readouterr().out


def test_quote_posts_minutes_and_prints_cost(fake_api, capsys):
    fake_api.add("POST", "/api/v1/jobs/quote/", 200, {"gpu_hours": "4.00", "cost": "40.00", "currency": "CNY"})
    assert main(["quote", "--gpus", "a100:2", "--time", "2h", "--team", "vision"]) == 0
    assert fake_api.requests_to("POST", "/api/v1/jobs/quote/")[0]["json"] == {
        "time_limit_minutes": 120, "gpus": 2, "gpu_type": "a100", "team": "vision",
    }
    assert "4.00 GPU-hours, 40.00 CNY" in capsys.readouterr().out


def test_quote_sends_the_cluster_flag(fake_api, capsys):
    fake_api.add("POST", "/api/v1/jobs/quote/", 200, {"gpu_hours": "2.00", "cost": "20.00", "currency": "CNY"})
    assert main(["quote", "--gpus", "2", "--time", "1h", "-M", "east"]) == 0
    assert fake_api.requests_to("POST", "/api/v1/jobs/quote/")[0]["json"] == {"time_limit_minutes": 60, "gpus": 2, "cluster": "east"}


def test_teams_follows_pagination(fake_api, capsys):
    fake_api.add("GET", "/api/v1/teams/", 200, {"count": 2, "next": fake_api.url + "/api/v1/teams/?page=2", "previous": None, "results": [{"slug": "vision", "name": "Vision", "slurm_account": "vision", "role": "member", "active": True}]})
    fake_api.add("GET", "/api/v1/teams/", 200, {"count": 2, "next": None, "previous": None, "results": [{"slug": "nlp", "name": "NLP", "slurm_account": "nlp", "role": None, "active": True}]})
    assert main(["teams"]) == 0
    out = capsys.readouterr().out
    assert "vision" in out and "nlp" in out
