"""The counters of this app's tables, kept exact by whoever writes dead letters: ingest, operations, pattern moves.

- DeadLetterCount: dead letters per (broker, source queue, pattern, failure reason, status). Pages, alerts and
  metrics read it instead of counting dead letters.
- FailurePattern.total_count and last_seen_at, and the reopening of a resolved pattern that receives a new dead
  letter (with its PatternEvent).
- PatternArrivalCount (per pattern and hour) and ArrivalCount (per broker, source queue and minute): every arrival, for
  the sparklines and the arrival charts, whatever became of the dead letter since.

Each write sorts its rows, so that concurrent writers lock the rows of a table in the same order. An ingest batch
takes all its locks in a fixed order, so that two batches cannot deadlock (dlqconsole.ingest.services);
count_arrivals takes its middle part: counter cells, then patterns by id, then their hourly arrival counts by
pattern id, then arrival counts by queue.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django.db import connection
from django.utils import timezone

from dlqconsole.core.database import ROWS_PER_STATEMENT, binding_cursor
from dlqconsole.deadletters.models import (
    ARRIVAL_COUNT_RETENTION,
    ArrivalCount,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    PatternArrivalCount,
    PatternEvent,
    PatternStatus,
)


def count_arrivals(arrivals: Sequence[tuple[int, str, int, str]], *, now: dt.datetime) -> None:
    """Count newly stored dead letters, each given as (broker id, source queue, pattern id, failure reason): the
    parked cells,
        their patterns' totals and last-seen times (a resolved pattern reopens), the patterns' hourly arrivals and the
        queues' arrivals of the minute, locked in that order (see the module docstring). Call it in the transaction that
    stores them."""
    if not arrivals:
        return
    cells: Counter[tuple[int, str, int, str]] = Counter()
    per_pattern: Counter[int] = Counter()
    per_queue: Counter[tuple[int, str]] = Counter()
    for broker_id, queue, pattern_id, reason in arrivals:
        cells[(broker_id, queue, pattern_id, reason)] += 1
        per_pattern[pattern_id] += 1
        per_queue[(broker_id, queue)] += 1
    add_counts([(*cell, DeadLetterStatus.PARKED, n) for cell, n in cells.items()])
    ids = sorted(per_pattern)
    table = FailurePattern._meta.db_table
    if connection.vendor == "postgresql":
        with binding_cursor() as cursor:
            # Lock the patterns in id order first: the UPDATE's join would lock them in whatever order its plan
            # reads them. NO KEY UPDATE is the lock the UPDATE takes anyway, and it does not block the foreign-key
            # checks (KEY SHARE) that a concurrent batch's new dead letters make on these patterns at commit.
            cursor.execute(f"SELECT id, status FROM {table} WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", [ids])
            statuses = dict(cursor.fetchall())
            cursor.execute(
                # greatest(): two batches commit in either order, and "last seen" must not step back.
                f"UPDATE {table} AS pattern SET total_count = pattern.total_count + arrival.n, "
                "last_seen_at = greatest(pattern.last_seen_at, %s) "
                "FROM unnest(%s::bigint[], %s::bigint[]) AS arrival(id, n) WHERE pattern.id = arrival.id",
                [now, ids, [per_pattern[pattern_id] for pattern_id in ids]],
            )
    else:
        statuses = dict(FailurePattern.objects.filter(pk__in=ids).values_list("pk", "status"))
        with connection.cursor() as cursor:
            for start in range(0, len(ids), ROWS_PER_STATEMENT):
                chunk = ids[start : start + ROWS_PER_STATEMENT]
                cases = " ".join(["WHEN %s THEN %s"] * len(chunk))
                cursor.execute(
                    f"UPDATE {table} SET total_count = total_count + CASE id {cases} ELSE 0 END, last_seen_at = %s "
                    f"WHERE id IN ({', '.join(['%s'] * len(chunk))})",
                    [value for pattern_id in chunk for value in (pattern_id, per_pattern[pattern_id])] + [now, *chunk],
                )
    _reopen(sorted(pk for pk, status in statuses.items() if status == PatternStatus.RESOLVED), now=now)
    hour = arrival_hour(now)
    add_pattern_arrivals([(pattern_id, hour, per_pattern[pattern_id]) for pattern_id in ids])
    # Late in the batch: every batch of a queue writes the same row in a minute, and holds it until it commits.
    _add_arrivals(per_queue, now=now)


def arrival_minute(moment: dt.datetime) -> dt.datetime:
    """The start of the minute (UTC) that holds `moment`: the key of its ArrivalCount row."""
    return dt.datetime.fromtimestamp(int(moment.timestamp()) // 60 * 60, tz=dt.UTC)


def arrival_hour(moment: dt.datetime) -> dt.datetime:
    """The start of the hour (UTC) that holds `moment`: the key of its PatternArrivalCount rows."""
    return dt.datetime.fromtimestamp(int(moment.timestamp()) // 3600 * 3600, tz=dt.UTC)


def add_pattern_arrivals(changes: Sequence[tuple[int, dt.datetime, int]]) -> None:
    """Add (pattern id, hour, delta) to the patterns' hourly arrival counts, creating rows as needed: one upsert
    (a few on SQLite), rows in (pattern, hour) order so that concurrent writers lock them in the same order.
    Hours past ARRIVAL_COUNT_RETENTION are left out: their rows are pruned, and nothing reads them."""
    cutoff = arrival_hour(timezone.now() - ARRIVAL_COUNT_RETENTION)
    merged: Counter[tuple[int, dt.datetime]] = Counter()
    for pattern_id, hour, delta in changes:
        if hour >= cutoff:
            merged[(pattern_id, hour)] += delta
    rows = sorted((key, delta) for key, delta in merged.items() if delta != 0)
    if not rows:
        return
    table = PatternArrivalCount._meta.db_table
    upsert = f" ON CONFLICT (pattern_id, hour) DO UPDATE SET count = {table}.count + excluded.count"
    if connection.vendor == "postgresql":
        with binding_cursor() as binding:
            binding.execute(
                f"INSERT INTO {table} (pattern_id, hour, count) SELECT * FROM "
                "unnest(%s::bigint[], %s::timestamptz[], %s::bigint[]) ORDER BY 1, 2" + upsert,
                [[key[0] for key, _ in rows], [key[1] for key, _ in rows], [delta for _, delta in rows]],
            )
        return
    field = PatternArrivalCount._meta.get_field("hour")
    _upsert_values(
        table,
        ("pattern_id", "hour", "count"),
        [(pattern_id, field.get_db_prep_save(hour, connection), delta) for (pattern_id, hour), delta in rows],
        upsert,
    )


def _upsert_values(table: str, columns: tuple[str, ...], rows: Sequence[tuple[Any, ...]], upsert: str) -> None:
    """INSERT ... VALUES with `upsert`, a few hundred rows a statement, for databases without unnest (SQLite)."""
    values = "(" + ", ".join(["%s"] * len(columns)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES " + ", ".join([values] * len(chunk)) + upsert,
                [value for row in chunk for value in row],
            )


def transfer_pattern_arrivals(*, source_id: int, target_id: int) -> None:
    """Move every hourly arrival count of pattern `source_id` to `target_id` (a merge): the arrivals of dead
    letters purged since go with them."""
    counts = list(PatternArrivalCount.objects.filter(pattern_id=source_id).values_list("hour", "count"))
    add_pattern_arrivals([(target_id, hour, count) for hour, count in counts])
    PatternArrivalCount.objects.filter(pattern_id=source_id).delete()


def _add_arrivals(per_queue: Counter[tuple[int, str]], *, now: dt.datetime) -> None:
    """Add the batch's newly stored dead letters to the arrival counts of its minute, per broker and source queue:
    one upsert. Rows in key order, so concurrent batches lock the same minute's rows in the same order."""
    queues = sorted(per_queue)
    minute = arrival_minute(now)
    table = ArrivalCount._meta.db_table
    upsert = f" ON CONFLICT (minute, broker_id, source_queue) DO UPDATE SET count = {table}.count + excluded.count"
    if connection.vendor == "postgresql":
        with binding_cursor() as binding:
            binding.execute(
                f"INSERT INTO {table} (minute, broker_id, source_queue, count) "
                "SELECT %s, arrival.broker, arrival.queue, arrival.n "
                "FROM unnest(%s::bigint[], %s::varchar[], %s::bigint[]) AS arrival(broker, queue, n) "
                "ORDER BY arrival.broker, arrival.queue" + upsert,
                [minute, [key[0] for key in queues], [key[1] for key in queues], [per_queue[key] for key in queues]],
            )
        return
    stamp = ArrivalCount._meta.get_field("minute").get_db_prep_save(minute, connection)
    _upsert_values(
        table,
        ("minute", "broker_id", "source_queue", "count"),
        [(stamp, *key, per_queue[key]) for key in queues],
        upsert,
    )


