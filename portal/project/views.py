"""Pages of the portal app: dashboard, teams, API tokens, login throttling."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounting.selectors import billing_midnight, current_month, idle_savings_by_team
from portal.exceptions import ApplicationError, form_add_application_error
from portal.forms import TeamIdlePolicyForm
from jobs.gpu_report import team_idle_allocations, team_idle_exempt_jobs
from portal.fields import whole_number
from portal.roles import is_admin, is_manager
from portal.selectors import api_tokens_of, cluster_summary, clusters_status, team_idle_policy, teams_visible_to
from portal.services import api_token_create, api_token_revoke, team_idle_policy_set


class LoginView(auth_views.LoginView):
    """Django's login with a per-address throttle (settings THROTTLE_LOGIN, shared with the API's)."""

    template_name = "portal/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["sso_label"] = settings.OIDC_LOGIN_LABEL if settings.OIDC_RP_CLIENT_ID else ""
        context["sso_failed"] = self.request.GET.get("sso") == "failed"
        return context

    def post(self, request, *args, **kwargs):
        return login_throttled(request) or super().post(request, *args, **kwargs)


def login_throttled(request) -> HttpResponse | None:
    """The 429 for a password POST over the THROTTLE_LOGIN rate of the client's address, or None.
    Every page that takes a password calls it (/login/ and /admin/login/: one counter per address)."""
    from portal.throttles import login_attempt_allowed

    if request.method == "POST" and not login_attempt_allowed(request):
        return HttpResponse("Too many login attempts; wait a minute and try again.", status=429)
    return None


def admin_login(request):
    """The admin site's own login page, throttled as /login/ is (it would otherwise let staff
    passwords be tried at any rate)."""
    from django.contrib import admin

    return login_throttled(request) or admin.site.login(request)


class LogoutView(auth_views.LogoutView):
    """Django's logout; after an OIDC login also the provider's (RP-initiated logout), which sends
    the browser back to the login page."""

    def post(self, request, *args, **kwargs):
        id_token = request.session.get("oidc_id_token", "")
        response = super().post(request, *args, **kwargs)
        if id_token and settings.OIDC_RP_CLIENT_ID and settings.OIDC_OP_LOGOUT_ENDPOINT:
            from portal.auth_oidc import provider_logout_url

            return redirect(provider_logout_url(request, id_token))
        return response


def oidc_view(name: str):
    """mozilla-django-oidc's login (``authenticate``) and ``callback`` views; 404 while OIDC is off."""

    def view(request, *args, **kwargs):
        if not settings.OIDC_RP_CLIENT_ID:
            raise Http404("Single sign-on is not configured.")
        from mozilla_django_oidc import views as oidc_views

        cls = {"authenticate": oidc_views.OIDCAuthenticationRequestView, "callback": oidc_views.OIDCAuthenticationCallbackView}[name]
        return cls.as_view()(request, *args, **kwargs)

    return view


@login_required
def dashboard(request):
    summary = cluster_summary()
    teams = list(teams_visible_to(request.user).order_by("name"))
    # what each team's idle-GPU policy saved this month (one query for them all)
    first, following = current_month()
    saved = idle_savings_by_team(start_at=billing_midnight(first), end_at=billing_midnight(following), team_ids=[t.pk for t in teams])
    for team in teams:
        team.idle_saved = saved.get(team.pk)
    return render(request, "portal/dashboard.html", {"summary": summary, "teams": teams})


@login_required
def cluster_status(request):
    """Every cluster: Slurm version, relay backend, health, last sync, GPUs free, partitions (portal.selectors.clusters_status)."""
    return render(request, "portal/cluster_status.html", {"clusters": clusters_status()})


@login_required
def cluster_partial(request):
    return render(request, "partials/cluster_summary.html", {"summary": cluster_summary()})


@login_required
def team_list(request):
    teams = teams_visible_to(request.user).prefetch_related("memberships__user").order_by("name")
    return render(request, "portal/team_list.html", {"teams": teams})


