from django.urls import path

from accounting import apis

urlpatterns = [
    path("reports/cost/", apis.CostReportApi.as_view(), name="api-cost-report"),
    path("teams/<slug:slug>/usage/", apis.TeamUsageApi.as_view(), name="api-team-usage"),
]
