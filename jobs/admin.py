"""Admin for jobs: read-mostly. State changes go through the services (cancel action), never
through editing the row."""

from __future__ import annotations

from django.contrib import admin, messages

from jobs.models import Job, JobEvent, JobTemplate
from jobs.services import job_cancel
from portal.exceptions import ApplicationError


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["state", "reason", "at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "submitter", "state", "slurm_job_id", "gpus", "gpu_type", "partition", "created_at"]
    list_filter = ["state", "partition", "team"]
    search_fields = ["=id", "=slurm_job_id", "name", "submitter__username"]
    list_select_related = ["team", "submitter"]
    date_hierarchy = "created_at"
    inlines = [JobEventInline]
    actions = ["cancel_jobs"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request, queryset):
        done = 0
        for job in queryset:
            try:
                job_cancel(user=request.user, job=job, request=request)
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"{job}: {exc.message}", messages.WARNING)
        self.message_user(request, f"Cancel requested for {done} job(s).")


@admin.register(JobTemplate)
class JobTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "scope", "team", "owner", "partition", "gpus", "gpu_type"]
    list_filter = ["scope"]
    search_fields = ["name"]
    list_select_related = ["team", "owner"]
