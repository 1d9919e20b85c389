"""Settings of the ways in besides the portal's own passwords: LDAP (django-auth-ldap) and OpenID
Connect (mozilla-django-oidc), and the directory-group → team map both use. Pure functions of the
environment (portal.env.Env), called once by portal/project/settings.py — and by the tests, so that what
they check is what a site's environment gives. Each returns {} when its way in is not configured,
and then imports nothing of its library."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from portal.env import Env

ROLES = ("member", "manager")


def team_map(env: Env, name: str = "DIRECTORY_TEAM_MAP") -> dict[str, tuple[str, str]]:
    """``group=team[:role],…`` → {group: (team slug, role)}; role member (default) or manager."""
    result: dict[str, tuple[str, str]] = {}
    for item in env.list(name, []):
        group, sep, target = item.partition("=")
        slug, _, role = target.partition(":")
        group, slug, role = group.strip(), slug.strip(), (role.strip() or "member")
        if not sep or not group or not slug or role not in ROLES or group in result:
            raise ImproperlyConfigured(
                f"Environment variable {name}={env.str(name)!r} is invalid: expected group=team[:member|manager],… "
                f"with each group once ({item!r} is not)."
            )
        result[group] = (slug, role)
    return result


def ldap_settings(env: Env) -> dict:
    """AUTH_LDAP_* for django-auth-ldap and the portal's LDAP_ATTR_*; {} without LDAP_SERVER_URI."""
    uri = env.str("LDAP_SERVER_URI", "")
    if not uri:
        return {}
    if not uri.startswith(("ldap://", "ldaps://")):
        raise ImproperlyConfigured(f"Environment variable LDAP_SERVER_URI={uri!r} is invalid: expected ldap://… or ldaps://….")
    import ldap
    from django_auth_ldap.config import GroupOfNamesType, LDAPSearch, PosixGroupType

    user_base = env.str("LDAP_USER_BASE", required=True)
    group_base = env.str("LDAP_GROUP_BASE", "")
    group_type = env.choice("LDAP_GROUP_TYPE", "posix", ("posix", "groupOfNames"))
    timeout = env.int("LDAP_TIMEOUT", 10, minimum=1)
    result = {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_BIND_DN": env.str("LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": env.secret("LDAP_BIND_PASSWORD"),
        "AUTH_LDAP_START_TLS": env.bool("LDAP_START_TLS", False),
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(user_base, ldap.SCOPE_SUBTREE, env.str("LDAP_USER_FILTER", "(uid=%(user)s)")),
        "AUTH_LDAP_USER_ATTR_MAP": {
            "email": env.str("LDAP_ATTR_EMAIL", "mail"), "first_name": "givenName", "last_name": "sn",
        },  # fmt: skip
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
        "AUTH_LDAP_CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: timeout, ldap.OPT_TIMEOUT: timeout},
        "LDAP_ATTR_UNIX_USER": env.str("LDAP_ATTR_UNIX_USER", "uid"),
        "LDAP_ATTR_UID": env.str("LDAP_ATTR_UID", "uidNumber"),
        "LDAP_ATTR_GID": env.str("LDAP_ATTR_GID", "gidNumber"),
    }
    if group_base:
        object_class = "posixGroup" if group_type == "posix" else "groupOfNames"
        result["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(group_base, ldap.SCOPE_SUBTREE, f"(objectClass={object_class})")
        result["AUTH_LDAP_GROUP_TYPE"] = PosixGroupType() if group_type == "posix" else GroupOfNamesType()
        if require := env.str("LDAP_REQUIRE_GROUP", ""):
            result["AUTH_LDAP_REQUIRE_GROUP"] = require
    elif env.str("LDAP_REQUIRE_GROUP", ""):
        raise ImproperlyConfigured("Environment variable LDAP_REQUIRE_GROUP needs LDAP_GROUP_BASE.")
    return result


def oidc_settings(env: Env) -> dict:
    """OIDC_* for mozilla-django-oidc (authorisation code + PKCE S256) and the portal's claim names;
    {} without OIDC_RP_CLIENT_ID. The provider's endpoints are given, not discovered: start-up does
    not depend on the provider answering."""
    client_id = env.str("OIDC_RP_CLIENT_ID", "")
    if not client_id:
        return {}
    endpoint = {}
    for name in ("AUTHORIZATION", "TOKEN", "USER", "JWKS"):
        endpoint[name] = env.url(f"OIDC_OP_{name}_ENDPOINT", "", schemes=("https", "http"))
    logout = env.str("OIDC_OP_LOGOUT_ENDPOINT", "")
    if logout:
        logout = env.url("OIDC_OP_LOGOUT_ENDPOINT", "", schemes=("https", "http"))
    return {
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": env.secret("OIDC_RP_CLIENT_SECRET"),
        "OIDC_OP_AUTHORIZATION_ENDPOINT": endpoint["AUTHORIZATION"],
        "OIDC_OP_TOKEN_ENDPOINT": endpoint["TOKEN"],
        "OIDC_OP_USER_ENDPOINT": endpoint["USER"],
        "OIDC_OP_JWKS_ENDPOINT": endpoint["JWKS"],
        "OIDC_OP_LOGOUT_ENDPOINT": logout,
        "OIDC_RP_SIGN_ALGO": env.choice("OIDC_RP_SIGN_ALGO", "RS256", ("RS256", "ES256", "HS256")),
        "OIDC_RP_SCOPES": env.str("OIDC_RP_SCOPES", "openid email profile"),
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_STORE_ID_TOKEN": True,  # the id_token_hint of the provider's logout
        "OIDC_TIMEOUT": env.int("OIDC_TIMEOUT", 10, minimum=1),
        "OIDC_VERIFY_SSL": env.bool("OIDC_VERIFY_SSL", True),
        "OIDC_LOGIN_LABEL": env.str("OIDC_LOGIN_LABEL", "Log in with single sign-on"),
        "OIDC_CLAIM_USERNAME": env.str("OIDC_CLAIM_USERNAME", "preferred_username"),
        "OIDC_CLAIM_UNIX_USER": env.str("OIDC_CLAIM_UNIX_USER", ""),  # empty: the username
        "OIDC_CLAIM_UID": env.str("OIDC_CLAIM_UID", "uidNumber"),
        "OIDC_CLAIM_GID": env.str("OIDC_CLAIM_GID", "gidNumber"),
        "OIDC_CLAIM_GROUPS": env.str("OIDC_CLAIM_GROUPS", "groups"),
        "LOGIN_REDIRECT_URL_FAILURE": "/login/?sso=failed",
    }
