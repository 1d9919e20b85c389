"""``Authorization: Token <key>`` against hashed personal API tokens."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions

from portal.models import ApiToken


class ApiTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key: str):
        token = (
            ApiToken.objects.select_related("user")
            .filter(key_hash=ApiToken.hash_key(key), revoked_at__isnull=True)
            .first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        now = timezone.now()
        if token.is_expired(now):
            raise exceptions.AuthenticationFailed(f"This API token expired at {token.expires_at:%Y-%m-%d %H:%M} UTC; create a new one.")
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
