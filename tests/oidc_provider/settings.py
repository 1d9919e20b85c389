"""Settings of the tests' OpenID provider (django-oauth-toolkit). Configured by the environment
serve.py sets: OIDC_PROVIDER_DB (a SQLite file), OIDC_PROVIDER_KEY (the RSA signing key, PEM)."""

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEBUG = False
SECRET_KEY = "oidc-provider-of-the-gpuportal-tests-only-" + "x" * 20
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.oidc_provider.urls"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [HERE / "templates"],
              "APP_DIRS": True, "OPTIONS": {"context_processors": ["django.template.context_processors.request"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("OIDC_PROVIDER_DB", ":memory:")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/accounts/login/"
SESSION_COOKIE_NAME = "provider_session"  # not the portal's, should both ever share a host
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ.get("OIDC_PROVIDER_KEY", ""),
    "PKCE_REQUIRED": True,  # an authorisation request without a code_challenge is refused
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.urls.ClaimsValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "Profile", "email": "E-mail"},
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
}
