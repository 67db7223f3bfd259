"""An index on the dead letters' correlation id, for the correlation id filter; built concurrently on PostgreSQL
(brokers/migration_ops.py), so ingest and the pages go on while it builds."""

from __future__ import annotations

from django.db import migrations, models

from dlqconsole.brokers.migration_ops import add_index


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("deadletters", "0016_brokers")]

    operations = [
        add_index("deadletter", models.Index(fields=["correlation_id"], name="deadletter_correlation_id")),
    ]
