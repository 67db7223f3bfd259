"""A move may name another broker; a retry policy may cover one broker; a purge's record names the broker."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("brokers", "0001_initial"), ("operations", "0007_purged_dead_letter")]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="target_broker",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="brokers.broker",
            ),
        ),
        migrations.AddField(
            model_name="purgeddeadletter",
            name="broker_name",
            field=models.CharField(default="default", max_length=64),
        ),
        migrations.AddField(
            model_name="retrypolicy",
            name="broker",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                help_text="Only dead letters of this broker; empty for any.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="brokers.broker",
            ),
        ),
    ]
