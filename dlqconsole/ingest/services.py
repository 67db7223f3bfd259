"""Write parsed dead letters to the database: idempotent, one transaction per batch, counters kept exact.

Identity: a dead letter's dedupe key is the hash of everything the broker delivered. A delivery the broker marks
redelivered whose hash is stored already is the same dead letter coming back (after a crash between our commit and
our ack) and is counted as a duplicate. A first delivery is never dropped: when its hash is stored already (two
messages identical in every byte, or a copy from at-least-once dead-lettering) it is stored as a further occurrence,
keyed "<hash>:<random>" and linked to the first by identical_to. What stays ambiguous: a redelivered copy whose hash
is stored because an identical message was stored, not this one (identical copies in flight together at a crash);
it is counted as a duplicate.

Concurrency: several consume_dlq processes, and the two writer threads of each, may ingest into the same tables at
once. Inserts are idempotent through DeadLetter.dedupe_key (INSERT ... ON CONFLICT DO NOTHING), so only the
transaction whose row was inserted counts it. Every lock a batch takes is taken in a fixed order (dead letters by
dedupe key, then counter cells, then patterns by id, then their hourly arrival counts by pattern id, then arrival
counts by queue, then ingest stats by queue), so two batches cannot deadlock on each other. The counters are written
by dlqconsole.deadletters.counters.count_arrivals, which takes the middle of that order (counter cells to arrival
counts by queue). Those rows are the same for every batch of a queue, so they are taken last: after the rows are
written and their foreign keys checked (deferred to the commit otherwise), so that a batch holds them only for the
end of its transaction. New fingerprints are filed before the transaction, in one of their own
(grouping.file_ahead): mining locks a cluster row until the transaction that mined it ends.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Left
from django.utils import timezone

from dlqconsole.brokers.models import default_broker_id
from dlqconsole.core.database import ROWS_PER_STATEMENT, binding_cursor
from dlqconsole.deadletters.counters import count_arrivals
from dlqconsole.deadletters.grouping import assign_patterns, file_ahead
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, DeathReason
from dlqconsole.deadletters.search import fallback_name, search_text
from dlqconsole.ingest.boomerangs import report_boomerangs
from dlqconsole.ingest.envelope import ParsedDeadLetter
from dlqconsole.ingest.models import IngestStat, WatchedQueue

# Columns written from each ParsedDeadLetter, in order. Every other column of DeadLetter gets its default.
COLUMNS = (
    "dedupe_key",
    "broker_id",
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
    "body_truncated",
    "parse_errors",
    "fingerprint",
    "search_text",
    "pattern_id",
    "status",
    "status_changed_at",
    "replay_count",
    "retry_exhausted",
    "previous_id",
    "identical_to_id",
)


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int

    @property
    def duplicates(self) -> int:
        return self.received - self.inserted


def ingest_batch(*, letters: Sequence[ParsedDeadLetter], now: dt.datetime | None = None) -> IngestResult:
    """Store a batch of dead letters in one transaction. A redelivered copy of a stored dead letter is skipped, so
    a batch redelivered after a crash between commit and ack changes nothing but the duplicate counter; a first
    delivery is always stored (see the module docstring).

    Also adds the batch to the per-queue IngestStat totals (received, inserted, duplicates, malformed) in the
    same transaction."""
    if not letters:
        return IngestResult(received=0, inserted=0)
    now = now or timezone.now()
    default = None
    for letter in letters:
        if letter.broker_id is None:
            letter.broker_id = default = default or default_broker_id()
    batch = _keyed(letters)
    # New fingerprints are filed first, in a short transaction: mining them locks their clusters until it commits.
    file_ahead(letters=batch, now=now)
    # PostgreSQL first tries a plain COPY, which fails as a whole when any key is stored already. Elsewhere (SQLite)
    # the stored keys are looked up first: an INSERT ... ON CONFLICT DO NOTHING alone would drop a first delivery.
    try:
        inserted = _store(letters, batch, now=now, direct=connection.vendor == "postgresql")
    except _KeyTaken:
        # Some of these dead letters are stored already (redelivered after a crash, identical to a stored one, or
        # written by a concurrent consumer): do the batch again the slower way that looks first.
        inserted = _store(letters, batch, now=now, direct=False)
    if any(letter.replayed_from for letter in inserted):
        # Boomerangs count against their destination's circuit breaker once they are stored for good.
        transaction.on_commit(functools.partial(report_boomerangs, inserted))
    return IngestResult(received=len(letters), inserted=len(inserted))


def _keyed(letters: Sequence[ParsedDeadLetter]) -> list[ParsedDeadLetter]:
    """The batch with each letter keyed by its content hash, and a further letter of the same content keyed apart
    (identical messages in one batch are several dead letters), sorted by key so that concurrent batches wait for
    each other's keys in the same order. Keys are set afresh: a batch written again after a database error starts
    from its hashes."""
    seen: set[str] = set()
    for letter in letters:
        letter.dedupe_key = letter.content_hash
        letter.identical_to = None
        if letter.dedupe_key in seen:
            letter.dedupe_key = _occurrence_key(letter)
        seen.add(letter.content_hash)
    return sorted(letters, key=lambda letter: letter.dedupe_key)


def _occurrence_key(letter: ParsedDeadLetter) -> str:
    return f"{letter.content_hash}:{secrets.token_hex(6)}"


def _settled(batch: list[ParsedDeadLetter]) -> list[ParsedDeadLetter]:
    """The batch without redelivered copies of stored dead letters, and with first deliveries of stored content
    made further occurrences of it."""
    stored = _stored_ids({letter.content_hash for letter in batch})
    kept = []
    for letter in batch:
        first = stored.get(letter.content_hash)
        if first is None:
            kept.append(letter)
        elif not letter.redelivered:
            if letter.dedupe_key == letter.content_hash:
                letter.dedupe_key = _occurrence_key(letter)
            letter.identical_to = first
            kept.append(letter)
    return sorted(kept, key=lambda letter: letter.dedupe_key)


def _stored_ids(hashes: set[str]) -> dict[str, int]:
    return dict(DeadLetter.objects.filter(dedupe_key__in=sorted(hashes)).values_list("dedupe_key", "pk"))


def _count_delivery_limit_attempts(letters: Sequence[ParsedDeadLetter]) -> None:
    """A quorum queue's delivery-limit death carries x-death count 1 and no x-delivery-count (RabbitMQ 3.10 to
    3.13), so the envelope sees one attempt. The message was delivered limit + 1 times: take the limit from the
    watched queue's arguments. One query, and only for batches that hold such deaths."""
    queues = {letter.original_queue for letter in letters if letter.death_reason == DeathReason.DELIVERY_LIMIT}
    if not queues:
        return
    limits = {
        (broker_id, name): arguments.get("x-delivery-limit")
        for broker_id, name, arguments in WatchedQueue.objects.filter(name__in=queues).values_list(
            "broker_id", "name", "arguments"
        )
    }
    for letter in letters:
        limit = (
            limits.get((letter.broker_id or 0, letter.original_queue))
            if letter.death_reason == DeathReason.DELIVERY_LIMIT
            else None
        )
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < 2**31 - 1:
            letter.attempt_count = max(letter.attempt_count, limit + 1)


