"""portal.snapshots' registry, model by model: every model whose rows a snapshot keeps is declared
with a SnapshotManager, and each way of writing its rows — an instance's save() and delete(), a
queryset's update(), bulk_create(), bulk_update() and delete(), a related manager's update() — moves
that snapshot's version (what every other process re-reads on); the admin's edits and actions of the
cached models are seen at the next read. (tests/portal/test_snapshot_managers.py follows the
inventory's rows into the next read; tests/portal/test_snapshots_submit.py the quotas, bookings and
roles through their services.)"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

import pytest
from django.utils import timezone

from accounting.models import Booking, Quota, Rate, UsageMonth
from portal.models import Cluster, ClusterPolicyInfo, Membership, NodeInfo, PartitionInfo, Role, Team
from portal.snapshots import (
    _CACHED_MODELS,
    BOOKINGS,
    INVENTORY,
    QUOTAS,
    RATES,
    ROLES,
    USAGE_MONTHS,
    SnapshotManager,
    snapshot_version,
)
from tests.factories import BookingFactory, NodeFactory, QuotaFactory, UserFactory

pytestmark = pytest.mark.django_db

CACHED = {
    Team: ROLES, Membership: ROLES,
    Cluster: INVENTORY, PartitionInfo: INVENTORY, NodeInfo: INVENTORY, ClusterPolicyInfo: INVENTORY,
    Rate: RATES, Quota: QUOTAS, Booking: BOOKINGS, UsageMonth: USAGE_MONTHS,
}  # fmt: skip
_n = itertools.count()


@pytest.fixture(autouse=True)
def private_cache(settings):
    """A cache of this test's own: other test runs on the machine flush the shared Redis cache database."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "snapreg"}}


def _version(model) -> str | None:
    return snapshot_version(CACHED[model])


def _new(model, world):
    """An unsaved row of ``model`` (its related rows saved), and the field a write may set again."""
    n = next(_n)
    now = timezone.now()
    if model is Team:
        return Team(name=f"Reg {n}", slug=f"reg{n}", slurm_account=f"reg{n}"), "name"
    if model is Membership:
        return Membership(team=world.nlp, user=UserFactory(), role=Role.MEMBER), "role"
    if model is Cluster:
        return Cluster(name=f"reg{n}"), "active"
    if model is PartitionInfo:
        return PartitionInfo(name=f"reg{n}", state="UP", seen_at=now), "state"
    if model is NodeInfo:
        return NodeFactory.build(name=f"reg-{n}"), "state"
    if model is ClusterPolicyInfo:
        return ClusterPolicyInfo(cluster=Cluster.objects.create(name=f"regp{n}"), seen_at=now), "max_array_size"
    if model is Rate:
        return Rate(gpu_type="a100", partition=f"reg{n}", price_per_gpu_hour=Decimal(1), effective_from=now.date()), "note"
    if model is Quota:
        return QuotaFactory.build(team=world.vision, gpu_type=f"reg{n}"), "justification"
    if model is Booking:
        return BookingFactory.build(team=world.vision, start=now + dt.timedelta(days=n + 1)), "note"
    if model is UsageMonth:
        return UsageMonth(period=dt.date(2000 + n % 90, 1 + n % 12, 1)), "stale"
    raise AssertionError(f"no row maker for {model.__name__}")


def _saved(model, world):
    obj, field = _new(model, world)
    obj.save()
    return obj, field


def test_the_registry_holds_every_cached_model_with_its_snapshot_and_manager():
    assert {model: name for model, name in _CACHED_MODELS.items() if model in CACHED} == CACHED
    assert set(_CACHED_MODELS) == set(CACHED)  # a new cached model gets its paths tested here
    for model in CACHED:
        assert isinstance(model._default_manager, SnapshotManager), model.__name__


WRITES = {
    "save": lambda model, obj, field: obj.save(),
    "save(update_fields)": lambda model, obj, field: obj.save(update_fields=[field]),
    "delete": lambda model, obj, field: obj.delete(),
    "update()": lambda model, obj, field: model.objects.filter(pk=obj.pk).update(**{field: getattr(obj, field)}),
    "bulk_update()": lambda model, obj, field: model.objects.bulk_update([obj], [field]),
    "queryset delete()": lambda model, obj, field: model.objects.filter(pk=obj.pk).delete(),
}