def prune_arrival_counts(*, now: dt.datetime | None = None) -> int:
    """Delete arrival counts, per queue and minute and per pattern and hour, older than ARRIVAL_COUNT_RETENTION (no
    chart reads them); returns how many. Ingest only ever writes the current minute and hour, and moves between
    patterns leave out hours past the retention, so this never meets a batch's row lock."""
    cutoff = arrival_minute((now or timezone.now()) - ARRIVAL_COUNT_RETENTION)
    deleted, _ = ArrivalCount.objects.filter(minute__lt=cutoff).delete()
    pattern_deleted, _ = PatternArrivalCount.objects.filter(hour__lt=arrival_hour(cutoff)).delete()
    return deleted + pattern_deleted


def add_counts(changes: list[tuple[int, str, int, str, str, int]]) -> None:
    """Add (broker id, queue, pattern id, reason, status, delta) to the counters, creating cells as needed.

    One statement per few hundred cells, rows sorted so that concurrent writers lock the cells in the same
    order and cannot deadlock. Deltas for the same cell are summed first (one statement cannot update a row
    twice)."""
    merged: Counter[tuple[int, str, int, str, str]] = Counter()
    for broker_id, queue, pattern_id, reason, status, delta in changes:
        merged[(broker_id, queue, pattern_id, str(reason), str(status))] += delta
    cells = sorted((cell, delta) for cell, delta in merged.items() if delta != 0)
    if not cells:
        return
    table = DeadLetterCount._meta.db_table
    upsert = (
        " ON CONFLICT (broker_id, source_queue, pattern_id, failure_reason, status) "
        f"DO UPDATE SET count = {table}.count + excluded.count"
    )
    if connection.vendor == "postgresql":
        with binding_cursor() as binding:
            columns = list(zip(*[(*cell, delta) for cell, delta in cells], strict=True))
            binding.execute(
                f"INSERT INTO {table} (broker_id, source_queue, pattern_id, failure_reason, status, count) "
                "SELECT * FROM unnest(%s::bigint[], %s::varchar[], %s::bigint[], %s::varchar[], %s::varchar[], "
                "%s::bigint[]) ORDER BY 1, 2, 3, 4, 5" + upsert,
                [list(column) for column in columns],
            )
        return
    _upsert_values(
        table,
        ("broker_id", "source_queue", "pattern_id", "failure_reason", "status", "count"),
        [(*cell, delta) for cell, delta in cells],
        upsert,
    )


