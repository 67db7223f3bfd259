"""HourIds: the lowest and highest dead-letter id of each hour, kept by triggers on PostgreSQL
(deadletters/time_bounds.py).

On PostgreSQL: a statement trigger after INSERT folds each statement's new rows into their hours (one small
upsert per hour a statement touches: ingest's COPY of a batch is one statement), and a row trigger after an UPDATE
that changes ingested_at folds the row into its new hour. Then the rows stored before are folded in with one scan
(a few seconds per million rows; the triggers were in place first, so nothing written meanwhile is missed). Not
atomic, so the scan holds no lock that stops ingest. Other databases get the table only."""

from __future__ import annotations

from django.db import migrations, models

from dlqconsole.brokers.migration_ops import OnPostgres
from dlqconsole.deadletters.time_bounds import FOLD

TRIGGERS = f"""
CREATE FUNCTION deadletters_fold_hour_ids() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {FOLD.format(rows="new_rows")};
    RETURN NULL;
END $$;
CREATE FUNCTION deadletters_fold_hour_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {FOLD.format(rows="(SELECT NEW.id AS id, NEW.ingested_at AS ingested_at) AS changed")};
    RETURN NULL;
END $$;
CREATE TRIGGER deadletters_hour_ids_insert AFTER INSERT ON deadletters_deadletter
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION deadletters_fold_hour_ids();
CREATE TRIGGER deadletters_hour_ids_update AFTER UPDATE OF ingested_at ON deadletters_deadletter
    FOR EACH ROW WHEN (OLD.ingested_at IS DISTINCT FROM NEW.ingested_at)
    EXECUTE FUNCTION deadletters_fold_hour_id();
"""

DROP = """
DROP TRIGGER IF EXISTS deadletters_hour_ids_insert ON deadletters_deadletter;
DROP TRIGGER IF EXISTS deadletters_hour_ids_update ON deadletters_deadletter;
DROP FUNCTION IF EXISTS deadletters_fold_hour_ids();
DROP FUNCTION IF EXISTS deadletters_fold_hour_id();
"""


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("deadletters", "0018_search_text_and_retention")]

    operations = [
        migrations.CreateModel(
            name="HourIds",
            fields=[
                ("hour", models.DateTimeField(primary_key=True, serialize=False)),
                ("min_id", models.BigIntegerField()),
                ("max_id", models.BigIntegerField()),
            ],
        ),
        OnPostgres(migrations.RunSQL(TRIGGERS, reverse_sql=DROP)),
        OnPostgres(migrations.RunSQL(FOLD.format(rows="deadletters_deadletter"), reverse_sql=migrations.RunSQL.noop)),
    ]
