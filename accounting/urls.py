from django.urls import path, re_path

from accounting import views

app_name = "accounting"
urlpatterns = [
    path("rates/", views.rate_list, name="rates"),
    path("reports/", views.report, name="reports"),
    path("usage/", views.team_usage, name="usage"),
    re_path(r"^invoices/(?P<slug>[-a-zA-Z0-9_]+)/(?P<month>\d{4}-\d{2})/$", views.invoice_html, name="invoice"),
    re_path(r"^invoices/(?P<slug>[-a-zA-Z0-9_]+)/(?P<month>\d{4}-\d{2})\.pdf$", views.invoice_pdf_view, name="invoice-pdf"),
]
