"""The shared fixture world and test-only settings.

World: teams ``vision`` (manager ``bob``, member ``alice``) and ``nlp`` (manager ``dave``, member
``carol``); ``outsider`` in no team; ``admin`` (staff); ``finn`` (finance group). Tests run on
PostgreSQL (DATABASE_URL, set by ``make test``); Celery runs tasks eagerly unless a test asks for the
real worker (``celery_worker`` fixture in tests/jobs)."""

from __future__ import annotations

import os

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from portal.models import Role
from tests.factories import MembershipFactory, TeamFactory, UserFactory


def pytest_configure(config):
    # Settings are loaded before any conftest runs, so a default cannot be set here: refuse SQLite.
    if django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.exit(
            "The tests run on PostgreSQL: use `make test`, or set "
            "DATABASE_URL=postgres://gpuportal@127.0.0.1:5432/gpuportal (scripts/services up prints it).",
            returncode=4,
        )

@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """A test database of this run's own (test_gpuportal_p<pid>), so that several runs on one machine
    (developers, CI, benchmarks) never fight over one database. GPUPORTAL_TEST_DB_SUFFIX fixes it."""
    from pytest_django.fixtures import _set_suffix_to_test_databases

    _set_suffix_to_test_databases(os.environ.get("GPUPORTAL_TEST_DB_SUFFIX") or f"p{os.getpid()}")


ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")


@pytest.fixture(autouse=True)
def _test_settings(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.CELERY_TASK_EAGER_PROPAGATES = True
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    from portal.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield


@pytest.fixture(autouse=True)
def _clear_cache():
    """Throttle counters and idempotency keys live in the (real, Redis) cache: start each test clean."""
    from django.core.cache import cache

    cache.clear()
    yield


class World:
    """Attribute access to the fixture world's objects."""

    def __init__(self):
        self.vision = TeamFactory(slug="vision", name="Vision", slurm_account="vision")
        self.nlp = TeamFactory(slug="nlp", name="NLP", slurm_account="nlp")
        self.alice = UserFactory(username="alice")
        self.bob = UserFactory(username="bob")
        self.carol = UserFactory(username="carol")
        self.dave = UserFactory(username="dave")
        self.outsider = UserFactory(username="outsider")
        self.admin = UserFactory(username="admin", is_staff=True, is_superuser=True)
        self.finn = UserFactory(username="finn")
        self.finn.groups.add(Group.objects.get(name="finance"))
        MembershipFactory(team=self.vision, user=self.alice, role=Role.MEMBER)
        MembershipFactory(team=self.vision, user=self.bob, role=Role.MANAGER)
        MembershipFactory(team=self.nlp, user=self.carol, role=Role.MEMBER)
        MembershipFactory(team=self.nlp, user=self.dave, role=Role.MANAGER)

    def user_for(self, role: str):
        """The user playing a role of the permission matrix, relative to team vision."""
        return {
            "anonymous": None,
            "outsider": self.outsider,
            "member": self.alice,
            "manager": self.bob,
            "admin": self.admin,
            "finance": self.finn,
        }[role]


@pytest.fixture
def world(db) -> World:
    return World()


@pytest.fixture
def api_client_for(world):
    """api_client_for("member") → an APIClient logged in as that role (anonymous: not logged in)."""

    def make(role: str) -> APIClient:
        client = APIClient()
        user = world.user_for(role)
        if user is not None:
            client.force_authenticate(user=user)
        return client

    return make


@pytest.fixture
def client_for(world, client):
    """client_for("manager") → Django's test client logged in as that role."""
    from django.test import Client

    def make(role: str) -> Client:
        c = Client()
        user = world.user_for(role)
        if user is not None:
            c.force_login(user)
        return c

    return make
