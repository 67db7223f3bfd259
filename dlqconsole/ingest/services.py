"""Write parsed dead letters to the database: idempotent, one transaction per batch, counters kept exact."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from dlqconsole.deadletters.grouping import assign_patterns
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    PatternEvent,
    PatternStatus,
)
from dlqconsole.ingest.envelope import ParsedDeadLetter

# Columns written by ingest, in order; each maps to a ParsedDeadLetter attribute of the same name unless noted.
COLUMNS = (
    "dedupe_key",
    "source_queue",
    "original_queue",
    "original_exchange",
    "original_routing_keys",
    "death_reason",
    "failure_reason",
    "transient",
    "error_type",
    "error_message",
    "stack_trace",
    "attempt_count",
    "first_failed_at",
    "last_failed_at",
    "ingested_at",
    "host",
    "app_version",
    "message_id",
    "correlation_id",
    "priority",
    "content_type",
    "content_encoding",
    "task_name",
    "task_id",
    "task_retries",
    "headers",
    "properties",
    "x_death",
    "body",
    "body_size",
    "parse_errors",
    "fingerprint",
    "pattern_id",
    "status",
    "status_changed_at",
    "replay_count",
    "retry_exhausted",
    "previous_id",
)
ROWS_PER_STATEMENT = 200


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int

    @property
    def duplicates(self) -> int:
        return self.received - self.inserted


def ingest_batch(*, letters: Sequence[ParsedDeadLetter], now: dt.datetime | None = None) -> IngestResult:
    """Store a batch of dead letters in one transaction. Duplicates (same dedupe key) are skipped, so a batch
    redelivered after a crash between commit and ack changes nothing."""
    if not letters:
        return IngestResult(received=0, inserted=0)
    now = now or timezone.now()
    # The same delivery twice in one batch would make the INSERT touch one key twice.
    unique = list({letter.dedupe_key: letter for letter in letters}.values())
    with transaction.atomic():
        pattern_ids = assign_patterns(letters=unique, now=now)
        inserted_keys = _insert(unique, pattern_ids=pattern_ids, now=now)
        inserted = [letter for letter in unique if letter.dedupe_key in inserted_keys]
        _count_arrivals(inserted, pattern_ids=pattern_ids, now=now)
    return IngestResult(received=len(letters), inserted=len(inserted))


def _insert(letters: list[ParsedDeadLetter], *, pattern_ids: dict[str, int], now: dt.datetime) -> set[str]:
    fields = {field.attname: field for field in DeadLetter._meta.concrete_fields}
    previous_ids = _replayed_from(letters)
    table = DeadLetter._meta.db_table
    column_sql = ", ".join(str(fields[name].column) for name in COLUMNS)
    row_sql = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    inserted: set[str] = set()
    with connection.cursor() as cursor:
        for start in range(0, len(letters), ROWS_PER_STATEMENT):
            chunk = letters[start : start + ROWS_PER_STATEMENT]
            params: list[Any] = []
            for letter in chunk:
                values = {
                    **{name: getattr(letter, name, None) for name in COLUMNS},
                    "ingested_at": now,
                    "body_size": len(letter.body),
                    "pattern_id": pattern_ids[letter.fingerprint],
                    "status": DeadLetterStatus.PARKED,
                    "status_changed_at": now,
                    "retry_exhausted": False,
                    "previous_id": previous_ids.get(letter.dedupe_key),
                }
                params.extend(fields[name].get_db_prep_save(values[name], connection) for name in COLUMNS)
            cursor.execute(
                f"INSERT INTO {table} ({column_sql}) VALUES {', '.join([row_sql] * len(chunk))} "
                "ON CONFLICT (dedupe_key) DO NOTHING RETURNING dedupe_key",
                params,
            )
            inserted.update(str(row[0]) for row in cursor.fetchall())
    return inserted


def _replayed_from(letters: list[ParsedDeadLetter]) -> dict[str, int]:
    """Link a replayed message that died again to the record it was replayed from (a boomerang)."""
    wanted = {letter.dedupe_key: letter.replayed_from for letter in letters if letter.replayed_from}
    if not wanted:
        return {}
    existing = set(DeadLetter.objects.filter(pk__in=set(wanted.values())).values_list("pk", flat=True))
    return {key: origin for key, origin in wanted.items() if origin in existing}


def _count_arrivals(inserted: list[ParsedDeadLetter], *, pattern_ids: dict[str, int], now: dt.datetime) -> None:
    if not inserted:
        return
    cells: Counter[tuple[str, int, str]] = Counter()
    per_pattern: Counter[int] = Counter()
    for letter in inserted:
        pattern_id = pattern_ids[letter.fingerprint]
        cells[(letter.source_queue, pattern_id, letter.failure_reason)] += 1
        per_pattern[pattern_id] += 1
    add_counts(
        [(queue, pattern_id, reason, DeadLetterStatus.PARKED, n) for (queue, pattern_id, reason), n in cells.items()]
    )
    table = FailurePattern._meta.db_table
    with connection.cursor() as cursor:
        for pattern_id, n in sorted(per_pattern.items()):
            cursor.execute(
                f"UPDATE {table} SET total_count = total_count + %s, last_seen_at = %s WHERE id = %s",
                [n, now, pattern_id],
            )
    reopen_patterns(pattern_ids=sorted(per_pattern), now=now)


def add_counts(changes: list[tuple[str, int, str, str, int]]) -> None:
    """Add (queue, pattern id, reason, status, delta) to the counters, creating cells as needed.

    Sorted so that concurrent writers lock the cells in the same order and cannot deadlock.
    """
    table = DeadLetterCount._meta.db_table
    with connection.cursor() as cursor:
        for queue, pattern_id, reason, status, delta in sorted(changes):
            if delta == 0:
                continue
            cursor.execute(
                f"INSERT INTO {table} (source_queue, pattern_id, failure_reason, status, count) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (source_queue, pattern_id, failure_reason, status) "
                f"DO UPDATE SET count = {table}.count + excluded.count",
                [queue, pattern_id, reason, status, delta],
            )


def reopen_patterns(*, pattern_ids: list[int], now: dt.datetime) -> None:
    """A resolved pattern that receives a new dead letter is open again, and its history says so."""
    reopened = list(
        FailurePattern.objects.select_for_update()
        .filter(pk__in=pattern_ids, status=PatternStatus.RESOLVED)
        .values_list("pk", flat=True)
    )
    if not reopened:
        return
    FailurePattern.objects.filter(pk__in=reopened).update(status=PatternStatus.OPEN, status_changed_at=now)
    PatternEvent.objects.bulk_create(
        PatternEvent(
            pattern_id=pattern_id,
            kind=PatternEvent.Kind.REOPENED,
            from_status=PatternStatus.RESOLVED,
            to_status=PatternStatus.OPEN,
            detail="A new dead letter arrived.",
            created_at=now,
        )
        for pattern_id in reopened
    )
