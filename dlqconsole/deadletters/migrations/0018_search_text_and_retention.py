"""Text search through a derived column, and retention of finished dead letters.

- `search_text` (deadletters/search.py): added nullable, so no row is rewritten; rows stored before it are NULL,
  searched the slow way and filled in by beat (deadletters.fill_search_text) in batches.
- On PostgreSQL, the pg_trgm extension and a GIN trigram index on it, so a substring search (LIKE '%term%') reads
  the index, not the table.
- A partial index of rows not yet filled in, and one of finished rows (replayed, moved, archived) by the time they
  finished, for retention.

Indexes are built concurrently on PostgreSQL (brokers/migration_ops.py): ingest and the pages go on meanwhile."""

from __future__ import annotations

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations, models

from dlqconsole.brokers.migration_ops import OnPostgres, add_index


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("deadletters", "0017_deadletter_correlation_id")]

    operations = [
        migrations.AddField(
            model_name="deadletter",
            name="search_text",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        OnPostgres(TrigramExtension()),
        OnPostgres(
            migrations.RunSQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS deadletter_search_trgm ON deadletters_deadletter "
                "USING gin (search_text gin_trgm_ops)",
                reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS deadletter_search_trgm",
            )
        ),
        add_index(
            "deadletter",
            models.Index(fields=["id"], name="deadletter_search_pending", condition=models.Q(search_text__isnull=True)),
        ),
        add_index(
            "deadletter",
            models.Index(
                fields=["status_changed_at"],
                name="deadletter_finished_changed",
                condition=models.Q(status__in=["replayed", "moved", "archived"]),
            ),
        ),
    ]
