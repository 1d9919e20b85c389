"""The audit trail is append-only and records who did what to which team."""

from __future__ import annotations

import pytest

from portal import services
from portal.models import Role

pytestmark = pytest.mark.django_db


def test_team_actions_leave_an_append_only_audit_trail(world):
    from portal.models import AuditEvent

    services.membership_set(team=world.vision, user=world.outsider, role=Role.MEMBER, actor=world.admin)
    services.membership_remove(team=world.vision, user=world.outsider, actor=world.admin)
    events = list(AuditEvent.objects.order_by("pk").values_list("actor_name", "action", "data"))
    assert events == [
        ("admin", "team.member_set", {"user": "outsider", "role": "member", "added": True}),
        ("admin", "team.member_remove", {"user": "outsider"}),
    ]
    event = AuditEvent.objects.first()
    event.action = "tampered"
    with pytest.raises(ValueError, match="append-only"):
        event.save()
    with pytest.raises(ValueError, match="append-only"):
        event.delete()
