"""LDAP login against a real slapd (scripts/services ldap, directory scripts/ldap/test-directory.ldif):
users log in with their directory password; username, e-mail and the Unix user (uid/gid) come from
the directory; the directory groups give the mapped teams and roles; the portal never creates a
Unix user the directory owns; admins' portal passwords keep working; and a directory user sees what
the same visibility rules give them, like anyone else."""

from __future__ import annotations

import pwd

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from portal.env import Env
from portal.exceptions import ApplicationError
from portal.identity_settings import ldap_settings, team_map
from portal.models import IdentitySource, Membership, Role
from portal.unix import unix_user_ensure
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db
User = get_user_model()
TEAM_MAP = "vision-users=vision:member,vision-leads=vision:manager"


def site_environment(uri: str) -> dict[str, str]:
    return {
        "LDAP_SERVER_URI": uri,
        "LDAP_BIND_DN": "cn=portal,ou=services,dc=gpuportal,dc=test",
        "LDAP_BIND_PASSWORD": "portal-bind-secret",
        "LDAP_USER_BASE": "ou=people,dc=gpuportal,dc=test",
        "LDAP_GROUP_BASE": "ou=groups,dc=gpuportal,dc=test",
        "DIRECTORY_TEAM_MAP": TEAM_MAP,
    }


@pytest.fixture
def ldap_site(settings, ldap_directory_uri):
    """The settings portal/project/settings.py builds from a site's LDAP environment."""
    env = Env(site_environment(ldap_directory_uri))
    for name, value in ldap_settings(env).items():
        setattr(settings, name, value)
    settings.DIRECTORY_TEAM_MAP = team_map(env)
    settings.AUTHENTICATION_BACKENDS = ["portal.auth_ldap.LdapBackend", "django.contrib.auth.backends.ModelBackend"]
    return settings


def login(username: str, password: str) -> tuple[Client, int]:
    client = Client()
    return client, client.post("/login/", {"username": username, "password": password}).status_code


def test_a_directory_user_logs_in_with_the_directory_password(world, ldap_site):
    client, status = login("lana", "lana-directory-pw")
    assert status == 302
    lana = User.objects.get(username="lana")
    assert (lana.email, lana.first_name, lana.last_name, lana.has_usable_password()) == (
        "lana@directory.example.org", "Lana", "Lang", False,
    )
    profile = lana.profile
    assert (profile.identity_source, profile.cluster_username, profile.unix_uid, profile.unix_gid) == (
        IdentitySource.LDAP, "lana", 24001, 24001,
    )
    assert list(Membership.objects.filter(user=lana).values_list("team__slug", "role")) == [("vision", Role.MEMBER)]
    assert "uid 24001, gid 24001, from the LDAP directory" in client.get("/account/profile/").content.decode()
    # the same visibility rules as for everyone: her team, not the other one
    assert [t["slug"] for t in client.get("/api/v1/teams/").json()["results"]] == ["vision"]
    assert client.get("/api/v1/teams/nlp/").status_code == 404
    assert client.get("/teams/nlp/").status_code == 404


def test_the_directory_groups_give_the_manager_role(world, ldap_site):
    _, status = login("lars", "lars-directory-pw")
    assert status == 302
    lars = User.objects.get(username="lars")
    assert (lars.profile.unix_uid, lars.profile.unix_gid) == (24002, 24100)
    assert list(Membership.objects.filter(user=lars).values_list("team__slug", "role")) == [("vision", Role.MANAGER)]


def test_memberships_of_mapped_teams_follow_the_groups_and_others_stay(world, ldap_site):
    lena = UserFactory(username="lena")
    MembershipFactory(team=world.vision, user=lena, role=Role.MANAGER)  # vision is mapped: lena is in no vision group
    MembershipFactory(team=world.nlp, user=lena, role=Role.MEMBER)  # nlp is not mapped: an admin's choice, kept
    client, status = login("lena", "lena-directory-pw")
    assert status == 302
    assert list(Membership.objects.filter(user=lena).values_list("team__slug", flat=True)) == ["nlp"]
    assert [t["slug"] for t in client.get("/api/v1/teams/").json()["results"]] == ["nlp"]