class _KeyTaken(Exception):
    """A direct COPY met a dedupe key that is stored already."""


def _store(
    letters: Sequence[ParsedDeadLetter], batch: list[ParsedDeadLetter], *, now: dt.datetime, direct: bool
) -> list[ParsedDeadLetter]:
    with transaction.atomic():
        _count_delivery_limit_attempts(batch)
        if not direct:
            batch = _settled(batch)
        pattern_ids = assign_patterns(letters=batch, now=now)
        inserted_keys = _write(batch, pattern_ids=pattern_ids, now=now, direct=direct)
        if not direct:
            # A first delivery whose key a concurrent consumer stored meanwhile (the same content on two consumers)
            # is a further occurrence of it; a random key does not meet another.
            missed = [letter for letter in batch if letter.dedupe_key not in inserted_keys and not letter.redelivered]
            if missed:
                stored = _stored_ids({letter.content_hash for letter in missed})
                for letter in missed:
                    letter.dedupe_key = _occurrence_key(letter)
                    letter.identical_to = stored.get(letter.content_hash)
                inserted_keys |= _write(missed, pattern_ids=pattern_ids, now=now, direct=False)
        inserted = [letter for letter in batch if letter.dedupe_key in inserted_keys]
        _link_copies_in_batch(inserted)
        _check_foreign_keys()
        count_arrivals(
            [(*_queue_of(letter), pattern_ids[letter.fingerprint], letter.failure_reason) for letter in inserted],
            now=now,
        )
        _add_stats(letters, inserted, now=now)
    return inserted


def _write(letters: list[ParsedDeadLetter], *, pattern_ids: dict[str, int], now: dt.datetime, direct: bool) -> set[str]:
    """Insert the rows; the keys inserted (a direct COPY inserts all or raises _KeyTaken)."""
    previous_ids = _replayed_from(letters)
    if connection.vendor != "postgresql":
        return _insert(letters, pattern_ids=pattern_ids, previous_ids=previous_ids, now=now)
    if direct:
        return _copy_new(letters, pattern_ids=pattern_ids, previous_ids=previous_ids, now=now)
    return _copy_insert(letters, pattern_ids=pattern_ids, previous_ids=previous_ids, now=now)


