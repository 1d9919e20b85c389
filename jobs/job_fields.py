"""A job's fields, declared once (issue 29): what a client may give for a job besides its team and
booking. The submission's and the quote's API input serializers (jobs.apis), the submission and
quote forms and ``initial_from_spec`` (jobs.forms), the service's spec types (``JobShape``,
``JobSpecFields``: jobs.services.submit), the job row (``_job_row``), the fields a script fills
(jobs.script_fields), the fields a template keeps (jobs.views, jobs.services.templates) and which
API field an sbatch option is reported under (``FIELD_OF_OPTION``) and the option a field is sent as
(``OPTION_OF_FIELD``: the one table, both directions) are all derived from ``JOB_FIELDS``.
Adding a field: one ``JobField`` here, the column on ``Job`` (and ``JobTemplate`` when
``template``) with its migration, and its rule in ``jobs.spec.validate_job_spec``.

What stays explicit, and why: the model columns (Django's migrations are generated from the model
classes; a test checks that every stored field has its column); the output serializers (they show
what the portal made of the request, e.g. ``gpus`` per array task, the cluster's name); the job
page's prose (jobs/job_detail.html: one sentence from several fields). What Slurm gets is not a
field list at all: the one request (portal.slurm.types.JobRequest), built by jobs.spec and stored
with the job."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobField:
    """One field of a job as clients give it. ``None``/"" (``empty``): the script decides.

    ``kind``: ``int`` (a whole number ≥ 1), ``str``, ``bool``, ``dict`` (NAME: value), ``script``
    (the batch script), ``time`` (minutes; the form takes Slurm's notations), ``choice`` (a string
    the form offers from the inventory), ``ids`` (portal job ids; the form takes them separated by
    commas or spaces). ``options``: the sbatch options it overrides (its errors
    name the field). ``sizes``: the quote takes it (``JobShape``). ``script_fills``: "Read script"
    fills it from the script's directives. ``form``: on the submission form. ``template``: a job
    template keeps it (``JobTemplate`` has the column). ``stored``: ``Job`` has a column of this
    name that the checked spec fills."""

    name: str
    kind: str
    options: tuple[str, ...] = ()
    sizes: bool = False
    script_fills: bool = False
    form: bool = True
    template: bool = False
    stored: bool = True
    empty: object = None  # what "not given" is for the service
    label: str = ""  # the form's label ("": Django's, from the name)
    help: str = ""  # the form's help text
    api_help: str = ""  # the API's (OpenAPI) description
    max_length: int | None = None  # the form's and the API's (``ids``: how many)

    @property
    def python_type(self) -> type:
        return {"int": int, "time": int, "bool": bool, "dict": dict}.get(self.kind, str)


JOB_FIELDS: tuple[JobField, ...] = (
    JobField("script", "script", sizes=True, form=False, template=True, empty="",
             api_help="A batch script; its #SBATCH lines are read as sbatch reads them. Every field below overrides the "
             "script's directive for it (as sbatch's command line does); leave a field out to let the script decide."),
    JobField("name", "str", ("job-name",), script_fills=True, max_length=128,
             help="Letters, digits, '.', '_' or '-'. Empty: the script's --job-name."),
    JobField("partition", "choice", ("partition",), sizes=True, script_fills=True, template=True, empty=""),
    JobField("cluster", "choice", sizes=True, stored=False, empty="", max_length=64,
             help="Needed only when the partition's name is on several clusters.",
             api_help="The cluster to run on; needed only when the partition's name is on several clusters (a 400 naming "
             "`cluster` says so). Overrides the script's `#SBATCH -M`/`--clusters`, as sbatch's command line does. Empty: "
             "the script's -M, else the partition's cluster (no partition: the default cluster)."),
    JobField("gpu_type", "choice", sizes=True, script_fills=True, template=True, empty="", label="GPU type"),
    JobField("gpus", "int", ("gres", "gpus"), sizes=True, script_fills=True, template=True, label="GPUs",
             help="For the whole job. Empty: the script's GPU directive.", api_help="GPUs of the job in total."),
    JobField("nodes", "int", ("nodes",), sizes=True, script_fills=True, template=True,
             help="Empty: the script's --nodes (else 1)."),
    JobField("ntasks", "int", ("ntasks",), sizes=True, script_fills=True, label="Tasks",
             help="Empty: the script's --ntasks (else one per node)."),
    JobField("cpus_per_task", "int", ("cpus-per-task",), sizes=True, script_fills=True, label="CPUs per task",
             help="Empty: the script's --cpus-per-task."),
    JobField("cpus_per_gpu", "int", ("cpus-per-gpu",), sizes=True, script_fills=True, template=True, label="CPUs per GPU",
             help="Empty: the script's --cpus-per-gpu."),
    JobField("memory_gb", "int", ("mem",), sizes=True, script_fills=True, template=True, label="Memory per node (GB)",
             help="Empty: the partition's default."),
    JobField("time_limit_minutes", "time", ("time",), sizes=True, script_fills=True, template=True, label="Time limit",
             help="Minutes, or 1:30:00, 2-00:00:00, 2h, 90m. Empty: the partition's default."),
    JobField("exclusive", "bool", ("exclusive",), sizes=True, form=False),
    JobField("array", "str", ("array",), sizes=True, script_fills=True, label="Array", max_length=1024,
             help="Task indexes, e.g. 0-9 or 1-100%10. Empty: the script's --array (else no array).",
             api_help="sbatch --array, e.g. 0-15%4."),
    JobField("workdir", "str", ("chdir",), template=True, label="Working directory", max_length=1024,
             help="Absolute path; empty: the site default.", api_help="Overrides the script's --chdir."),
    JobField("submit_dir", "str", form=False,
             api_help="Where the job is submitted from, as sbatch's own directory (SLURM_SUBMIT_DIR; the job starts there "
             "without --chdir; relative paths are resolved against it); empty: your default directory."),
    JobField("environment", "dict", template=True, help="One NAME=value per line."),
    JobField("depends_on", "ids", ("dependency",), stored=False, empty=(), label="After jobs", max_length=100,
             help="Job ids (from this portal), separated by commas or spaces: the job starts once each has completed "
             "successfully. Empty: the script's --dependency.",
             api_help="Portal job ids this job waits for: it is sent to Slurm with --dependency=afterok on their Slurm "
             "ids once each has one, and fails if one of them cannot succeed. Overrides the script's --dependency."),
    JobField("image", "str", stored=False, empty="", max_length=512, label="Image",
             help="Kubernetes clusters only: a container image from the site's list. Empty: the site's default.",
             api_help="The container image a job on a Kubernetes cluster runs in: the site's default "
             "(GPUPORTAL_K8S_IMAGE) or one of the images the site allows (GPUPORTAL_K8S_IMAGES); any other is a 400 "
             "naming `image`, and so is an image for a Slurm cluster. Empty: the site's default."),
    JobField("qos", "str", ("qos",), form=False),
    JobField("constraint", "str", ("constraint",), form=False),
)  # fmt: skip

FIELDS = {f.name: f for f in JOB_FIELDS}
SPEC_FIELD_NAMES = tuple(FIELDS)
SHAPE_FIELD_NAMES = tuple(f.name for f in JOB_FIELDS if f.sizes)  # the quote's inputs
SCRIPT_FIELDS = tuple(f.name for f in JOB_FIELDS if f.script_fills)  # the form fields a script fills
TEMPLATE_FIELDS = tuple(f.name for f in JOB_FIELDS if f.template)  # what a job template keeps
FORM_FIELDS = tuple(f.name for f in JOB_FIELDS if f.form)  # the submission form's job fields
STORED_FIELDS = tuple(f.name for f in JOB_FIELDS if f.stored)  # Job columns filled from the checked spec
# an sbatch option -> the field that overrides it (errors are named after the field the caller used)
FIELD_OF_OPTION = {option: f.name for f in JOB_FIELDS for option in f.options}
# a field -> the sbatch option it is given to Slurm as (its first; ``gpus`` is the GPU directive jobs.spec builds)
OPTION_OF_FIELD = {f.name: f.options[0] for f in JOB_FIELDS if f.options}


def given_fields(names: tuple[str, ...], values: dict, *, what: str) -> dict:
    """``values`` completed with the empty value of every field of ``names`` not given, in their
    order; a name not among them is a TypeError (as an unknown keyword argument is)."""
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"{what} got unexpected field(s): {', '.join(sorted(unknown))}")
    return {name: values.get(name, FIELDS[name].empty) for name in names}


def given_or_empty(names, data) -> dict:
    """The fields ``names`` of ``data`` (cleaned form data), an empty one ("" / None / missing) as
    the field's empty value (what the service takes for "the script decides")."""
    return {name: FIELDS[name].empty if data.get(name) in (None, "") else data[name] for name in names}
