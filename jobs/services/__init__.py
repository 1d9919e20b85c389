"""Writes for jobs, one module per concern (this package re-exports the names other code uses, so
``from jobs.services import job_submit`` keeps working):

- ``submit``     quote, the budget check call, submit and batch submit (exactly once: idempotency key,
                 request fingerprint)
- ``relay``      relay to Slurm: claim / lease / release, the stored request of a job as the gateway gets it, the single and
                 the batched relay, the drain (group commit of single-job submits)
- ``cancel``     cancel in the portal or passed on to Slurm
- ``sync``       bring live jobs in line with Slurm (plan, then apply in bulk)
- ``notify``     job-end e-mails (each sent once) and their sweeper
- ``sweep``      re-enqueue stuck relays and cancels; release budget holds whose usage never comes
- ``templates``  job templates
- ``gpu_usage``  what the GPUs did: one Prometheus range query a cycle into per-GPU usage rows, one
                 summary a job at its end
- ``gpu_alerts`` idle-GPU alerts (once per job: e-mail to the submitter, the team's webhook) and their sweeper
- ``retention``  what is kept how long after a job's end (RETENTION_* settings), in batches

Rules every function here follows:
- the row is persisted first (state ACCEPTED) and the relay is enqueued with ``on_commit``;
- every state change is a conditional UPDATE on the row (``filter(pk=…, state=…).update(…)``) or a
  bulk update restricted to live rows, so a terminal state is never left;
- Slurm is called outside any transaction, and in batches (one ``queue()`` per sync cycle).

A test or bench that patches a module attribute (``RELAY_LEASE_SECONDS``, ``_hold_budget``,
``after_commit``, ``ACCOUNTING_BY_ID_MAX``…) patches the submodule that uses it, not this package.
"""

from jobs.services.cancel import (
    _may_cancel,
    job_array_task_cancel,
    job_array_task_cancel_relay_run,
    job_cancel,
    job_cancel_relay_run,
)
from jobs.services.gpu_alerts import gpu_idle_alert_deliver, gpu_idle_alerts_check, gpu_idle_alerts_sweep
from jobs.services.gpu_usage import gpu_samples_compact_batch, gpu_usage_finalise, gpu_usage_record, gpu_usage_sync
from jobs.services.retention import retention_apply
from jobs.services.notify import job_end_notify_send, job_end_notify_sweep
from jobs.services.relay import (
    RELAY_BATCH_SUBMIT_SECONDS,
    RELAY_BATCH_THREADS,
    RELAY_DRAIN_LINGER_SECONDS,
    RELAY_HARD_TIME_LIMIT,
    RELAY_LEASE_SECONDS,
    relay_lease_seconds,
    RELAY_SOFT_TIME_LIMIT,
    _claim,
    _lease_free,
    _submission_for,
    job_relay_batch_run,
    job_relay_drain_run,
    job_relay_run,
    relay_drain_key,
)
from jobs.services.submit import (
    IDEMPOTENCY_KEY_RE,
    MAX_BATCH_JOBS,
    SPEC_FIELD_NAMES,
    _hold_budget,
    job_quote,
    job_submit,
    job_submit_batch,
    request_fingerprint,
)
from jobs.services.sweep import budget_holds_sweep, jobs_sweep
from jobs.services.sync import (
    ACCOUNTING_BY_ID_MAX,
    ACCOUNTING_GRACE_SECONDS,
    _apply_plan,
    _plan_job,
    jobs_sync,
)
from jobs.services.templates import job_template_create, job_template_delete, template_defaults
from jobs.spec import DEFAULT_SHEBANG

__all__ = [
    "ACCOUNTING_BY_ID_MAX",
    "ACCOUNTING_GRACE_SECONDS",
    "DEFAULT_SHEBANG",
    "IDEMPOTENCY_KEY_RE",
    "MAX_BATCH_JOBS",
    "RELAY_BATCH_SUBMIT_SECONDS",
    "RELAY_BATCH_THREADS",
    "RELAY_DRAIN_LINGER_SECONDS",
    "RELAY_HARD_TIME_LIMIT",
    "RELAY_LEASE_SECONDS",
    "relay_lease_seconds",
    "RELAY_SOFT_TIME_LIMIT",
    "SPEC_FIELD_NAMES",
    "_apply_plan",
    "_claim",
    "_hold_budget",
    "_lease_free",
    "_may_cancel",
    "_plan_job",
    "_submission_for",
    "budget_holds_sweep",
    "gpu_idle_alert_deliver",
    "gpu_idle_alerts_check",
    "gpu_idle_alerts_sweep",
    "gpu_samples_compact_batch",
    "gpu_usage_finalise",
    "gpu_usage_record",
    "gpu_usage_sync",
    "job_array_task_cancel",
    "job_array_task_cancel_relay_run",
    "job_cancel",
    "job_cancel_relay_run",
    "job_end_notify_send",
    "job_end_notify_sweep",
    "job_quote",
    "job_relay_batch_run",
    "job_relay_drain_run",
    "job_relay_run",
    "job_submit",
    "job_submit_batch",
    "job_template_create",
    "template_defaults",
    "job_template_delete",
    "jobs_sweep",
    "jobs_sync",
    "relay_drain_key",
    "request_fingerprint",
    "retention_apply",
]
