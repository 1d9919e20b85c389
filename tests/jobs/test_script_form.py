"""The submission form read from a script ("Read script", a pasted script, an uploaded file): the
fields filled from its #SBATCH lines, the directive table and estimate beside them, without
JavaScript and through htmx; fields left as the script says are no overrides (the effective
request is the script's own, checked with jobs.spec), a field the user changed is one."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from jobs.forms import JobForm
from jobs.models import Job, JobTemplate
from jobs.script_fields import fields_from_script, overrides_only
from jobs.spec import parse_script
from jobs.spec import MAX_SCRIPT_BYTES, validate_job_spec
from portal.selectors import cluster_summary

from tests.support import job_overrides

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
CORPUS = Path(__file__).parent / "sbatch_corpus"
DDP = (CORPUS / "01-ddp-gres-cpus-per-task.sbatch").read_text()
FULL = """#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --gres=gpu:a100:2
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=3
#SBATCH --mem=32G
#SBATCH --time=1:30:00
#SBATCH --array=0-3%2
srun python sweep.py
"""


def _read(client, **data):
    post = {"team": "vision", "idempotency_key": "k-read", "read_script": "1", **data}
    return client.post(reverse("jobs:new"), post)


def _shown(form) -> dict:
    return {name: form[name].value() for name in ("name", "partition", "gpu_type", "gpus", "nodes", "ntasks", "cpus_per_task", "cpus_per_gpu", "memory_gb", "time_limit_minutes", "array")}


def _posted(form) -> dict:
    """What the browser posts back from the form as rendered."""
    data = {name: form[name].value() for name in JobForm.base_fields if name != "script_file"}
    return {k: ("" if v is None else v) for k, v in data.items()}


def test_read_script_without_javascript_fills_the_fields_and_shows_the_directives(client_for, inventory):
    response = _read(client_for("member"), script=FULL, name="typed-before", workdir="/scratch/me", environment="A=1")
    assert response.status_code == 200
    form = response.context["form"]
    assert _shown(form) == {
        "name": "sweep", "partition": "gpu", "gpu_type": "a100", "gpus": 4, "nodes": 2, "ntasks": 4,
        "cpus_per_task": 3, "cpus_per_gpu": "", "memory_gb": 32, "time_limit_minutes": "1:30:00", "array": "0-3%2",
    }  # fmt: skip
    # the fields the script does not own are kept as posted
    assert (form["workdir"].value(), form["environment"].value(), form["idempotency_key"].value()) == ("/scratch/me", "A=1", "k-read")
    body = response.content.decode()
    assert "Read from the script: Name, Partition, GPU type, GPUs, Nodes, Tasks, CPUs per task" in body
    assert "<code>--array=0-3%2</code>" in body and "4 array tasks, at most 2 at once" in body
    assert 'name="read_script"' in body and ">Read script</button>" in body
    assert "at most 24.00 GPU-hours" in body  # the estimate follows: 4 GPUs × 1.5 h × 4 tasks
    assert Job.objects.count() == 0


def test_reading_a_script_empties_the_fields_a_previous_script_filled(client_for, inventory):
    response = _read(client_for("member"), script=DDP, name="sweep", nodes="2", array="0-3", time_limit_minutes="1:30:00")
    assert _shown(response.context["form"]) == {
        "name": "", "partition": "", "gpu_type": "a100", "gpus": 2, "nodes": "", "ntasks": "", "cpus_per_task": 4,
        "cpus_per_gpu": "", "memory_gb": "", "time_limit_minutes": "0:05:00", "array": "",
    }  # fmt: skip


def test_a_partition_or_gpu_type_the_inventory_lacks_stays_for_the_script(client_for, inventory):
    script = "#!/bin/bash\n#SBATCH --partition=big\n#SBATCH --gres=gpu:v100:1\n"
    form = _read(client_for("member"), script=script).context["form"]
    assert (form["partition"].value(), form["gpu_type"].value(), form["gpus"].value()) == ("", "", 1)


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["plain", "htmx"])
def test_uploaded_file_goes_into_the_textarea_and_fills_the_fields(client_for, inventory, headers):
    upload = SimpleUploadedFile("01-ddp.sbatch", DDP.replace("\n", "\r\n").encode(), content_type="application/octet-stream")
    response = client_for("member").post(
        reverse("jobs:new"), {"team": "vision", "read_script": "1", "script": "echo old", "script_file": upload}, **headers
    )
    assert response.status_code == 200
    form = response.context["form"]
    assert form["script"].value() == DDP
    assert (form["gpus"].value(), form["gpu_type"].value(), form["cpus_per_task"].value()) == (2, "a100", 4)
    body = response.content.decode()
    assert 'id="job-form-page"' in body and "<code>--gres=gpu:a100:2</code>" in body
    assert 'enctype="multipart/form-data"' in body


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("model.bin", b"#!/bin/bash\n", "Upload a batch script"),
        ("job.sh", b"\xff\xfe\x00binary", "not UTF-8 text"),
        ("job.sh", b"#!/bin/bash\n\x00\x01", "binary"),
        ("job.sh", b"   \n", "empty"),
        ("job.sh", b"#" * (MAX_SCRIPT_BYTES + 1), "larger than 1024 KiB"),
    ],
)
def test_a_bad_upload_is_an_error_beside_the_file_field(client_for, inventory, relays, name, content, message):
    client = client_for("member")
    for action in ({"read_script": "1"}, {}):  # reading it, or submitting the form with it
        data = {"team": "vision", "idempotency_key": "k-up", "script": "#!/bin/bash\necho kept\n", "script_file": SimpleUploadedFile(name, content)}
        response = client.post(reverse("jobs:new"), data | action)
        assert response.status_code == 400
        assert message in response.context["form"].errors["script_file"][0]
        body = response.content.decode()
        group = body[body.index('for="id_script_file"'): body.index('for="id_script"')]
        assert "errorlist" in group and message in group and 'aria-invalid="true"' in group
        assert 'aria-describedby="id_script_file_helptext id_script_file_error"' in group
        assert "echo kept" in body
    assert Job.objects.count() == 0


def test_a_bad_upload_read_by_htmx_is_said_in_the_swapped_form(client_for, inventory):
    data = {"team": "vision", "read_script": "1", "script": "", "script_file": SimpleUploadedFile("job.sh", b"\x00\x01")}
    response = client_for("member").post(reverse("jobs:new"), data, **HTMX)
    assert response.status_code == 200  # htmx swaps no 4xx answer
    assert "binary" in response.context["form"].errors["script_file"][0]
    assert 'id="job-form-page"' in response.content.decode()


def test_submitting_with_a_file_and_no_read_submits_the_file(client_for, inventory, relays):
    data = {"team": "vision", "idempotency_key": "k-file", "script": "", "script_file": SimpleUploadedFile("ddp.sbatch", DDP.encode())}
    response = client_for("member").post(reverse("jobs:new"), data)
    assert response.status_code == 302
    assert Job.objects.get().script == DDP


@pytest.mark.parametrize("script", [DDP, FULL], ids=["ddp", "full"])
def test_a_filled_form_is_the_scripts_own_request(world, client_for, inventory, relays, script):
    read = _read(client_for("member"), script=script)
    form = JobForm(_posted(read.context["form"]), user=world.alice, summary=cluster_summary())
    assert form.is_valid(), form.errors
    kwargs = form.job_kwargs()
    assert all(kwargs[name] in (None, "") for name in ("name", "partition", "gpu_type", "gpus", "nodes", "ntasks", "cpus_per_task", "memory_gb", "time_limit_minutes", "array"))
    alone = {
        "script": script, "name": None, "partition": "", "gpu_type": "", "gpus": None, "nodes": None, "cpus_per_gpu": None,
        "memory_gb": None, "time_limit_minutes": None, "workdir": None, "environment": {},
    }  # fmt: skip
    assert validate_job_spec(**kwargs) == validate_job_spec(**alone)


def test_a_changed_field_is_the_only_override(world, client_for, inventory, relays):
    client = client_for("member")
    client.post(reverse("jobs:new"), {"team": "vision", "idempotency_key": "k-alone", "script": DDP})
    alone = Job.objects.get()
    posted = _posted(_read(client, script=DDP).context["form"]) | {"time_limit_minutes": "0:10:00", "idempotency_key": "k-filled"}
    response = client.post(reverse("jobs:new"), posted)
    assert response.status_code == 302
    job = Job.objects.exclude(pk=alone.pk).get()
    assert sorted(job_overrides(job)) == sorted(job_overrides(alone) + [["time", "10"]])
    assert (job.gpus, job.gpu_type, job.time_limit_minutes) == (2, "a100", 10)


def test_changing_the_nodes_keeps_the_gpu_total_on_the_screen(world, inventory):
    values = fields_from_script(parse_script(FULL)) | {"script": FULL, "nodes": 1}
    kept = overrides_only(values, parse_script(FULL))
    assert (kept["nodes"], kept["gpus"], kept["ntasks"]) == (1, 4, None)
    spec = validate_job_spec(script=FULL, name=None, partition="", gpu_type="", gpus=kept["gpus"], nodes=1, cpus_per_gpu=None,
                             memory_gb=None, time_limit_minutes=None, workdir=None, environment={})  # fmt: skip
    assert spec.gpus == 4


def test_a_template_cannot_keep_an_override_of_tasks_and_says_so(client_for, inventory):
    posted = _posted(_read(client_for("member"), script=FULL).context["form"])
    data = posted | {"ntasks": "8", "template_name": "sweep", "template_scope": "personal"}
    response = client_for("member").post(reverse("jobs:template-create"), data)
    assert response.status_code == 400
    assert "keeps this in its script only" in response.context["form"].errors["ntasks"][0]
    # left as the script says, it saves
    response = client_for("member").post(reverse("jobs:template-create"), posted | {"template_name": "sweep", "template_scope": "personal"})
    assert response.status_code == 302
    template = JobTemplate.objects.get(name="sweep")
    assert (template.gpus, template.nodes, template.time_limit_minutes, template.script) == (4, 2, 90, FULL)
