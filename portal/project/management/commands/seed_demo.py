"""Demo data, idempotent: teams vision and nlp with their managers and members, an admin, a finance
user, the matching Unix accounts, the Slurm associations, and whatever the other apps seed (rates,
job templates). Passwords come from DEMO_PASSWORD."""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from portal.models import Membership, Role, Team
from portal.roles import FINANCE_GROUP
from portal.services import clusters_record, profile_ensure, team_cluster_account_set, team_mirror
from portal.slurm import SlurmError
from portal.unix import unix_user_ensure

DEFAULT_PASSWORD = "gpuportal-demo"

TEAMS = [
    {"slug": "vision", "name": "Vision", "manager": "bob", "members": ["alice"]},
    {"slug": "nlp", "name": "NLP", "manager": "dave", "members": ["carol"]},
]


class Command(BaseCommand):
    help = "Load the demo teams and users (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--no-unix", action="store_true", help="Do not create Unix accounts.")
        parser.add_argument("--no-slurm", action="store_true", help="Do not mirror teams to Slurm now.")

    def handle(self, *args, **options):
        password = os.environ.get("DEMO_PASSWORD") or DEFAULT_PASSWORD
        User = get_user_model()
        with transaction.atomic():
            users = {}

            def user(username: str, **extra):
                obj, created = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.org", **extra})
                if created:
                    obj.set_password(password)
                    obj.save()
                profile_ensure(user=obj)
                users[username] = obj
                return obj

            user("admin", is_staff=True, is_superuser=True, first_name="Ada", last_name="Admin")
            finn = user("finn", first_name="Finn", last_name="Finance")
            finn.groups.add(Group.objects.get(name=FINANCE_GROUP))
            teams = []
            for spec in TEAMS:
                team, _ = Team.objects.get_or_create(
                    slug=spec["slug"], defaults={"name": spec["name"], "slurm_account": spec["slug"]}
                )
                teams.append(team)
                Membership.objects.get_or_create(team=team, user=user(spec["manager"]), defaults={"role": Role.MANAGER})
                for member in spec["members"]:
                    Membership.objects.get_or_create(team=team, user=user(member), defaults={"role": Role.MEMBER})

            # every other configured cluster (the demo's 25.11 one): the teams have access there
            # under the same account names
            for row in clusters_record()[1:]:
                for team in teams:
                    team_cluster_account_set(team=team, cluster=row.name)

            for seed in _app_seeders():
                seed(stdout=self.stdout)

        if not options["no_unix"]:
            for name in ["alice", "bob", "carol", "dave"]:
                unix_user_ensure(name)
        if not options["no_slurm"]:
            for team in teams:
                try:
                    actions = team_mirror(team=team)
                except SlurmError as exc:
                    self.stderr.write(f"Slurm not reachable, teams will be mirrored by the worker: {exc}")
                    break
                for action in actions:
                    self.stdout.write(f"slurm: fixed {action.describe()}")
        self.stdout.write(self.style.SUCCESS("Demo data ready: admin, finn, bob+alice (vision), dave+carol (nlp)."))


def _app_seeders():
    """Other apps contribute demo data through a ``demo.seed(stdout=...)`` function (plain imports:
    a missing one is an error, never a silent skip)."""
    from accounting.demo import seed as accounting_seed
    from jobs.demo import seed as jobs_seed

    return (accounting_seed, jobs_seed)
