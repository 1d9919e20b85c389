"""Users whose accounts belong to a directory (LDAP, OpenID Connect): what a login brings over.

At every directory login the backend calls ``directory_user_sync``: the profile records where the
account comes from (``Profile.identity_source``), the Unix user name and its uid/gid as the
directory has them, and — when ``DIRECTORY_TEAM_MAP`` is set — the memberships of the mapped teams
follow the user's directory groups (added, role changed, removed; teams the map does not name are
left alone, so memberships an admin gave by hand stay). That record is how the portal knows that
the Unix account is the directory's: ``portal.unix.unix_user_ensure`` never creates it."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from portal.exceptions import ApplicationError
from portal.models import UNIX_NAME_VALIDATOR, IdentitySource, Membership, Profile, Role, Team
from portal.services import membership_remove, membership_set, profile_ensure

logger = logging.getLogger(__name__)


def directory_number(value) -> int | None:
    """A uid/gid as a directory gives it ("24001", 24001, missing) → int or None."""
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def directory_takeover_allowed(user) -> bool:
    """May a directory login log in as this existing user? Not as a local staff or superuser
    account: those keep their portal password, and a directory entry of the same name (a typo, a
    hostile provider claim) must not become an admin."""
    profile = getattr(user, "profile", None)
    if profile is not None and profile.directory_owned:
        return True
    return not (user.is_staff or user.is_superuser)


def teams_for_groups(groups: Iterable[str]) -> dict[str, str]:
    """{team slug: role} the directory groups give through DIRECTORY_TEAM_MAP (manager wins)."""
    wanted: dict[str, str] = {}
    for group in groups:
        if group in settings.DIRECTORY_TEAM_MAP:
            slug, role = settings.DIRECTORY_TEAM_MAP[group]
            if wanted.get(slug) != Role.MANAGER:
                wanted[slug] = role
    return wanted


@transaction.atomic
def directory_user_sync(
    *, user, source: str, unix_username: str, uid: int | None, gid: int | None, groups: Iterable[str] | None
) -> Profile:
    """Record what the directory says about ``user`` (see the module docstring). ``groups`` None:
    the directory gave no group information, memberships are left as they are."""
    if source not in (IdentitySource.LDAP, IdentitySource.OIDC):
        raise ValueError(f"not a directory: {source!r}")
    try:
        UNIX_NAME_VALIDATOR(unix_username)
    except ValidationError:
        raise ApplicationError(
            f"The directory's Unix user name {unix_username!r} for {user.username} is not a valid Unix name.",
            errors={"unix_username": ["Use 1–32 lower-case letters, digits, '-' or '_'."]},
        ) from None
    profile = profile_ensure(user=user)
    fields = {
        "identity_source": source,
        "unix_username": "" if unix_username == user.username else unix_username,
        "unix_uid": uid,
        "unix_gid": gid,
    }
    if any(getattr(profile, name) != value for name, value in fields.items()):
        Profile.objects.filter(pk=profile.pk).update(**fields)
        profile.refresh_from_db()
    if groups is not None and settings.DIRECTORY_TEAM_MAP:
        _memberships_follow(user=user, wanted=teams_for_groups(groups), source=source)
    return profile


def _memberships_follow(*, user, wanted: dict[str, str], source: str) -> None:
    mapped = {slug for slug, _ in settings.DIRECTORY_TEAM_MAP.values()}
    teams = {team.slug: team for team in Team.objects.filter(slug__in=mapped)}
    for slug in sorted(mapped - set(teams)):
        logger.warning("DIRECTORY_TEAM_MAP names team %r, which does not exist", slug)
    current = {m.team.slug: m.role for m in Membership.objects.filter(user=user, team__slug__in=mapped).select_related("team")}
    for slug, role in sorted(wanted.items()):
        if slug in teams and current.get(slug) != role:
            membership_set(team=teams[slug], user=user, role=role, actor=None)
    for slug in sorted(set(current) - set(wanted)):
        membership_remove(team=teams[slug], user=user, actor=None)
    if wanted != current:
        logger.info("%s login of %s: teams %s", source, user.username, wanted or "none")
