"""A real OpenID provider for the OIDC tests: django-oauth-toolkit's, in a small Django project of
its own run as a second process (``python -m tests.oidc_provider.serve``). Not the portal."""
