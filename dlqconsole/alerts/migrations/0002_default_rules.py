"""Install the default alert rules, so a fresh console alerts on its first dead letter without configuration."""

from __future__ import annotations

from django.db import migrations

from dlqconsole.alerts.defaults import install_default_rules


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    install_default_rules(apps.get_model("alerts", "AlertRule"))


class Migration(migrations.Migration):
    dependencies = [("alerts", "0001_initial")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]
