from django.urls import path

from accounting import apis

urlpatterns = [
    path("reports/cost/", apis.CostReportApi.as_view(), name="api-cost-report"),
    path("teams/<slug:slug>/usage/", apis.TeamUsageApi.as_view(), name="api-team-usage"),
    path("bookings/", apis.BookingCollectionApi.as_view(), name="api-booking-list"),
    path("bookings/availability/", apis.BookingAvailabilityApi.as_view(), name="api-booking-availability"),
    path("bookings/<uuid:booking_id>/", apis.BookingDetailApi.as_view(), name="api-booking-detail"),
    path("bookings/<uuid:booking_id>/cancel/", apis.BookingCancelApi.as_view(), name="api-booking-cancel"),
    path("bookings/<uuid:booking_id>/approve/", apis.BookingApproveApi.as_view(), name="api-booking-approve"),
    path("bookings/<uuid:booking_id>/reject/", apis.BookingRejectApi.as_view(), name="api-booking-reject"),
    path("quotas/", apis.QuotaCollectionApi.as_view(), name="api-quota-list"),
    path("quotas/<int:quota_id>/approve/", apis.QuotaApproveApi.as_view(), name="api-quota-approve"),
    path("quotas/<int:quota_id>/reject/", apis.QuotaRejectApi.as_view(), name="api-quota-reject"),
    path("quotas/<int:quota_id>/withdraw/", apis.QuotaWithdrawApi.as_view(), name="api-quota-withdraw"),
    path("teams/<slug:slug>/budget/", apis.TeamBudgetApi.as_view(), name="api-team-budget"),
]
