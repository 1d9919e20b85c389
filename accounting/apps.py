from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "accounting"
    verbose_name = "Accounting: rates, quotas, bookings, usage"

    def ready(self) -> None:
        from accounting.models import Booking, Quota
        from portal.snapshots import BOOKINGS, QUOTAS, changed_on_save

        # the copies the submit path reads (accounting.selectors.budgets): re-read after any change
        changed_on_save(Quota, QUOTAS)
        changed_on_save(Booking, BOOKINGS)