@pytest.mark.parametrize("path", sorted(WRITES))
@pytest.mark.parametrize("model", sorted(CACHED, key=lambda m: m.__name__), ids=lambda m: m.__name__)
def test_every_write_of_a_cached_model_moves_its_snapshot(world, model, path):
    obj, field = _saved(model, world)
    before = _version(model)
    WRITES[path](model, obj, field)
    assert _version(model) not in (None, before)


@pytest.mark.parametrize("model", sorted(CACHED, key=lambda m: m.__name__), ids=lambda m: m.__name__)
def test_bulk_create_of_a_cached_model_moves_its_snapshot(world, model):
    obj, _ = _new(model, world)
    before = _version(model)
    model.objects.bulk_create([obj])
    assert _version(model) not in (None, before)
    assert obj.pk is not None and model.objects.filter(pk=obj.pk).exists()


def test_a_related_managers_update_moves_the_snapshot(world):
    before = _version(Membership)
    assert world.vision.memberships.filter(user=world.alice).update(role=Role.MANAGER) == 1
    assert _version(Membership) not in (None, before)


# ---------------------------------------------------------------- the admin's edits and actions


def test_an_admin_quota_approval_is_in_force_at_the_next_read(world, client_for, monkeypatch):
    from accounting.selectors import quotas_effective
    from accounting.services import quota_request

    monkeypatch.setattr("portal.outbox.publish", lambda task, *args: True)  # no Slurm limits mirrored
    quotas_effective(team=world.vision)  # the copy is warm
    quota = quota_request(team=world.vision, user=world.bob, gpu_type="h100", gpu_hours=7, justification="admin")
    response = client_for("admin").post("/admin/accounting/quota/", {"action": "approve_quotas",
                                                                    "_selected_action": [quota.pk]})  # fmt: skip
    assert response.status_code == 302
    assert quotas_effective(team=world.vision)[(world.vision.pk, "h100")].gpu_hours == 7


def test_an_admin_rate_is_priced_at_the_next_quote(world, client_for):
    from accounting.rates import gpu_hour_price

    now = timezone.now()
    gpu_hour_price(gpu_type="h100", at=now)  # the copy is warm
    response = client_for("admin").post("/admin/accounting/rate/add/", {
        "gpu_type": "h100", "partition": "", "price_per_gpu_hour": "13.50", "currency": "CNY",
        "effective_from": f"{timezone.localdate() - dt.timedelta(days=1):%Y-%m-%d}", "note": "",
    })  # fmt: skip
    assert response.status_code == 302
    assert gpu_hour_price(gpu_type="h100", at=now)[0] == Decimal("13.50")


def test_an_admin_edit_of_a_teams_members_is_seen_at_the_next_read(world, client_for):
    from portal.roles import team_with_role

    assert team_with_role(world.alice, "vision").viewer_role == Role.MEMBER  # the copy is warm
    client = client_for("admin")
    page = client.get(f"/admin/portal/team/{world.vision.pk}/change/")
    assert page.status_code == 200
    data = {}
    for form in [page.context["adminform"].form, *(f for fs in page.context["inline_admin_formsets"] for f in
                                                     [fs.formset.management_form, *fs.formset.forms])]:  # fmt: skip
        for name, bound in ((name, form[name]) for name in form.fields):
            value = bound.value()
            if value is not None and value is not False:
                data[bound.html_name] = value
    membership = Membership.objects.get(team=world.vision, user=world.alice)
    for fs in page.context["inline_admin_formsets"]:
        for form in fs.formset.forms:
            if form.instance.pk == membership.pk:
                data[form["role"].html_name] = Role.MANAGER
    response = client.post(f"/admin/portal/team/{world.vision.pk}/change/", data)
    assert response.status_code == 302, response.context and [f.errors for f in response.context["inline_admin_formsets"][0].formset.forms]
    assert team_with_role(world.alice, "vision").viewer_role == Role.MANAGER
