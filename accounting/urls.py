from django.urls import path, re_path

from accounting import views

app_name = "accounting"
urlpatterns = [
    path("rates/", views.rate_list, name="rates"),
    path("reports/", views.report, name="reports"),
    path("usage/", views.team_usage, name="usage"),
    path("bookings/", views.booking_list, name="bookings"),
    path("bookings/<uuid:booking_id>/cancel/", views.booking_cancel_view, name="booking-cancel"),
    path("bookings/<uuid:booking_id>/approve/", views.booking_approve_view, name="booking-approve"),
    path("bookings/<uuid:booking_id>/reject/", views.booking_reject_view, name="booking-reject"),
    path("quotas/", views.quota_list, name="quotas"),
    path("quotas/<int:quota_id>/approve/", views.quota_approve_view, name="quota-approve"),
    path("quotas/<int:quota_id>/reject/", views.quota_reject_view, name="quota-reject"),
    path("quotas/<int:quota_id>/withdraw/", views.quota_withdraw_view, name="quota-withdraw"),
    path("budget/", views.budget, name="budget"),
    re_path(r"^invoices/(?P<slug>[-a-zA-Z0-9_]+)/(?P<month>\d{4}-\d{2})/$", views.invoice_html, name="invoice"),
    re_path(r"^invoices/(?P<slug>[-a-zA-Z0-9_]+)/(?P<month>\d{4}-\d{2})\.pdf$", views.invoice_pdf_view, name="invoice-pdf"),
    re_path(r"^invoices/(?P<slug>[-a-zA-Z0-9_]+)/(?P<month>\d{4}-\d{2})/issue/$", views.invoice_issue_view, name="invoice-issue"),
    re_path(r"^invoices/(?P<slug>[-a-zA-Z0-9_]+)/(?P<month>\d{4}-\d{2})-jobs\.csv$", views.invoice_jobs_csv_view, name="invoice-jobs-csv"),
]
