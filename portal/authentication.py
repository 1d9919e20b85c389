"""``Authorization: Token <key>`` against hashed personal API tokens.

The lookup (key hash → token and user) is kept in the cache for API_TOKEN_CACHE_SECONDS, and in the
process as long (a memo under the APITOKENS snapshot version, portal.snapshots, which every request
reads anyway), so a client sending requests back to back costs no query, no write and no cache round
trip per request: ``last_used_at`` is written
when the lookup is made (at most once a minute, so at most once per API_TOKEN_CACHE_SECONDS while the
entry lives). What still takes effect:
- revocation through the portal (``portal.services.api_token_revoke``): at once (the entry is
  dropped in the revoking transaction and after its commit: ``api_token_forget``);
- expiry: at once (the entry keeps ``expires_at`` and every request checks it);
- a user made inactive, a changed cluster username (the lookup carries the user's profile: a
  submission's default directory needs it), or a token deleted or revoked outside the services
  (admin, SQL): within API_TOKEN_CACHE_SECONDS (30 s by default; 0 looks the token up on every request).
When the cache does not answer, the token is looked up in the database."""

from __future__ import annotations

import copy
import logging
import time

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from rest_framework import authentication, exceptions

from portal.models import ApiToken
from portal.snapshots import APITOKENS, memo_put, snapshot_changed, snapshot_memo

logger = logging.getLogger(__name__)


TOKEN_MEMO_MAX = 10000  # lookups a process keeps at most (per version of APITOKENS)


def _cache_key(key_hash: str) -> str:
    return f"apitoken:{key_hash}"


def api_token_forget(key_hash: str) -> None:
    """Drop the cached lookup of a token (now and after the current transaction commits)."""

    def forget():
        try:
            cache.delete(_cache_key(key_hash))
        except Exception:  # noqa: BLE001 — the entry expires within API_TOKEN_CACHE_SECONDS
            logger.warning("could not drop the cached API token lookup", exc_info=True)

    forget()
    transaction.on_commit(forget)
    snapshot_changed(APITOKENS)  # every process drops its memo of lookups


def _lookup(key_hash: str) -> ApiToken | None:
    # the user's profile too (its cluster username: a submission's default directory), kept with the
    # token as the user is: as of at most API_TOKEN_CACHE_SECONDS ago
    token = ApiToken.objects.select_related("user__profile").filter(key_hash=key_hash, revoked_at__isnull=True).first()
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if not token.is_expired(now) and (token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


class ApiTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key: str):
        key_hash = ApiToken.hash_key(key)
        seconds = settings.API_TOKEN_CACHE_SECONDS
        memo = snapshot_memo(APITOKENS) if seconds > 0 else None
        token = memo.get(key_hash) if memo is not None else None
        if token is not None and time.time() - getattr(token, "looked_up_at", 0) >= seconds:
            token = None  # looked up API_TOKEN_CACHE_SECONDS ago: look again
        from_memo = cached = token is not None
        if token is None and seconds > 0:
            try:
                token = cache.get(_cache_key(key_hash))
                cached = token is not None
            except Exception:  # noqa: BLE001 — without the cache, the database answers
                logger.warning("API token cache does not answer; looking the token up", exc_info=True)
                seconds = 0
        if token is None:
            token = _lookup(key_hash)
            if token is not None:
                token.looked_up_at = time.time()  # kept with it in the cache: the memo's bound
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        if token.is_expired(timezone.now()):
            raise exceptions.AuthenticationFailed(f"This API token expired at {token.expires_at:%Y-%m-%d %H:%M} UTC; create a new one.")
        if seconds > 0 and not cached:
            try:
                cache.set(_cache_key(key_hash), token, timeout=seconds)
            except Exception:  # noqa: BLE001
                logger.warning("could not cache the API token lookup", exc_info=True)
        if memo is not None and seconds > 0 and not from_memo:
            memo_put(memo, key_hash, token, max_entries=TOKEN_MEMO_MAX)
        # each request its own copies: the memo's are shared by the process's threads
        token = copy.copy(token)
        token.user = copy.copy(token.user)
        return token.user, token
