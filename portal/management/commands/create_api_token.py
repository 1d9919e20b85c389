from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.exceptions import ApplicationError
from portal.services import api_token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it (for automation). It cannot be shown again."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="created by create_api_token")
        parser.add_argument("--days", type=int, default=None, help="expires after this many days (default: never, or API_TOKEN_MAX_DAYS)")

    def handle(self, *args, username: str, name: str, days: int | None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        try:
            _, key = api_token_create(user=user, name=name, expires_in_days=days)
        except ApplicationError as exc:
            raise CommandError(f"{exc.message} {' '.join(sum(exc.errors.values(), []))}") from None
        self.stdout.write(key)
