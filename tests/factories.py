from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from portal.models import Membership, Profile, Role, Team


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.org")
    password = factory.django.Password("pw-for-tests")

    @factory.post_generation
    def profile(obj, create, extracted, **kwargs):
        if create:
            Profile.objects.get_or_create(user=obj)


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team{n}")
    slurm_account = factory.LazyAttribute(lambda o: o.slug)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class QuotaFactory(factory.django.DjangoModelFactory):
    """An APPROVED any-type quota for the current calendar month (billing time zone) unless told."""

    class Meta:
        model = "accounting.Quota"

    team = factory.SubFactory(TeamFactory)
    gpu_type = ""
    period_start = factory.LazyFunction(lambda: _month()[0])
    period_end = factory.LazyFunction(lambda: _month()[1])
    gpu_hours = 1000
    state = "approved"
    justification = "test quota"
    approved_at = factory.LazyFunction(lambda: __import__("django.utils.timezone", fromlist=["now"]).now())


def _month():
    from accounting.selectors import current_month

    return current_month()