def test_a_wrong_directory_password_is_refused(world, ldap_site):
    _, status = login("lana", "not-her-password")
    assert status == 200  # the login form again
    assert not User.objects.filter(username="lana").exists()
    _, status = login("nobody-there", "x")
    assert status == 200


def test_portal_passwords_still_work_for_admins(world, ldap_site):
    _, status = login("admin", "pw-for-tests")
    assert status == 302


def test_an_ldap_login_does_not_take_over_a_local_admin_of_the_same_name(world, ldap_site):
    local = UserFactory(username="lana", is_staff=True, email="lana@portal.local")
    _, status = login("lana", "lana-directory-pw")
    assert status == 200  # refused
    local.refresh_from_db()
    assert (local.email, local.profile.identity_source) == ("lana@portal.local", IdentitySource.LOCAL)
    assert not Membership.objects.filter(user=local).exists()
    assert login("lana", "pw-for-tests")[1] == 302  # the local password still works


def test_the_portal_never_creates_a_unix_user_the_directory_owns(world, ldap_site):
    assert login("lana", "lana-directory-pw")[1] == 302
    with pytest.raises(KeyError):
        pwd.getpwnam("lana")  # the test directory's people are not in this host's passwd
    with pytest.raises(ApplicationError, match="belongs to the directory"):
        unix_user_ensure("lana")
    with pytest.raises(KeyError):
        pwd.getpwnam("lana")  # no useradd happened


def test_unix_users_from_directory_refuses_every_creation(world, settings):
    settings.UNIX_USERS_FROM_DIRECTORY = True
    with pytest.raises(ApplicationError, match="belongs to the directory"):
        unix_user_ensure("nobody-made-this")
    assert unix_user_ensure("root") == (0, 0)  # an existing account resolves as before


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LDAP_SERVER_URI": "ldap://h"}, "LDAP_USER_BASE is required"),
        ({"LDAP_SERVER_URI": "http://h", "LDAP_USER_BASE": "dc=x"}, "LDAP_SERVER_URI='http://h' is invalid"),
        ({"LDAP_SERVER_URI": "ldap://h", "LDAP_USER_BASE": "dc=x", "LDAP_REQUIRE_GROUP": "cn=g"}, "needs LDAP_GROUP_BASE"),
        ({"DIRECTORY_TEAM_MAP": "vision-users"}, "DIRECTORY_TEAM_MAP="),
        ({"DIRECTORY_TEAM_MAP": "g=vision:owner"}, "DIRECTORY_TEAM_MAP="),
        ({"DIRECTORY_TEAM_MAP": "g=vision,g=nlp"}, "each group once"),
    ],
)
def test_bad_ldap_settings_stop_start_up(env, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        ldap_settings(Env(env))
        team_map(Env(env))


def test_without_ldap_settings_there_is_no_ldap_backend():
    from django.conf import settings

    assert ldap_settings(Env({})) == {}
    assert settings.AUTHENTICATION_BACKENDS == ["django.contrib.auth.backends.ModelBackend"]
    assert team_map(Env({"DIRECTORY_TEAM_MAP": "a=b, c=d:manager"})) == {"a": ("b", "member"), "c": ("d", "manager")}


def test_the_site_environment_turns_the_ldap_backend_on(ldap_directory_uri):
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.AUTHENTICATION_BACKENDS, s.AUTH_LDAP_SERVER_URI, s.DIRECTORY_TEAM_MAP['vision-leads'])"
    )
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "portal.project.settings"} | site_environment(ldap_directory_uri)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.stdout.split("] ")[0] == "['portal.auth_ldap.LdapBackend', 'django.contrib.auth.backends.ModelBackend'"
    assert result.stdout.split("] ")[1].split() == [ldap_directory_uri, "('vision',", "'manager')"], result.stderr
