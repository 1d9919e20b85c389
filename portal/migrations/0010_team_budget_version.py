"""Team.budget_version: moved by accounting's triggers (accounting 0011), never lowered by a write of
a stale Team (a BEFORE UPDATE trigger keeps the greater of the stored and the written value). Its
default is the database's (db_default): rows written by code that predates it (a migration test's
historical models) get 0."""

from django.db import migrations, models

GUARD = """
CREATE FUNCTION portal_team_budget_version_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.budget_version := GREATEST(NEW.budget_version, OLD.budget_version);
    RETURN NEW;
END $$;
CREATE TRIGGER team_budget_version_keep BEFORE UPDATE ON portal_team
    FOR EACH ROW EXECUTE FUNCTION portal_team_budget_version_keep();
"""

UNGUARD = """
DROP TRIGGER IF EXISTS team_budget_version_keep ON portal_team;
DROP FUNCTION IF EXISTS portal_team_budget_version_keep();
"""


class Migration(migrations.Migration):
    dependencies = [("portal", "0009_cluster_kind")]

    operations = [
        migrations.AddField(model_name="team", name="budget_version", field=models.BigIntegerField(db_default=0, editable=False)),
        migrations.RunSQL(GUARD, UNGUARD),
    ]
