"""Filling in search_text for dead letters stored before the column existed (NULL there).

Beat runs `fill_search_text` every minute (deadletters.fill_search_text): a bounded number of rows per run, in small
batches, each one short UPDATE, lowest ids first through the partial index of rows still NULL
(deadletter_search_pending), so the pages and ingest never wait behind it and the work resumes wherever the last
run stopped. `manage.py fill_search_text` runs it to the end at once after an upgrade of a large database. Until a
row is filled in, the text filter finds it by its error type and message (filters.py)."""

from __future__ import annotations

from django.conf import settings
from django.db.models import BinaryField, Case, TextField, Value, When
from django.db.models.functions import Substr

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.deadletters.search import fallback_name, search_text

# Rows written per transaction: a short lock on each, and a statement of a bounded size.
BATCH_SIZE = 500
# Rows one beat run fills at most (5 to 10 seconds of work on two cores: every index of the row is written again): a
# million rows take under an hour of runs, ten million most of a day, or one run of the management command.
ROWS_PER_RUN = 20_000


def fill_search_text(*, limit: int = ROWS_PER_RUN, batch_size: int = BATCH_SIZE) -> int:
    """Computes search_text for at most `limit` dead letters that have none, `batch_size` at a time. Returns how many
    it filled in: 0 once none is left. Only the head of each body that the search reads is loaded."""
    filled = 0
    after = 0
    while filled < limit:
        batch = list(
            DeadLetter.objects.filter(search_text__isnull=True, pk__gt=after)
            .annotate(head=Substr("body", 1, settings.DLQ_SEARCH_BODY_BYTES, output_field=BinaryField()))
            .order_by("pk")
            .only("pk", "error_type", "error_message", "task_name", "death_reason", "original_queue", "source_queue")[
                : min(batch_size, limit - filled)
            ]
        )
        if not batch:
            break
        texts = [
            When(
                pk=row.pk,
                then=Value(
                    search_text(
                        row.error_type,
                        row.error_message,
                        row.head or b"",  # type: ignore[attr-defined]
                        fallback=fallback_name(row),
                    )
                ),
            )
            for row in batch
        ]
        # One statement per batch, kept to rows still NULL: a row saved meanwhile with its text stays as it is.
        DeadLetter.objects.filter(pk__in=[row.pk for row in batch], search_text__isnull=True).update(
            search_text=Case(*texts, output_field=TextField())
        )
        filled += len(batch)
        after = batch[-1].pk
    return filled


def pending_count() -> int:
    """Dead letters without search_text yet (an index-only count over the partial index of them)."""
    return DeadLetter.objects.filter(search_text__isnull=True).count()
