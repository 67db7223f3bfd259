"""Watched queues, queue samples and ingest totals belong to a broker; existing rows to `default`."""

from __future__ import annotations

from django.db import migrations, models

from dlqconsole.brokers.migration_ops import add_broker, add_index


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("brokers", "0001_initial"), ("ingest", "0003_ingeststat")]

    operations = [
        *add_broker("watchedqueue", "ingest_watchedqueue"),
        migrations.AlterField(model_name="watchedqueue", name="name", field=models.CharField(max_length=255)),
        migrations.AlterField(
            model_name="watchedqueue", name="dead_letter_queue", field=models.CharField(max_length=255)
        ),
        migrations.AddConstraint(
            model_name="watchedqueue",
            constraint=models.UniqueConstraint(fields=("broker", "name"), name="watchedqueue_broker_name"),
        ),
        migrations.AddConstraint(
            model_name="watchedqueue",
            constraint=models.UniqueConstraint(fields=("broker", "dead_letter_queue"), name="watchedqueue_broker_dlq"),
        ),
        migrations.AlterModelOptions(name="watchedqueue", options={"ordering": ["name", "broker"]}),
        *add_broker("queuesample", "ingest_queuesample"),
        add_index(
            "queuesample",
            models.Index(fields=["broker", "queue", "-sampled_at"], name="queuesample_broker_queue_time"),
        ),
        migrations.RemoveIndex(model_name="queuesample", name="queuesample_queue_time"),
        *add_broker("ingeststat", "ingest_ingeststat"),
        migrations.AlterField(model_name="ingeststat", name="source_queue", field=models.CharField(max_length=255)),
        migrations.AddConstraint(
            model_name="ingeststat",
            constraint=models.UniqueConstraint(fields=("broker", "source_queue"), name="ingeststat_broker_queue"),
        ),
        migrations.AlterModelOptions(name="ingeststat", options={"ordering": ["source_queue", "broker"]}),
    ]
