"""Who a user is to the portal. Admins are staff users; finance users hold ``portal.view_cost_reports``
(given by the ``finance`` group); team roles come from Membership."""

from __future__ import annotations

from django.db.models import OuterRef, Subquery

from portal.models import Membership, Role, Team
from portal.snapshots import ROLES, memo_put, snapshot_memo

FINANCE_GROUP = "finance"
COST_REPORT_PERMISSION = "portal.view_cost_reports"


def is_admin(user) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def is_finance(user) -> bool:
    return bool(user.is_authenticated and user.is_active and user.has_perm(COST_REPORT_PERMISSION))


def can_read_cost_reports(user) -> bool:
    return is_admin(user) or is_finance(user)


def team_role(user, team: Team | int) -> str | None:
    """The user's role in the team (a Team or its pk), or None. No query for a team read by
    ``team_with_role`` for this user."""
    if not user.is_authenticated:
        return None
    read = getattr(team, "_role_of", None)
    if read is not None and read[0] == user.pk:
        return read[1]
    team_id = team.pk if isinstance(team, Team) else team
    membership = Membership.objects.filter(user=user, team_id=team_id).only("role").first()
    return membership.role if membership else None


# team_with_role's memo holds at most this many (user, slug) answers per version of ROLES
ROLE_MEMO_MAX = 20000
_MISSING = object()


def team_with_role(user, slug: str | None) -> Team | None:
    """The team of this slug, or None, with the user's role in it (the submit path; ``team_role`` /
    ``is_member`` then answer from it). From this process's memo of earlier answers (portal.snapshots
    ROLES: emptied by any change of a team or a membership), else one query for both. Each call
    gets a Team of its own."""
    if not slug:
        return None
    if not user.is_authenticated:
        return Team.objects.filter(slug=slug).first()
    memo = snapshot_memo(ROLES)
    found = memo.get((user.pk, slug), _MISSING)
    if found is _MISSING:  # (a queryset is built only here: building one costs more than the memo)
        role = Membership.objects.filter(team=OuterRef("pk"), user=user).values("role")[:1]
        team = Team.objects.filter(slug=slug).annotate(viewer_role=Subquery(role)).first()
        found = None if team is None else (tuple(getattr(team, f.attname) for f in _TEAM_FIELDS), team.viewer_role)
        memo_put(memo, (user.pk, slug), found, max_entries=ROLE_MEMO_MAX)
    if found is None:
        return None
    values, role = found
    team = Team.from_db(Team.objects.db, _TEAM_NAMES, values)
    team.viewer_role = role
    team._role_of = (user.pk, role)
    return team


_TEAM_FIELDS = tuple(Team._meta.concrete_fields)
_TEAM_NAMES = tuple(f.attname for f in _TEAM_FIELDS)


def is_member(user, team: Team | int) -> bool:
    return team_role(user, team) is not None


def is_manager(user, team: Team | int) -> bool:
    return team_role(user, team) == Role.MANAGER


def member_team_ids(user):
    """A subquery of the pks of the teams the user belongs to (any role), for ``team_id__in=``."""
    return Membership.objects.filter(user=user).values("team_id")


def team_manager_emails(team: Team) -> list[str]:
    """The e-mail addresses of the team's managers (those that have one), sorted. One query."""
    rows = Membership.objects.filter(team=team, role=Role.MANAGER).exclude(user__email="")
    return sorted(set(rows.values_list("user__email", flat=True)))