def _check_foreign_keys() -> None:
    """Check the new rows' foreign keys now (PostgreSQL defers them to the commit), before the counters lock the
    rows that every concurrent batch writes: at the commit they would be checked while those locks are held."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        # Django creates every foreign key INITIALLY DEFERRED: back to that for the rest of the transaction.
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def _link_copies_in_batch(inserted: list[ParsedDeadLetter]) -> None:
    """Link the further occurrences whose first one came in the same batch (their id was not known before)."""
    keys = [letter.dedupe_key for letter in inserted if letter.identical_to is None and ":" in letter.dedupe_key]
    if keys:
        first = DeadLetter.objects.filter(dedupe_key=Left(OuterRef("dedupe_key"), 64)).values("pk")[:1]
        DeadLetter.objects.filter(dedupe_key__in=keys).update(identical_to_id=Subquery(first))


def _row(
    letter: ParsedDeadLetter, *, pattern_ids: dict[str, int], previous_ids: dict[str, int], now: dt.datetime
) -> tuple[Any, ...]:
    """One row in COLUMNS order, JSON columns as JSON text."""
    return (
        letter.dedupe_key,
        letter.broker_id,
        letter.source_queue,
        letter.original_queue,
        letter.original_exchange,
        json.dumps(letter.original_routing_keys),
        letter.death_reason,
        letter.failure_reason,
        letter.transient,
        letter.error_type,
        letter.error_message,
        letter.stack_trace,
        letter.attempt_count,
        letter.first_failed_at,
        letter.last_failed_at,
        now,
        letter.host,
        letter.app_version,
        letter.message_id,
        letter.correlation_id,
        letter.priority,
        letter.content_type,
        letter.content_encoding,
        letter.task_name,
        letter.task_id,
        letter.task_retries,
        letter.headers_json or json.dumps(letter.headers),
        letter.properties_json or json.dumps(letter.properties),
        json.dumps(letter.x_death),
        letter.body,
        max(letter.body_size, len(letter.body)),
        letter.body_truncated,
        json.dumps(letter.parse_errors) if letter.parse_errors else "[]",
        letter.fingerprint,
        search_text(letter.error_type, letter.error_message, letter.body, fallback=fallback_name(letter)),
        pattern_ids[letter.fingerprint],
        DeadLetterStatus.PARKED.value,
        now,
        letter.replay_count,
        False,
        previous_ids.get(letter.dedupe_key),
        letter.identical_to,
    )


def _other_columns() -> list[tuple[str, Any]]:
    """(column, default) of DeadLetter columns ingest does not fill itself, so a field added to the model
    later gets its default rather than a NOT NULL violation here."""
    written = set(COLUMNS)
    return [
        (str(model_field.column), model_field.get_db_prep_save(model_field.get_default(), connection))
        for model_field in DeadLetter._meta.concrete_fields
        if model_field.attname not in written and not model_field.primary_key
    ]


def _copy_new(
    letters: list[ParsedDeadLetter], *, pattern_ids: dict[str, int], previous_ids: dict[str, int], now: dt.datetime
) -> set[str]:
    """PostgreSQL, the common case: COPY the rows straight into the table, the cheapest way in. A dedupe key
    that exists already (a redelivery, or a concurrent consumer's batch) makes the COPY fail with a unique
    violation: _KeyTaken, and the caller does the batch again with _copy_insert, which skips what exists.
    Redeliveries come in bursts after a crash, so paying twice for those batches costs less than looking up
    every batch's keys first."""
    table = DeadLetter._meta.db_table
    fields = {model_field.attname: model_field for model_field in DeadLetter._meta.concrete_fields}
    others = _other_columns()
    column_sql = ", ".join([str(fields[name].column) for name in COLUMNS] + [column for column, _ in others])
    extra = tuple(value for _, value in others)
    with binding_cursor() as cursor:
        try:
            with cursor.copy(f"COPY {table} ({column_sql}) FROM STDIN") as copy:
                for letter in letters:
                    copy.write_row(_row(letter, pattern_ids=pattern_ids, previous_ids=previous_ids, now=now) + extra)
        except psycopg.errors.UniqueViolation as error:
            raise _KeyTaken from error
    return {letter.dedupe_key for letter in letters}


def _copy_insert(
    letters: list[ParsedDeadLetter], *, pattern_ids: dict[str, int], previous_ids: dict[str, int], now: dt.datetime
) -> set[str]:
    """PostgreSQL, when keys collide with a concurrent batch: COPY the rows into a session-local staging
    table, then move them in one INSERT ... SELECT ... ON CONFLICT DO NOTHING, which waits for the other
    transaction and skips what it committed."""
    fields = {model_field.attname: model_field for model_field in DeadLetter._meta.concrete_fields}
    others = _other_columns()
    columns = [str(fields[name].column) for name in COLUMNS] + [column for column, _ in others]
    column_sql = ", ".join(columns)
    table = DeadLetter._meta.db_table
    # The staging table's name follows its columns, so a consumer still running across a migration that
    # changed them does not copy into a stale shape.
    stage = "dlq_ingest_stage_" + hashlib.sha1(column_sql.encode(), usedforsecurity=False).hexdigest()[:12]
    extra = tuple(value for _, value in others)
    with connection.cursor() as cursor, connection.wrap_database_errors:
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS "
            f"SELECT {column_sql} FROM {table} WITH NO DATA"
        )
        # Normally empty (ON COMMIT DELETE ROWS); not so when one transaction ingests two batches.
        cursor.execute(f"DELETE FROM {stage}")
        raw = cursor.cursor
        with raw.copy(f"COPY {stage} ({column_sql}) FROM STDIN") as copy:
            for letter in letters:
                copy.write_row(_row(letter, pattern_ids=pattern_ids, previous_ids=previous_ids, now=now) + extra)
        cursor.execute(
            f"INSERT INTO {table} ({column_sql}) SELECT {column_sql} FROM {stage} ORDER BY dedupe_key "
            "ON CONFLICT (dedupe_key) DO NOTHING RETURNING dedupe_key"
        )
        inserted = {str(row[0]) for row in cursor.fetchall()}
    return inserted


