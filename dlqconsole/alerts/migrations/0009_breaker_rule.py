"""The rule kind "circuit breaker open", and its default rule (only that one: a default rule an admin deleted stays
deleted)."""

from __future__ import annotations

from django.db import migrations, models

from dlqconsole.alerts.defaults import DEFAULT_RULES


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    rule_model = apps.get_model("alerts", "AlertRule")
    for fields in DEFAULT_RULES:
        if fields["kind"] == "breaker_open":
            rule_model.objects.get_or_create(name=fields["name"], defaults=fields)


class Migration(migrations.Migration):
    dependencies = [("alerts", "0008_rule_broker")]

    operations = [
        migrations.AlterField(
            model_name="alertrule",
            name="kind",
            field=models.CharField(
                choices=[
                    ("dlq_not_empty", "Dead-letter queue not empty"),
                    ("dlq_growth", "Dead-letter queue growing"),
                    ("queue_depth", "Work queue depth"),
                    ("new_pattern", "New failure pattern"),
                    ("pattern_reopened", "Resolved pattern reopened"),
                    ("oldest_age", "Oldest dead letter too old"),
                    ("operation_paused", "Operation paused automatically"),
                    ("breaker_open", "Circuit breaker open"),
                ],
                max_length=32,
            ),
        ),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]
