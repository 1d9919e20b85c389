"""Django admin for accounting. Rates are added, never edited (a price change is a new row, through
``rate_create`` so that usage is re-priced); usage is read-only (it comes from Slurm)."""

from __future__ import annotations

from django.contrib import admin

from accounting.models import Rate, UsageRecord, UsageSlice
from accounting.services import rate_create


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
        rate = rate_create(
            gpu_type=obj.gpu_type,
            partition=obj.partition,
            price_per_gpu_hour=obj.price_per_gpu_hour,
            currency=obj.currency,
            effective_from=obj.effective_from,
            note=obj.note,
            created_by=request.user,
        )
        obj.pk = rate.pk


class UsageSliceInline(admin.TabularInline):
    model = UsageSlice
    extra = 0
    can_delete = False
    fields = ("period", "slice_start", "slice_end", "gpus", "gpu_seconds", "requested_gpu_seconds", "price_per_gpu_hour", "cost")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("job_id", "cluster", "account", "unix_user", "state", "gpus", "gpu_type", "gpu_hours", "start_time", "provisional")
    list_filter = ("provisional", "gpu_type", "state", "cluster")
    search_fields = ("=job_id", "account", "unix_user", "name")
    date_hierarchy = "start_time"
    list_select_related = False
    inlines = [UsageSliceInline]
    show_full_result_count = False

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
