"""URLs of the tests' OpenID provider: django-oauth-toolkit under /o/, a login page, and the claims
it tells about its people (PEOPLE, shared with the tests)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path
from oauth2_provider.oauth2_validators import OAuth2Validator

# username → (password, claims beyond preferred_username): the provider's directory
PEOPLE = {
    "olga": ("olga-provider-pw", {"email": "olga@idp.example.org", "uidNumber": 25001, "gidNumber": 25100,
                                  "groups": ["vision-leads", "staff-all"], "given_name": "Olga"}),  # fmt: skip
    "oscar": ("oscar-provider-pw", {"email": "oscar@idp.example.org", "uidNumber": 25002, "gidNumber": 25002,
                                    "groups": []}),  # fmt: skip
    # the same name as the portal's local admin: an OIDC login must not take that account over
    "admin": ("admin-provider-pw", {"email": "admin@idp.example.org", "groups": ["vision-leads"]}),
}


class ClaimsValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim below, whatever the scopes (the portal asks for openid email profile)

    def get_additional_claims(self, request):
        _, claims = PEOPLE[request.user.username]
        return {"preferred_username": request.user.username, **claims}


urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
]
