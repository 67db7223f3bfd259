"""An alert rule may look at one broker's queues."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("brokers", "0001_initial"), ("alerts", "0007_webhook_signing")]

    operations = [
        migrations.AddField(
            model_name="alertrule",
            name="broker",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="brokers.broker",
            ),
        ),
    ]
