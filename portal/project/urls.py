from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from portal import apis
from portal.project import health, metrics, views

api_v1 = [
    path("", include("jobs.api_urls")),  # first: job submissions and lists are most of the API's requests
    path("cluster/", apis.ClusterApi.as_view(), name="api-cluster"),
    path("clusters/", apis.ClusterListApi.as_view(), name="api-cluster-list"),
    path("teams/", apis.TeamListApi.as_view(), name="api-team-list"),
    path("teams/<slug:slug>/", apis.TeamDetailApi.as_view(), name="api-team-detail"),
    path("teams/<slug:slug>/idle-policy/", apis.TeamIdlePolicyApi.as_view(), name="api-team-idle-policy"),
    path("", include("accounting.api_urls")),
]

urlpatterns = [
    # first: the API is most of the requests, and a request's path is tried against the patterns in
    # order (no other pattern starts with api/)
    path("api/v1/", include(api_v1)),
    path("", views.dashboard, name="dashboard"),
    path("partials/cluster/", views.cluster_partial, name="cluster-partial"),
    path("clusters/", views.cluster_status, name="cluster-status"),
    path("healthz", health.healthz, name="healthz"),
    path("livez", health.livez, name="livez"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("oidc/authenticate/", views.oidc_view("authenticate"), name="oidc_authentication_init"),
    path("oidc/callback/", views.oidc_view("callback"), name="oidc_authentication_callback"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("account/profile/", views.profile, name="profile"),
    path("account/tokens/", views.token_list, name="token-list"),
    path("account/tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("jobs/", include("jobs.urls")),
    path("accounting/", include("accounting.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # the split view: Swagger UI's start-up script from its own URL, not inline (Content-Security-Policy)
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/login/", views.admin_login),  # before the admin's own: throttled like /login/
    path("admin/", admin.site.urls),
]

# Under /api/ every error answers JSON, DEBUG on or off (portal.middleware.ApiErrorMiddleware);
# pages keep Django's default handlers, which render templates/403.html, 404.html and 500.html (the
# portal's layout with ways back, templates/portal/error.html) when DEBUG is off.

# A request the database or Redis could not serve, wherever it failed (a view or a middleware): 503 with
# Retry-After, not 500 (portal.exceptions.server_error; the rest is Django's own 500 page)
handler500 = "portal.exceptions.server_error"
