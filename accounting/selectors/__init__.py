"""Reads for accounting, one module per concern (this package re-exports their public names, so
``from accounting.selectors import cost_report`` keeps working):

- ``usage``     the cost report, usage chart, reconciliation figures, invoice lines, who reads usage
- ``budgets``   quotas visible and in force, budget rows, burn-down, /metrics ratios
- ``usage_totals`` the closed months' totals (accounting.services.usage_rollup) that reports and invoices read
- ``rollup``    how current each cluster's accounting roll-up is (sreport's reach)
- ``idle_savings`` what the teams' idle-GPU policies saved
- ``bookings``  bookings' held capacity, visibility, availability, the job-in-booking check, charges

The billing calendar is accounting.calendar and the rate book accounting.rates; their names are
re-exported here too for the callers that import them from the selectors.
"""

from accounting.calendar import (
    billing_date,
    billing_midnight,
    billing_zone,
    current_month,
    month_start,
    next_month,
    range_bounds,
)
from accounting.rates import gpu_hour_price, rates_current
from accounting.selectors.bookings import (
    booked_gpu_hours,
    booking_availability,
    booking_charges,
    booking_check_for_job,
    booking_load_steps,
    bookings_holding_capacity,
    bookings_usable_by,
    bookings_visible_to,
)
from accounting.selectors.budgets import (
    budget_burndown,
    budget_rows,
    quota_period_bounds,
    quotas_effective,
    quotas_visible_to,
    team_budget,
    team_budget_ratios,
)
from accounting.selectors.idle_savings import idle_savings_by_team
from accounting.selectors.rollup import ROLLUP_KIND, RollupStatus, rollup_message, rollup_status
from accounting.selectors.usage import (
    GROUP_BY_CHOICES,
    account_gpu_seconds,
    can_read_invoice,
    can_see_user_breakdown,
    cost_report,
    invoice_groups,
    invoice_job_rows,
    invoice_lines,
    jobs_usage,
    usage_by_team_and_month,
    usage_final_job_ids,
    usage_records_of_team,
    usage_teams_visible_to,
)

__all__ = [
    "GROUP_BY_CHOICES", "ROLLUP_KIND", "RollupStatus", "account_gpu_seconds", "billing_date", "billing_midnight", "billing_zone", "booked_gpu_hours",
    "booking_availability", "booking_charges", "booking_check_for_job", "booking_load_steps",
    "bookings_holding_capacity", "bookings_usable_by", "bookings_visible_to", "budget_burndown", "budget_rows",
    "can_read_invoice", "can_see_user_breakdown", "cost_report", "current_month", "gpu_hour_price", "invoice_groups", "invoice_job_rows", "invoice_lines", "jobs_usage",
    "month_start", "next_month", "quota_period_bounds", "quotas_effective", "quotas_visible_to",
    "range_bounds", "rates_current", "rollup_message", "rollup_status", "team_budget", "team_budget_ratios", "usage_by_team_and_month",
    "usage_final_job_ids", "usage_records_of_team", "usage_teams_visible_to", "idle_savings_by_team",
]  # fmt: skip
