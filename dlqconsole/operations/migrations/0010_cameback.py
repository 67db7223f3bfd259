"""Operations keep why their replays came back: {failure reason: count} beside `returned`. Nullable, so processes of
the previous version, still running during a deploy, insert operations without it."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("operations", "0009_operation_items_removed")]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="returned_reasons",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
