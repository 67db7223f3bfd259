from __future__ import annotations

import datetime as dt
from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Count
from django.db.models.functions import TruncHour
from django.utils import timezone

# ARRIVAL_COUNT_RETENTION when this migration was written: older hours would be pruned at once.
RETENTION = dt.timedelta(days=3)


def count_past_arrivals(apps: Any, schema_editor: Any) -> None:
    """Seed the per-pattern hourly counts from the dead letters stored within the retention window, so that an
    upgraded console's sparklines are not empty. Dead letters purged before the upgrade are gone and stay
    uncounted."""
    DeadLetter = apps.get_model("deadletters", "DeadLetter")
    PatternArrivalCount = apps.get_model("deadletters", "PatternArrivalCount")
    statuses = [value for value, _ in DeadLetter._meta.get_field("status").choices]
    # From the start of an hour: a first hour counted in part would be lowered below its true count by a move.
    start = (timezone.now() - RETENTION).replace(minute=0, second=0, microsecond=0)
    # By status and time, so the (status, ingested_at) index bounds the read to the window.
    hours = (
        DeadLetter.objects.using(schema_editor.connection.alias)
        .filter(status__in=statuses, ingested_at__gte=start, pattern__isnull=False)
        .annotate(hour=TruncHour("ingested_at", tzinfo=dt.UTC))
        .values_list("hour", "pattern_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    PatternArrivalCount.objects.using(schema_editor.connection.alias).bulk_create(
        [PatternArrivalCount(hour=hour, pattern_id=pattern_id, count=n) for hour, pattern_id, n in hours],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("deadletters", "0010_arrivalcount"),
    ]

    operations = [
        migrations.CreateModel(
            name="PatternArrivalCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hour", models.DateTimeField()),
                ("count", models.BigIntegerField(default=0)),
                (
                    "pattern",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="deadletters.failurepattern",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("pattern", "hour"), name="pattern_arrival_count_pattern_hour")
                ],
            },
        ),
        migrations.RunPython(count_past_arrivals, migrations.RunPython.noop),
    ]
