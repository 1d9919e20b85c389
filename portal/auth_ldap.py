"""LDAP login (django-auth-ldap; configured by portal.identity_settings.ldap_settings). The backend
authenticates with the library, then hands what the directory said to
``portal.directory.directory_user_sync`` — so a directory user ends up as a plain Django user with a
profile and memberships, and every page and API view applies the same visibility selectors to them
as to anyone else."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django_auth_ldap.backend import LDAPBackend

from portal.directory import directory_number, directory_takeover_allowed, directory_user_sync
from portal.exceptions import ApplicationError
from portal.models import IdentitySource


class LdapBackend(LDAPBackend):
    """django-auth-ldap: bind as the user; username, e-mail, names from the entry (AUTH_LDAP_USER_ATTR_MAP),
    the Unix user and uid/gid from LDAP_ATTR_*, teams from the groups (DIRECTORY_TEAM_MAP)."""

    def get_or_build_user(self, username, ldap_user):
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and not directory_takeover_allowed(user):
            raise PermissionDenied(f"LDAP login as {username}: a local admin account is not taken over")
        return user, built

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        attrs = ldap_user.attrs

        def first(name: str) -> str:
            values = attrs.get(name) or [""]
            return values[0]

        groups = ldap_user.group_names if getattr(settings, "AUTH_LDAP_GROUP_SEARCH", None) else None
        try:
            directory_user_sync(
                user=user, source=IdentitySource.LDAP, unix_username=first(settings.LDAP_ATTR_UNIX_USER) or user.username,
                uid=directory_number(first(settings.LDAP_ATTR_UID)), gid=directory_number(first(settings.LDAP_ATTR_GID)), groups=groups,
            )  # fmt: skip
        except ApplicationError as exc:
            raise PermissionDenied(exc.message) from exc
        return user
