"""Job API routes, included under /api/v1/ by portal/project/urls.py."""

from django.urls import path

from jobs import apis

urlpatterns = [
    path("jobs/", apis.JobCollectionApi.as_view(), name="api-job-list"),
    path("jobs/quote/", apis.JobQuoteApi.as_view(), name="api-job-quote"),
    path("jobs/<uuid:job_id>/", apis.JobDetailApi.as_view(), name="api-job-detail"),
    path("jobs/<uuid:job_id>/cancel/", apis.JobCancelApi.as_view(), name="api-job-cancel"),
    path("jobs/<uuid:job_id>/output/", apis.JobOutputApi.as_view(), name="api-job-output"),
    path("job-templates/", apis.JobTemplateCollectionApi.as_view(), name="api-job-template-list"),
    path("job-templates/<int:template_id>/", apis.JobTemplateDetailApi.as_view(), name="api-job-template-detail"),
]
