# Issue 38: one request per job, built once at submission and stored with it (Job.request). Rows
# stored before get theirs here, from what they stored then and the way the relay built it then
# (their command-line overrides; the script's parse, or the script read now; the portal's output
# files where the script named none; the team's account; the portal's tag), so that the relay and
# the pages have no second way to read an old row.

from django.conf import settings
from django.db import migrations, models

BATCH = 2000


def _output_files(job, pattern: str) -> tuple[str, str]:
    """The relay's rule of the time: the script's files, else JOB_OUTPUT_PATTERN's."""
    output, error = job.output_pattern, job.error_pattern
    if not output:
        slurm_id = "%A_%a" if job.array else "%j"
        output = pattern.format(workdir=job.workdir, slurm_job_id=slurm_id, stream="out")
        if not error and "{stream}" in pattern:
            error = pattern.format(workdir=job.workdir, slurm_job_id=slurm_id, stream="err")
    return output, error


def request_of(job, account: str) -> tuple[dict, str, str]:
    """(Job.request, output_pattern, error_pattern) for a row stored before issue 38."""
    from gpuportal_sbatch.directives import Directive, DirectiveError, parse_directives

    from portal.slurm.request import job_request
    from portal.slurm.tags import slurm_tag

    if job.script_directives is not None:
        directives = [Directive(*directive) for directive in job.script_directives]
    else:
        try:
            directives = parse_directives(job.script)
        except DirectiveError:  # never accepted; kept as written
            directives = []
    output, error = _output_files(job, settings.JOB_OUTPUT_PATTERN)
    overrides = [(option, value) for option, value in job.overrides or []]
    command_line = [(option, value) for option, value in overrides if option != "account"]
    if not job.output_pattern:
        command_line.append(("output", output))
        if error and not job.error_pattern:
            command_line.append(("error", error))
    command_line.append(("account", next((value for option, value in overrides if option == "account"), account)))
    command_line.append(("comment", slurm_tag(job.id)))
    submit_dir = job.submit_dir or job.workdir
    request = job_request(
        script=job.script, directives=directives, command_line=command_line, workdir=job.workdir, submit_dir=submit_dir,
        # a row without one was submitted from its working directory, the user's default then
        submit_dir_default=not job.submit_dir, environment=job.environment or {}, gpus=job.gpus, gpu_type=job.gpu_type,
        nodes=job.nodes, time_limit_minutes=job.time_limit_minutes, array_tasks=job.array_tasks,
    )  # fmt: skip
    return request.to_json(), output, error


def forwards(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    rows = Job.objects.filter(request={}).select_related("team").order_by("pk")
    last = None
    while True:
        batch = list((rows if last is None else rows.filter(pk__gt=last))[:BATCH])
        if not batch:
            return
        for job in batch:
            job.request, job.output_pattern, job.error_pattern = request_of(job, job.team.slurm_account)
            job.submit_dir = job.submit_dir or job.workdir
        Job.objects.bulk_update(batch, ["request", "output_pattern", "error_pattern", "submit_dir"])
        last = batch[-1].pk


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0012_gpu_retention'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='request',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False),
        migrations.RemoveField(
            model_name='job',
            name='directives',
        ),
        migrations.RemoveField(
            model_name='job',
            name='overrides',
        ),
        migrations.RemoveField(
            model_name='job',
            name='script_directives',
        ),
        migrations.AlterField(
            model_name='job',
            name='error_pattern',
            field=models.CharField(blank=True, help_text='Where stderr goes (absolute); empty: with stdout.', max_length=1024),
        ),
        migrations.AlterField(
            model_name='job',
            name='output_pattern',
            field=models.CharField(help_text="Where stdout goes (absolute): the script's --output, else the portal's.", max_length=1024),
        ),
        migrations.AlterField(
            model_name='job',
            name='submit_dir',
            field=models.CharField(max_length=1024),
        ),
    ]
