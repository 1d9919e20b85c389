"""The finance group: holds portal.view_cost_reports (read every team's cost reports)."""

from django.db import migrations


def create_finance_group(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ContentType = apps.get_model("contenttypes", "ContentType")
    content_type, _ = ContentType.objects.get_or_create(app_label="portal", model="team")
    permission, _ = Permission.objects.get_or_create(
        content_type=content_type,
        codename="view_cost_reports",
        defaults={"name": "Can read cost reports of every team"},
    )
    group, _ = Group.objects.get_or_create(name="finance")
    group.permissions.add(permission)


def remove_finance_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="finance").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_finance_group, remove_finance_group)]
