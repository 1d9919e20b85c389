from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.services import api_token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it (for automation). It cannot be shown again."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="created by create_api_token")

    def handle(self, *args, username: str, name: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        _, key = api_token_create(user=user, name=name)
        self.stdout.write(key)
