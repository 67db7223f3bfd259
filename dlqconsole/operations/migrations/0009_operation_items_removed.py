"""Retention removes the item rows of operations finished long ago: the operation records when, and a summary of
what they said (operations/retention.py). Both nullable, so processes of the previous version, still running during
a deploy, insert operations without them."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("operations", "0008_brokers")]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="items_removed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="operation",
            name="items_summary",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(("items_removed_at__isnull", True)),
                fields=["finished_at"],
                name="operation_items_kept",
            ),
        ),
    ]
