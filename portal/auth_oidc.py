"""OpenID Connect login (mozilla-django-oidc; authorisation code with PKCE, configured by
portal.identity_settings.oidc_settings). Users are found and created by the username claim
(OIDC_CLAIM_USERNAME), not by e-mail; the Unix user, uid/gid and groups claims go to
``portal.directory.directory_user_sync`` as LDAP's attributes do. The provider's logout
(RP-initiated, with the id_token_hint) follows the portal's logout: ``provider_logout_url``."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from portal.directory import directory_number, directory_takeover_allowed, directory_user_sync
from portal.exceptions import ApplicationError
from portal.models import IdentitySource


class OidcBackend(OIDCAuthenticationBackend):
    def _username(self, claims) -> str:
        value = claims.get(settings.OIDC_CLAIM_USERNAME)
        return value if isinstance(value, str) else ""

    def verify_claims(self, claims) -> bool:
        username = self._username(claims)
        try:
            UnicodeUsernameValidator()(username)
        except ValidationError:
            return False
        return 0 < len(username) <= 150

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(username=self._username(claims))

    def create_user(self, claims):
        user = self.UserModel.objects.create_user(self._username(claims), email=claims.get("email") or "")
        return self._sync(user, claims)

    def update_user(self, user, claims):
        if not directory_takeover_allowed(user):
            raise SuspiciousOperation(f"OIDC login as {user.username}: a local admin account is not taken over")
        email = claims.get("email") or ""
        if email and user.email != email:
            self.UserModel.objects.filter(pk=user.pk).update(email=email)
            user.email = email
        return self._sync(user, claims)

    def _sync(self, user, claims):
        groups = claims.get(settings.OIDC_CLAIM_GROUPS)
        if groups is not None and not (isinstance(groups, list) and all(isinstance(g, str) for g in groups)):
            groups = None  # not a list of names: no group information
        unix_user = claims.get(settings.OIDC_CLAIM_UNIX_USER) if settings.OIDC_CLAIM_UNIX_USER else None
        try:
            directory_user_sync(
                user=user, source=IdentitySource.OIDC, unix_username=unix_user or user.username,
                uid=directory_number(claims.get(settings.OIDC_CLAIM_UID)),
                gid=directory_number(claims.get(settings.OIDC_CLAIM_GID)), groups=groups,
            )  # fmt: skip
        except ApplicationError as exc:
            raise SuspiciousOperation(exc.message) from exc
        return user


def provider_logout_url(request, id_token: str) -> str:
    """The provider's end-session URL that brings the browser back to the portal's login page."""
    query = {
        "id_token_hint": id_token,
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
    }
    return f"{settings.OIDC_OP_LOGOUT_ENDPOINT}?{urlencode(query)}"
