"""Issue 29: a job's fields are declared once (jobs.job_fields.JOB_FIELDS); the API's input
serializers, the forms, the quote's inputs, the service's spec, the job row, the fields a script
fills and a template keeps are derived from it, so a field cannot be added to one and forgotten in
another (adding one touches JOB_FIELDS, the model and its migration, and validate_job_spec's rule)."""

from __future__ import annotations

import inspect

import pytest

from jobs.apis import JobCollectionApi, JobQuoteApi, JobTemplateCollectionApi
from jobs.forms import JobForm, QuoteForm, initial_from_spec
from jobs.job_fields import (
    FIELD_OF_OPTION,
    FORM_FIELDS,
    JOB_FIELDS,
    SCRIPT_FIELDS,
    SHAPE_FIELD_NAMES,
    SPEC_FIELD_NAMES,
    STORED_FIELDS,
    TEMPLATE_FIELDS,
    given_fields,
)
from jobs.models import Job, JobTemplate
from jobs.services import job_quote, job_template_create
from jobs.spec import validate_job_spec

# what the views and services add around a job's fields (not fields of the job itself)
SUBMIT_EXTRAS = {"team", "booking", "idle_exempt"}  # not job fields: what the portal does with the job
FORM_EXTRAS = {"team", "booking", "script_file", "script", "idempotency_key", "idle_exempt"}
SPEC_ARGUMENTS = {"default_submit_dir", "account", "accounts", "check_script", "cache", "parsed", "tag"}


def test_the_api_inputs_are_the_declared_fields():
    submit = JobCollectionApi.JobSubmitInputSerializer().fields
    assert list(submit) == ["team", *SPEC_FIELD_NAMES, "booking", "idle_exempt"]
    assert set(submit) - SUBMIT_EXTRAS == {f.name for f in JOB_FIELDS}
    assert list(JobQuoteApi.JobQuoteInputSerializer().fields) == list(SHAPE_FIELD_NAMES)
    template = JobTemplateCollectionApi.JobTemplateInputSerializer().fields
    assert list(template) == ["scope", "team", "name", "description", *TEMPLATE_FIELDS]
    # a template's defaults are its columns': one GPU on one node, not "the script decides"
    assert (template["gpus"].default, template["nodes"].default, template["memory_gb"].default) == (1, 1, None)


def test_the_forms_fields_are_the_declared_ones():
    assert set(JobForm.base_fields) - FORM_EXTRAS == set(FORM_FIELDS)
    # the estimate: every sizing field the page shows, and the script
    assert set(QuoteForm.base_fields) == {f.name for f in JOB_FIELDS if f.sizes and (f.form or f.name == "script")}
    assert set(SCRIPT_FIELDS) <= set(FORM_FIELDS)


def test_the_spec_takes_every_declared_field_and_only_those():
    parameters = set(inspect.signature(validate_job_spec).parameters)
    assert parameters - SPEC_ARGUMENTS == set(SPEC_FIELD_NAMES)
    assert set(FIELD_OF_OPTION.values()) <= set(SPEC_FIELD_NAMES)


def test_stored_fields_have_their_columns():
    job_columns = {f.name for f in Job._meta.get_fields()}
    template_columns = {f.name for f in JobTemplate._meta.get_fields()}
    assert set(STORED_FIELDS) <= job_columns
    assert set(TEMPLATE_FIELDS) <= template_columns
    # every column a template keeps of a job's spec is a declared template field (name: its own)
    spec_columns = template_columns - {"id", "scope", "owner", "team", "created_by", "name", "description", "created_at"}
    assert spec_columns == set(TEMPLATE_FIELDS)


@pytest.mark.django_db
def test_initial_from_spec_fills_the_template_fields(world):
    template = JobTemplate.objects.create(scope="personal", owner=world.alice, created_by=world.alice, name="t 1",
                                          script="#!/bin/bash\ntrue\n", partition="gpu", time_limit_minutes=90)  # fmt: skip
    initial = initial_from_spec(template, team_slug="vision")
    assert set(initial) == {*TEMPLATE_FIELDS, "name", "team"}
    assert (initial["name"], initial["time_limit_minutes"], initial["partition"]) == ("t-1", "1:30:00", "gpu")


@pytest.mark.django_db
def test_the_page_shows_every_form_field(world):
    from portal.selectors import cluster_summary

    form = JobForm(user=world.alice, summary=cluster_summary())
    assert [field.name for field in form.job_field_rows()] == list(FORM_FIELDS)  # no booking to choose


def test_an_undeclared_field_is_a_type_error():
    with pytest.raises(TypeError, match="job_quote got unexpected field.*: colour"):
        job_quote(colour="red")
    with pytest.raises(TypeError, match="qos"):
        given_fields(SHAPE_FIELD_NAMES, {"qos": "high"}, what="job_quote")  # not a field that sizes a job
    with pytest.raises(TypeError, match="job_template_create got unexpected field.*: ntasks"):
        job_template_create(user=None, scope="personal", name="t", script="true", ntasks=2)  # kept in the script only


def test_reading_a_script_fills_every_field_a_script_fills():
    from jobs.script_fields import fields_from_script
    from jobs.spec import parse_script

    head = "#!/bin/bash\n#SBATCH -J n1 -p gpu --gres=gpu:a100:2 -N 1 -n 2 --mem=8G -t 30 --array=0-3 "
    read = {**fields_from_script(parse_script(head + "-c 4\ntrue\n")),  # --cpus-per-task and --cpus-per-gpu: one or the other
            **fields_from_script(parse_script(head + "--cpus-per-gpu=2\ntrue\n"))}  # fmt: skip
    assert set(read) == set(SCRIPT_FIELDS)
