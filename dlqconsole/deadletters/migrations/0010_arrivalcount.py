from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import migrations, models
from django.db.models import Count
from django.db.models.functions import TruncMinute
from django.utils import timezone

# ARRIVAL_COUNT_RETENTION when this migration was written: older minutes would be pruned at once.
RETENTION = dt.timedelta(days=3)


def count_past_arrivals(apps: Any, schema_editor: Any) -> None:
    """Seed the arrival counts from the dead letters stored within the retention window, so that an upgraded
    console's arrival charts are not empty. Dead letters purged before the upgrade are gone and stay uncounted."""
    DeadLetter = apps.get_model("deadletters", "DeadLetter")
    ArrivalCount = apps.get_model("deadletters", "ArrivalCount")
    statuses = [value for value, _ in DeadLetter._meta.get_field("status").choices]
    # By status and time, so the (status, ingested_at) index bounds the read to the window.
    minutes = (
        DeadLetter.objects.using(schema_editor.connection.alias)
        .filter(status__in=statuses, ingested_at__gte=timezone.now() - RETENTION)
        .annotate(minute=TruncMinute("ingested_at", tzinfo=dt.UTC))
        .values_list("minute", "source_queue")
        .annotate(n=Count("id"))
        .order_by()
    )
    ArrivalCount.objects.using(schema_editor.connection.alias).bulk_create(
        [ArrivalCount(minute=minute, source_queue=queue, count=n) for minute, queue, n in minutes], batch_size=1000
    )


class Migration(migrations.Migration):
    dependencies = [
        ("deadletters", "0009_rule_regex_help"),
    ]

    operations = [
        migrations.CreateModel(
            name="ArrivalCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("minute", models.DateTimeField()),
                ("source_queue", models.CharField(max_length=255)),
                ("count", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("minute", "source_queue"), name="arrival_count_minute_queue")
                ],
            },
        ),
        migrations.RunPython(count_past_arrivals, migrations.RunPython.noop),
    ]
