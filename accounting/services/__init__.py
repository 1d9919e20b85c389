"""Writes for accounting, one module per concern (this package re-exports their public names, so
``from accounting.services import booking_create`` keeps working):

- ``rates``         rate_create (which rate is in force: accounting.rates.RateBook)
- ``ingestion``     usage ingestion from slurmdbd (usage_ingest, usage_records_upsert)
- ``repricing``     usage slices priced by the rate book, re-pricing after a rate change (owed as a
                    row, swept)
- ``bookings``      booking create / approve / reject / cancel, the capacity rule, the booking budget check
- ``reservations``  the bookings' Slurm reservations (reserve, unreserve, cleanup)
- ``quotas``        quota request / approve / reject / cancel
- ``budget``        budget enforcement in the portal: the jobs' budget holds and running totals
                    (budget_holds_place / _release / _convert / _identify / _tasks_settle) and the refusal wording
- ``slurm_limits``  budget enforcement in Slurm (association limits, drift, roll-over)
- ``reconciliation`` each cluster's usage against its own sreport, over the hours its slurmdbd has
                    rolled up (rolled_up_to, rollup_record, usage_reconcile)
- ``alerts``        budget alerts (80 % / 100 %), e-mail and webhook delivery
- ``gpu_busy``      what share of a job's GPU-time its GPUs computed (from the GPU monitoring)
- ``idle_savings``  what a cancel by a team's idle-GPU policy saved (GPU-seconds until the time limit)
- ``usage_rollup``  the totals of closed months that reports and invoices read (the rule for late records)
- ``invoicing``     issuing a month's invoice: the figures and PDF as sent, late usage billed once on the next
"""

from accounting.services.alerts import (
    QUOTA_ALERT_THRESHOLDS,
    budget_alert_email,
    budget_alert_payload,
    budget_alert_sweep,
    budget_alert_webhook,
    budget_alert_webhook_sweep,
    budget_alerts_check,
    webhook_post,
)
from accounting.services.bookings import (
    BOOKING_LOCK_NAMESPACE,
    BOOKING_PAST_GRACE,
    TypeCapacity,
    bookable_cluster,
    booking_approve,
    booking_cancel,
    booking_create,
    booking_reject,
    bookings_whole_nodes,
    type_capacity,
)
from accounting.services.budget import (
    QUOTA_PAGE,
    HoldRequest,
    budget_holds_convert,
    budget_holds_identify,
    budget_holds_place,
    budget_holds_release,
    budget_holds_tasks_settle,
    budget_totals_check,
)
from accounting.services.gpu_busy import usage_busy_record
from accounting.services.idle_savings import idle_saving_record
from accounting.services.ingestion import (
    IngestResult,
    runaway_fixed,
    usage_ingest,
    usage_records_upsert,
    usage_runaway_close,
    usage_window_start,
)
from accounting.services.quotas import quota_approve, quota_cancel, quota_reject, quota_request
from accounting.services.rates import may_set_prices, rate_create
from accounting.services.repricing import (
    slice_record,
    usage_reprice,
    usage_reprice_owed,
    usage_reprice_pending,
    usage_reprice_sweep,
)
from accounting.services.reservations import (
    RESERVE_LEASE,
    booking_cleanup,
    booking_reserve_run,
    booking_unreserve_run,
)
from accounting.services.reconciliation import (
    ClusterReconciliation,
    kubernetes_usage_reconcile,
    rolled_up_to,
    rollup_record,
    usage_reconcile,
)
from accounting.services.usage_rollup import last_closed_month, usage_month_roll, usage_months_reopen, usage_rollup
from accounting.services.invoicing import invoice_issue, may_issue_invoices
from accounting.services.slurm_limits import (
    ROLLOVER_KIND,
    quota_expected_limits,
    quota_limit_drift,
    quota_limits_apply,
    quota_period_rollover,
)

__all__ = [
    "BOOKING_LOCK_NAMESPACE", "BOOKING_PAST_GRACE", "QUOTA_ALERT_THRESHOLDS", "QUOTA_PAGE", "RESERVE_LEASE",
    "ROLLOVER_KIND", "IngestResult", "TypeCapacity", "bookable_cluster", "booking_approve", "booking_cancel", "booking_cleanup",
    "booking_create", "booking_reject", "usage_busy_record", "webhook_post", "booking_reserve_run", "booking_unreserve_run", "bookings_whole_nodes",
    "budget_alert_email", "budget_alert_payload", "budget_alert_sweep", "budget_alert_webhook", "budget_alert_webhook_sweep",
    "budget_alerts_check",
    "HoldRequest", "budget_holds_convert", "budget_holds_identify", "budget_holds_place", "budget_holds_release", "budget_totals_check",
    "budget_holds_tasks_settle",
    "quota_approve", "quota_cancel", "quota_expected_limits", "quota_limit_drift", "quota_limits_apply",
    "may_set_prices", "quota_period_rollover", "quota_reject", "quota_request", "rate_create", "slice_record", "type_capacity",
    "usage_ingest", "usage_records_upsert", "usage_runaway_close", "runaway_fixed", "usage_reprice", "usage_reprice_owed", "usage_reprice_pending",
    "usage_reprice_sweep", "usage_window_start",
    "ClusterReconciliation", "kubernetes_usage_reconcile", "rolled_up_to", "rollup_record", "usage_reconcile", "idle_saving_record",
    "last_closed_month", "usage_month_roll", "usage_months_reopen", "usage_rollup", "invoice_issue", "may_issue_invoices",
]  # fmt: skip
