from django.core.management.base import BaseCommand, CommandError

from portal.models import Team
from portal.services import association_apply, association_plan, default_accounts
from portal.slurm import SlurmError, get_gateway


class Command(BaseCommand):
    help = (
        "Print the differences between the portal's teams and Slurm's associations; --apply fixes the ones "
        "the portal owns (accounts of its teams). Accounts the portal does not manage are never touched."
    )

    def add_arguments(self, parser):
        parser.add_argument("--apply", action="store_true")

    def handle(self, *args, apply: bool, **options):
        teams = list(Team.objects.all())
        try:
            associations = get_gateway().associations()
        except SlurmError as exc:
            raise CommandError(f"Slurm: {exc}") from exc
        actions = association_plan(teams=teams, associations=associations)
        extra = _limit_drift_lines()
        if not actions and not extra:
            self.stdout.write("In sync: no differences.")
            return
        for action in actions:
            self.stdout.write(("fixing: " if apply else "") + action.describe())
        for line in extra:
            self.stdout.write(line)
        if apply and actions:
            try:
                association_apply(actions=actions, default_for=default_accounts())
            except SlurmError as exc:
                raise CommandError(f"Slurm: {exc}") from exc
            self.stdout.write(self.style.SUCCESS(f"Applied {len(actions)} fix(es)."))
        if apply and extra:
            fixed = _limit_apply()
            self.stdout.write(self.style.SUCCESS(f"Applied {len(fixed)} limit fix(es)."))


def _limit_drift_lines() -> list[str]:
    """Limit drift (quotas mirrored to GrpTRESMins/GrpTRES)."""
    from accounting.services import quota_limit_drift

    return quota_limit_drift()


def _limit_apply() -> list[str]:
    """Set the limits the portal's quotas call for where Slurm drifted (accounting app)."""
    from accounting.services import quota_limits_apply

    try:
        return quota_limits_apply()
    except SlurmError as exc:
        raise CommandError(f"Slurm: {exc}") from exc