@login_required
def team_detail(request, slug: str):
    """The team: members; its idle-GPU policy (all members read it; its managers and admins set it, see
    the live jobs exempt from it, what it saved this month and the idle allocations now)."""
    team = get_object_or_404(teams_visible_to(request.user), slug=slug)
    memberships = team.memberships.select_related("user", "user__profile").order_by("user__username")
    manager = is_manager(request.user, team)
    oversees = manager or is_admin(request.user)
    policy = team_idle_policy(team)
    form, status = None, 200
    if oversees:
        form = TeamIdlePolicyForm(request.POST if request.method == "POST" else None, initial={
            k: policy[k] for k in ("enabled", "threshold_percent", "warn_minutes", "cancel_minutes")})  # fmt: skip
        if request.method == "POST":
            if form.is_valid():
                try:
                    team_idle_policy_set(team=team, actor=request.user, request=request, **form.cleaned_data)
                except ApplicationError as exc:
                    form_add_application_error(form, exc)
                else:
                    messages.success(request, "Idle-GPU policy saved.")
                    return redirect("team-detail", slug=team.slug)
            status = 400
    elif request.method == "POST":
        raise PermissionDenied("Only the team's managers may set its idle-GPU policy.")
    context = {"team": team, "memberships": memberships, "is_manager": manager, "idle_policy": policy, "idle_policy_form": form,
               # the team's running jobs whose GPUs idle now (GPU monitoring): its managers' and admins' to see
               "idle_allocations": team_idle_allocations(team) if oversees else None,
               "idle_exempt_jobs": team_idle_exempt_jobs(team) if oversees else None,
               "idle_saved": _idle_saved_this_month(team) if oversees else None}  # fmt: skip
    return render(request, "portal/team_detail.html", context, status=status)


def _idle_saved_this_month(team) -> dict | None:
    """What the team's idle-GPU policy saved this billing month so far (accounting.selectors)."""
    first, following = current_month()
    return idle_savings_by_team(start_at=billing_midnight(first), end_at=billing_midnight(following), team_ids=[team.pk]).get(team.pk)


@login_required
def token_list(request):
    new_key = None
    if request.method == "POST":
        try:
            days = request.POST.get("expires_in_days", "").strip()
            if days and whole_number(days) is None:
                raise ApplicationError("The token's lifetime is out of range.", errors={"expires_in_days": ["A whole number of days."]})
            token, new_key = api_token_create(
                user=request.user, name=request.POST.get("name", ""), expires_in_days=whole_number(days) if days else None
            )
        except ApplicationError as exc:
            messages.error(request, exc.message + " " + " ".join(sum(exc.errors.values(), [])))
        else:
            messages.success(request, f"Token “{token.name}” created. Copy it now: it will not be shown again.")
    tokens = api_tokens_of(request.user)
    return render(request, "portal/token_list.html", {"tokens": tokens, "new_key": new_key, "max_days": settings.API_TOKEN_MAX_DAYS})


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = get_object_or_404(api_tokens_of(request.user), pk=pk)
    api_token_revoke(token=token)
    messages.success(request, f"Token “{token.name}” revoked.")
    return redirect("token-list")


@login_required
def profile(request):
    """The user's own settings: Unix user name (read-only here), time zone, job-end emails."""
    from portal.forms import ProfileForm
    from portal.services import profile_ensure, profile_update

    current = profile_ensure(user=request.user)
    if request.method == "POST":
        form = ProfileForm(request.POST)
        if form.is_valid():
            profile_update(user=request.user, **form.cleaned_data)
            messages.success(request, "Profile saved.")
            return redirect("profile")
        status = 400
    else:
        form = ProfileForm(initial={"time_zone": current.time_zone, "notify_job_end": current.notify_job_end})
        status = 200
    return render(request, "portal/profile.html", {"form": form, "profile": current}, status=status)
