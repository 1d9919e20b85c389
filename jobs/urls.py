"""Pages of the jobs app, under /jobs/."""

from django.urls import path

from jobs import views

app_name = "jobs"
urlpatterns = [
    path("", views.job_list, name="list"),
    path("live/", views.job_live_states, name="live-states"),
    path("new/", views.job_new, name="new"),
    path("new/quote/", views.job_quote_partial, name="quote"),
    path("templates/", views.template_list, name="templates"),
    path("templates/new/", views.template_create_from_form, name="template-create"),
    path("templates/<int:pk>/delete/", views.template_delete, name="template-delete"),
    path("<uuid:job_id>/", views.job_detail, name="detail"),
    path("<uuid:job_id>/output/", views.job_output_partial, name="output"),
    path("<uuid:job_id>/gpu/", views.job_gpu_usage_partial, name="gpu-usage"),
    path("<uuid:job_id>/cancel/", views.job_cancel_view, name="cancel"),
    path("<uuid:job_id>/save-template/", views.template_create_from_job, name="save-template"),
]
