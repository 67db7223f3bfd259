"""Dead letters, their counters and arrival counts belong to a broker; existing rows to `default`. The dead
letters' column is filled in batches and its index built concurrently (brokers/migration_ops.py)."""

from __future__ import annotations

from django.db import migrations, models

from dlqconsole.brokers.migration_ops import add_broker, add_index


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("brokers", "0001_initial"), ("deadletters", "0015_identical_copies_and_cut_bodies")]

    operations = [
        *add_broker("deadletter", "deadletters_deadletter"),
        add_index("deadletter", models.Index(fields=["broker", "status", "-id"], name="deadletter_broker_status_id")),
        *add_broker("deadlettercount", "deadletters_deadlettercount"),
        migrations.AddConstraint(
            model_name="deadlettercount",
            constraint=models.UniqueConstraint(
                fields=("broker", "source_queue", "pattern", "failure_reason", "status"),
                name="deadletter_count_broker_cell",
            ),
        ),
        migrations.RemoveConstraint(model_name="deadlettercount", name="deadletter_count_cell"),
        *add_broker("arrivalcount", "deadletters_arrivalcount"),
        migrations.AddConstraint(
            model_name="arrivalcount",
            constraint=models.UniqueConstraint(
                fields=("minute", "broker", "source_queue"), name="arrival_count_minute_broker_queue"
            ),
        ),
        migrations.RemoveConstraint(model_name="arrivalcount", name="arrival_count_minute_queue"),
    ]