def _insert(
    letters: list[ParsedDeadLetter], *, pattern_ids: dict[str, int], previous_ids: dict[str, int], now: dt.datetime
) -> set[str]:
    """Any other database (SQLite): multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING, values prepared by
    the model fields so that the backend's own conversions apply."""
    fields = {model_field.attname: model_field for model_field in DeadLetter._meta.concrete_fields}
    others = _other_columns()
    table = DeadLetter._meta.db_table
    column_sql = ", ".join([str(fields[name].column) for name in COLUMNS] + [column for column, _ in others])
    row_sql = "(" + ", ".join(["%s"] * (len(COLUMNS) + len(others))) + ")"
    prepare = [fields[name] for name in COLUMNS]
    json_columns = {"original_routing_keys", "headers", "properties", "x_death", "parse_errors"}
    extra = [value for _, value in others]
    inserted: set[str] = set()
    with connection.cursor() as cursor:
        for start in range(0, len(letters), ROWS_PER_STATEMENT):
            chunk = letters[start : start + ROWS_PER_STATEMENT]
            params: list[Any] = []
            for letter in chunk:
                row = _row(letter, pattern_ids=pattern_ids, previous_ids=previous_ids, now=now)
                for model_field, value in zip(prepare, row, strict=True):
                    if model_field.attname in json_columns:
                        # Already JSON text; SQLite stores JSON as text.
                        params.append(value)
                    else:
                        params.append(model_field.get_db_prep_save(value, connection))
                params.extend(extra)
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


def _queue_of(letter: ParsedDeadLetter) -> tuple[int, str]:
    """(broker id, source queue): ingest_batch has given every letter its broker."""
    return letter.broker_id or 0, letter.source_queue


def _add_stats(letters: Sequence[ParsedDeadLetter], inserted: list[ParsedDeadLetter], *, now: dt.datetime) -> None:
    received: Counter[tuple[int, str]] = Counter(_queue_of(letter) for letter in letters)
    stored: Counter[tuple[int, str]] = Counter(_queue_of(letter) for letter in inserted)
    malformed: Counter[tuple[int, str]] = Counter(_queue_of(letter) for letter in inserted if letter.parse_errors)
    table = IngestStat._meta.db_table
    # The batch is about to commit: its last moment, not the one it started at.
    finished = max(now, timezone.now())
    with connection.cursor() as cursor:
        for queue in sorted(received):
            cursor.execute(
                f"INSERT INTO {table} (broker_id, source_queue, received, inserted, duplicates, malformed, batches, "
                "last_batch_at) VALUES (%s, %s, %s, %s, %s, %s, 1, %s) ON CONFLICT (broker_id, source_queue) "
                "DO UPDATE SET "
                f"received = {table}.received + excluded.received, inserted = {table}.inserted + excluded.inserted, "
                f"duplicates = {table}.duplicates + excluded.duplicates, "
                f"malformed = {table}.malformed + excluded.malformed, batches = {table}.batches + 1, "
                # Several consumers write concurrently: keep the latest moment, whichever commits last.
                f"last_batch_at = CASE WHEN {table}.last_batch_at IS NULL "
                f"OR excluded.last_batch_at > {table}.last_batch_at "
                f"THEN excluded.last_batch_at ELSE {table}.last_batch_at END",
                [
                    *queue,
                    received[queue],
                    stored[queue],
                    received[queue] - stored[queue],
                    malformed[queue],
                    IngestStat._meta.get_field("last_batch_at").get_db_prep_save(finished, connection),
                ],
            )