def reopen_patterns(*, pattern_ids: list[int], now: dt.datetime) -> None:
    """A resolved pattern that receives a new dead letter is open again, and its history says so."""
    reopened = list(
        FailurePattern.objects.select_for_update(no_key=True)
        .filter(pk__in=pattern_ids, status=PatternStatus.RESOLVED)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    _reopen(reopened, now=now)


def _reopen(pattern_ids: list[int], *, now: dt.datetime) -> None:
    if not pattern_ids:
        return
    FailurePattern.objects.filter(pk__in=pattern_ids).update(status=PatternStatus.OPEN, status_changed_at=now)
    PatternEvent.objects.bulk_create(
        PatternEvent(
            pattern_id=pattern_id,
            kind=PatternEvent.Kind.REOPENED,
            from_status=PatternStatus.RESOLVED,
            to_status=PatternStatus.OPEN,
            detail="A new dead letter arrived.",
            created_at=now,
        )
        for pattern_id in pattern_ids
    )


# Operations change the status of dead letters, or delete them: their counts move with them.


COUNTED_FIELDS = ("broker_id", "source_queue", "pattern_id", "failure_reason", "status")


class CountedRow(NamedTuple):
    """The columns of a dead letter that name its counter cell (COUNTED_FIELDS, in this order)."""

    broker_id: int
    source_queue: str
    pattern_id: int
    failure_reason: str
    status: str


def count_status_change(rows: Iterable[CountedRow], *, to_status: str | None) -> None:
    """Move each row's count from its current status to `to_status` (None: the rows are deleted).

    Call it in the transaction that changes the rows, with the statuses they had before the change.
    """
    cells: Counter[tuple[int, str, int, str, str]] = Counter()
    for row in rows:
        if row.status == to_status:
            continue
        cells[(row.broker_id, row.source_queue, row.pattern_id, row.failure_reason, row.status)] -= 1
        if to_status is not None:
            cells[(row.broker_id, row.source_queue, row.pattern_id, row.failure_reason, to_status)] += 1
    add_counts([(*cell, delta) for cell, delta in cells.items()])
