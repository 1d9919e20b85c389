"""Django admin for accounting. Rates are added, never edited (a price change is a new row, through
``rate_create`` so that usage is re-priced); usage is read-only (it comes from Slurm). Bookings and
quotas are read-only rows whose state machines move only through the services (admin actions call
booking_approve / booking_reject / booking_cancel and quota_approve / quota_reject); budget alerts
are a read-only record of what was sent."""

from __future__ import annotations

from django.contrib import admin, messages

from accounting.models import Booking, BudgetAlert, IssuedInvoice, Quota, Rate, UsageRecord, UsageSlice
from accounting.services import (
    booking_approve,
    booking_cancel,
    booking_reject,
    quota_approve,
    quota_reject,
    rate_create,
)
from portal.db import copied_fields
from portal.exceptions import ApplicationError


@admin.register(Rate)
class RateAdmin(admin.ModelAdmin):
    list_display = ("gpu_type", "partition", "price_per_gpu_hour", "currency", "effective_from", "created_by", "created_at")
    list_filter = ("gpu_type", "partition")
    ordering = ("gpu_type", "partition", "-effective_from")
    fields = ("gpu_type", "partition", "price_per_gpu_hour", "currency", "effective_from", "note")

    def has_change_permission(self, request, obj=None):
        return False  # history is kept: add a new rate instead

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        rate = rate_create(**copied_fields(obj, self.fields), created_by=request.user)  # the form's fields, as entered
        obj.pk = rate.pk


class UsageSliceInline(admin.TabularInline):
    model = UsageSlice
    extra = 0
    can_delete = False
    fields = ("period", "slice_start", "slice_end", "gpus", "gpu_seconds", "requested_gpu_seconds", "price_per_gpu_hour", "cost")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Every field read-only, no add, no delete: rows change through the services only."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _run(self, request, queryset, service, verb: str, **kwargs) -> None:
        done = 0
        for obj in queryset:
            try:
                service(request=request, **{self.service_arg: obj}, **kwargs)
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"{obj}: {exc.message}", messages.WARNING)
        self.message_user(request, f"{verb} {done} of {queryset.count()}.")


@admin.register(IssuedInvoice)
class IssuedInvoiceAdmin(_ReadOnlyAdmin):
    """Issued invoices as sent: read here, issued from the invoice page (accounting.services.invoicing)."""

    list_display = ("number", "team", "period", "total", "currency", "adjustments_cost", "issued_at", "issued_by")
    list_filter = ("period",)
    search_fields = ("number", "team__slug")
    exclude = ("pdf",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name != "pdf"]


@admin.register(UsageRecord)
class UsageRecordAdmin(_ReadOnlyAdmin):
    list_display = ("job_id", "cluster", "account", "unix_user", "state", "gpus", "gpu_type", "gpu_hours", "start_time", "provisional")
    list_filter = ("provisional", "gpu_type", "state", "cluster")
    search_fields = ("=job_id", "account", "unix_user", "name")
    date_hierarchy = "start_time"
    list_select_related = False
    inlines = [UsageSliceInline]
    show_full_result_count = False


@admin.register(Booking)
class BookingAdmin(_ReadOnlyAdmin):
    service_arg = "booking"
    list_display = ("reservation_name", "team", "gpus", "gpu_type", "start", "end", "status", "reservation_state", "created_by")
    list_filter = ("status", "reservation_state", "gpu_type", "team")
    search_fields = ("=reservation_name", "team__slug", "note")
    list_select_related = ("team", "created_by")
    date_hierarchy = "start"
    actions = ("approve_bookings", "reject_bookings", "cancel_bookings")

    @admin.action(description="Approve selected bookings (capacity and budget are checked)")
    def approve_bookings(self, request, queryset):
        self._run(request, queryset, booking_approve, "Approved", actor=request.user)

    @admin.action(description="Reject selected bookings")
    def reject_bookings(self, request, queryset):
        self._run(request, queryset, booking_reject, "Rejected", actor=request.user, note="rejected in the admin")

    @admin.action(description="Cancel selected bookings (their Slurm reservations are deleted)")
    def cancel_bookings(self, request, queryset):
        self._run(request, queryset, booking_cancel, "Cancelled", actor=request.user)


@admin.register(Quota)
class QuotaAdmin(_ReadOnlyAdmin):
    service_arg = "quota"
    list_display = ("team", "gpu_type", "gpu_hours", "max_gpus", "period_start", "period_end", "state", "requested_by", "approved_at")
    list_filter = ("state", "gpu_type", "team")
    search_fields = ("team__slug", "justification")
    list_select_related = ("team", "requested_by")
    date_hierarchy = "period_start"
    actions = ("approve_quotas", "reject_quotas")

    @admin.action(description="Approve selected quotas (mirrored to Slurm)")
    def approve_quotas(self, request, queryset):
        self._run(request, queryset, quota_approve, "Approved", user=request.user, comment="approved in the admin")

    @admin.action(description="Reject selected quotas")
    def reject_quotas(self, request, queryset):
        self._run(request, queryset, quota_reject, "Rejected", user=request.user, comment="rejected in the admin")


@admin.register(BudgetAlert)
class BudgetAlertAdmin(_ReadOnlyAdmin):
    list_display = ("quota", "threshold", "consumed_gpu_hours", "budget_gpu_hours", "created_at", "emailed_at", "webhook_delivered_at")
    list_filter = ("threshold",)
    list_select_related = ("quota__team",)
    date_hierarchy = "created_at"
