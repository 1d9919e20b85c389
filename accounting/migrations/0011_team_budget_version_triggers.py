"""Every change of a quota or booking that the budget counts moves its team's budget_version
(portal.Team), in the changing transaction, whoever makes it (the services, the admin, SQL): the
budget check (accounting.services.budget_holds_place) reads the version under the team's row lock and
uses this process's copies of the quotas and bookings only when they were read at that version."""

from django.db import migrations

TRIGGERS = """
CREATE FUNCTION accounting_team_budget_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE portal_team SET budget_version = budget_version + 1 WHERE id = OLD.team_id;
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.team_id <> OLD.team_id) THEN
        UPDATE portal_team SET budget_version = budget_version + 1 WHERE id = NEW.team_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER quota_budget_moved_insert_delete AFTER INSERT OR DELETE ON accounting_quota
    FOR EACH ROW EXECUTE FUNCTION accounting_team_budget_moved();
CREATE TRIGGER quota_budget_moved_update AFTER UPDATE ON accounting_quota FOR EACH ROW
    WHEN ((OLD.team_id, OLD.state, OLD.gpu_type, OLD.gpu_hours, OLD.period_start, OLD.period_end, OLD.approved_at)
          IS DISTINCT FROM (NEW.team_id, NEW.state, NEW.gpu_type, NEW.gpu_hours, NEW.period_start, NEW.period_end, NEW.approved_at))
    EXECUTE FUNCTION accounting_team_budget_moved();
CREATE TRIGGER booking_budget_moved_insert_delete AFTER INSERT OR DELETE ON accounting_booking
    FOR EACH ROW EXECUTE FUNCTION accounting_team_budget_moved();
CREATE TRIGGER booking_budget_moved_update AFTER UPDATE ON accounting_booking FOR EACH ROW
    WHEN ((OLD.team_id, OLD.status, OLD.gpu_type, OLD.gpus, OLD.start, OLD."end", OLD.approved_at, OLD.cancelled_at)
          IS DISTINCT FROM (NEW.team_id, NEW.status, NEW.gpu_type, NEW.gpus, NEW.start, NEW."end", NEW.approved_at, NEW.cancelled_at))
    EXECUTE FUNCTION accounting_team_budget_moved();
"""

DROP = """
DROP TRIGGER IF EXISTS quota_budget_moved_insert_delete ON accounting_quota;
DROP TRIGGER IF EXISTS quota_budget_moved_update ON accounting_quota;
DROP TRIGGER IF EXISTS booking_budget_moved_insert_delete ON accounting_booking;
DROP TRIGGER IF EXISTS booking_budget_moved_update ON accounting_booking;
DROP FUNCTION IF EXISTS accounting_team_budget_moved();
"""


class Migration(migrations.Migration):
    dependencies = [("accounting", "0010_idle_cancel_saving"), ("portal", "0010_team_budget_version")]

    operations = [migrations.RunSQL(TRIGGERS, DROP)]
