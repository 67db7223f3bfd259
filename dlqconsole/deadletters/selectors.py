"""Reads of dead letters for the pages: queue summaries, arrivals, pattern trends, and what the counters can tell
of a filter.

Counts come from the counters (DeadLetterCount, FailurePattern.total_count, ArrivalCount, PatternArrivalCount),
never from COUNT(*) over the dead letters. The only reads of dead letters here are single-row index probes (oldest
and newest parked per queue).
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.filters import broker_ids as named_broker_ids
from dlqconsole.deadletters.models import (
    ArrivalCount,
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    PatternArrivalCount,
)

# Statuses whose dead letters are still to be dealt with (they are what "parked" means on the dashboard).
WAITING = (DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED)
ALL_STATUSES = tuple(DeadLetterStatus.values)


@dataclass
class QueueSummary:
    """One source queue of one broker: `orders.dlq` on two brokers is two summaries."""

    queue: str
    parked: int
    scheduled: int
    oldest_at: dt.datetime | None = None
    newest_at: dt.datetime | None = None
    broker_id: int = 0
    broker: str = DEFAULT


@dataclass
class PatternSummary:
    pattern: FailurePattern
    parked: int
    queues: list[str] = field(default_factory=list)
    trend: list[int] = field(default_factory=list)


@contextmanager
def time_limit(*, milliseconds: int) -> Iterator[None]:
    """Run the block in a transaction that PostgreSQL cancels after `milliseconds` (an OperationalError); a
    no-op elsewhere. For reads that may scan (text searches), so a page cannot hold the database for minutes."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [f"{int(milliseconds)}ms"])
        yield


def broker_names() -> dict[int, str]:
    """Every broker's name by id, in name order (a few rows), disabled ones too (their dead letters are still
    shown): pages name a queue's broker where there are several, and leave it out where there is one."""
    registry.sync_environment()
    return dict(Broker.objects.order_by("name").values_list("pk", "name"))


def queue_label(queue: str, broker: str, *, several: bool) -> str:
    """A queue as a list of queues names it: with its broker where there are several ("orders.dlq on staging")."""
    return f"{queue} on {broker}" if several else queue


def queue_summaries(*, broker_ids: list[int] | None = None) -> list[QueueSummary]:
    """Dead letters waiting per broker and source queue (from the counters), with the age of the oldest and newest
    parked one (two index probes per queue on (source_queue, status, -id), kept to the queue's broker). Only the
    brokers named, when given."""
    totals: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = DeadLetterCount.objects.filter(status__in=WAITING, count__gt=0)
    if broker_ids is not None:
        rows = rows.filter(broker_id__in=broker_ids)
    for broker_id, queue, status, total in (
        rows.values_list("broker_id", "source_queue", "status").annotate(total=Sum("count")).order_by()
    ):
        totals[(broker_id or 0, queue)][status] += int(total or 0)
    names = broker_names()
    summaries = [
        QueueSummary(
            queue=queue,
            parked=counts[DeadLetterStatus.PARKED],
            scheduled=counts[DeadLetterStatus.SCHEDULED] + counts[DeadLetterStatus.FAILED],
            broker_id=broker_id,
            broker=names.get(broker_id, DEFAULT),
        )
        for (broker_id, queue), counts in totals.items()
    ]
    probed = [summary for summary in summaries if summary.parked]
    if probed:
        # Every probe in one statement: one round trip, however many queues.
        with connection.cursor() as cursor:
            moments = _scalars(
                cursor,
                [
                    DeadLetter.objects.filter(
                        source_queue=summary.queue, broker_id=summary.broker_id, status=DeadLetterStatus.PARKED
                    )
                    .order_by(order)
                    .values("ingested_at")[:1]
                    for summary in probed
                    for order in ("id", "-id")
                ],
            )
        for index, summary in enumerate(probed):
            summary.oldest_at, summary.newest_at = moments[2 * index], moments[2 * index + 1]
    summaries.sort(key=lambda item: (-item.parked, item.queue, item.broker))
    return summaries


def bucket_starts(*, now: dt.datetime, width: dt.timedelta, buckets: int) -> list[dt.datetime]:
    """Starts of `buckets` consecutive buckets of `width`, aligned to the width, the last one holding now."""
    seconds = int(width.total_seconds())
    aligned = dt.datetime.fromtimestamp(int(now.timestamp()) // seconds * seconds, tz=dt.UTC)
    return [aligned - width * (buckets - 1 - index) for index in range(buckets)]


def _scalars(cursor: Any, querysets: list[Any]) -> list[Any]:
    """Run single-value querysets as the columns of one SELECT (one round trip for many index probes)."""
    if not querysets:
        return []
    parts = []
    params: list[Any] = []
    for queryset in querysets:
        sql, query_params = queryset.query.sql_with_params()
        parts.append(f"({sql})")
        params.extend(query_params)
    cursor.execute("SELECT " + ", ".join(parts), params)
    row = cursor.fetchone()
    converter = DeadLetter._meta.get_field("ingested_at")
    return [_as_value(value, converter) for value in row]


def _as_value(value: Any, field: Any) -> Any:
    # SQLite hands timestamps back naive (or as text), in UTC; PostgreSQL aware; ids are ints on both.
    if isinstance(value, str):
        value = field.to_python(value)
    if isinstance(value, dt.datetime) and timezone.is_naive(value):
        return value.replace(tzinfo=dt.UTC)
    return value


def arrivals(
    *,
    now: dt.datetime | None = None,
    width: dt.timedelta,
    buckets: int,
    broker_ids: list[int] | None = None,
) -> list[tuple[dt.datetime, int]]:
    """How many dead letters arrived in each bucket, from the per-minute arrival counts (ArrivalCount).

    Every arrival counts, whatever became of it since (replayed, archived, purged): the counts are events that
    ingest recorded, not the rows that are left. `width` is a whole number of minutes, so every minute falls in
    one bucket. The last bucket is open-ended: a consumer whose clock runs a little ahead is counted in it. Each
    arrival is counted once, in its own broker's row: the same queue name on two brokers is added up, never merged.
    Only the brokers named, when given.
    """
    if width <= dt.timedelta(0) or width % dt.timedelta(minutes=1):
        raise ValueError("arrival buckets are a whole number of minutes wide")
    starts = bucket_starts(now=now or timezone.now(), width=width, buckets=buckets)
    counts = [0] * buckets
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(ArrivalCount._meta.db_table)
        # width_bucket finds each minute's bucket by binary search over the starts (1 = the first bucket; a minute
        # past the last start is in the last one): one row per bucket comes back, not one per minute.
        only = "" if broker_ids is None else " AND broker_id = ANY(%s)"
        params: list[Any] = [starts, starts[0]]
        if broker_ids is not None:
            params.append(list(broker_ids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT width_bucket(minute, %s::timestamptz[]), sum(count) FROM {table} "
                f"WHERE minute >= %s{only} GROUP BY 1",
                params,
            )
            for bucket, total in cursor.fetchall():
                counts[bucket - 1] += int(total)
        return list(zip(starts, counts, strict=True))
    # One row per minute of the window (the queues summed by the database).
    counted = ArrivalCount.objects.filter(minute__gte=starts[0])
    if broker_ids is not None:
        counted = counted.filter(broker_id__in=broker_ids)
    per_minute = counted.values_list("minute").annotate(total=Sum("count")).order_by()
    for minute, total in per_minute:
        index = min(bisect_right(starts, _as_value(minute, ArrivalCount._meta.get_field("minute"))) - 1, buckets - 1)
        counts[index] += int(total or 0)
    return list(zip(starts, counts, strict=True))


def pattern_trends(
    *,
    pattern_ids: list[int],
    now: dt.datetime | None = None,
    width: dt.timedelta,
    buckets: int,
) -> dict[int, list[int]]:
    """Arrivals per pattern and bucket (oldest first), for sparklines, from the hourly arrival counts
    (PatternArrivalCount): every arrival counts, whatever became of it since (purged included), in the pattern
    that holds it now. `width` is a whole number of hours; the last bucket is open-ended, like `arrivals`."""
    if width <= dt.timedelta(0) or width % dt.timedelta(hours=1):
        raise ValueError("pattern trend buckets are a whole number of hours wide")
    if not pattern_ids:
        return {}
    starts = bucket_starts(now=now or timezone.now(), width=width, buckets=buckets)
    trends = {pattern_id: [0] * buckets for pattern_id in pattern_ids}
    field = PatternArrivalCount._meta.get_field("hour")
    rows = PatternArrivalCount.objects.filter(pattern_id__in=pattern_ids, hour__gte=starts[0]).values_list(
        "pattern_id", "hour", "count"
    )
    for pattern_id, hour, count in rows:
        index = min(bisect_right(starts, _as_value(hour, field)) - 1, buckets - 1)
        trends[pattern_id][index] += max(int(count), 0)
    return trends


def waiting_by_pattern(
    pattern_ids: list[int] | None = None, *, broker_ids: list[int] | None = None
) -> tuple[dict[int, int], dict[int, list[str]]]:
    """Dead letters waiting per pattern, and the queues they wait in (each named with its broker where there are
    several), from the counters. Only the brokers named, when given."""
    cells = DeadLetterCount.objects.filter(status__in=WAITING, count__gt=0)
    if pattern_ids is not None:
        cells = cells.filter(pattern_id__in=pattern_ids)
    if broker_ids is not None:
        cells = cells.filter(broker_id__in=broker_ids)
    counts: dict[int, int] = defaultdict(int)
    queues: dict[int, set[tuple[str, str]]] = defaultdict(set)
    names = broker_names()
    for pattern_id, broker_id, queue, count in cells.values_list("pattern_id", "broker_id", "source_queue", "count"):
        counts[pattern_id] += count
        queues[pattern_id].add((queue, names.get(broker_id or 0, DEFAULT)))
    several = len(names) > 1
    return dict(counts), {
        pattern_id: [queue_label(queue, broker, several=several) for queue, broker in sorted(pairs)]
        for pattern_id, pairs in queues.items()
    }


def top_patterns(
    *, limit: int = 10, now: dt.datetime | None = None, broker_ids: list[int] | None = None
) -> list[PatternSummary]:
    """The patterns with the most dead letters waiting (on the brokers named, when given), with a 24-hour trend
    (of every broker: the hourly arrival counts are per pattern)."""
    counts, queues = waiting_by_pattern(broker_ids=broker_ids)
    top = sorted(counts, key=lambda pattern_id: -counts[pattern_id])[:limit]
    patterns = FailurePattern.objects.in_bulk(top)
    trends = pattern_trends(pattern_ids=top, now=now, width=dt.timedelta(hours=1), buckets=24)
    return [
        PatternSummary(
            pattern=patterns[pattern_id],
            parked=counts[pattern_id],
            queues=queues.get(pattern_id, []),
            trend=trends.get(pattern_id, []),
        )
        for pattern_id in top
        if pattern_id in patterns
    ]


def counted_matches(chosen: DeadLetterFilter) -> int | None:
    """How many dead letters the counters hold for the filter's broker, queue, pattern, reason and status parts, or
    None when the filter names none of queue, pattern and reason (then only a query can tell).

    The other parts of a filter only narrow it further, so 0 here means the filter matches nothing. The messages
    page uses that to skip a query that would otherwise scan the whole table for combinations that never occur
    (the planner cannot know that a queue and a reason exclude each other). Queue names are matched as source
    queues: a dead-letter queue drained by the console is not also the original queue of other dead letters.
    """
    if not (chosen.queue or chosen.pattern or chosen.reason):
        return None
    cells = _counted_cells(chosen)
    if chosen.queue:
        known = set(
            _of_brokers(DeadLetterCount.objects.filter(source_queue__in=chosen.queue), chosen).values_list(
                "source_queue", flat=True
            )
        )
        if known != set(chosen.queue):
            # A name the counters do not know may be an original queue: only the query can answer.
            return None
        cells = cells.filter(source_queue__in=chosen.queue)
    if chosen.pattern:
        cells = cells.filter(pattern_id__in=chosen.pattern)
    if chosen.reason:
        cells = cells.filter(failure_reason__in=chosen.reason)
    return int(cells.aggregate(total=Sum("count"))["total"] or 0)


def counted_total(chosen: DeadLetterFilter) -> int | None:
    """The exact number of dead letters a filter matches, from the counters, when it names only counted fields
    (broker, queue, pattern, reason, status; nothing at all counts too); None when only a query could tell."""
    if not set(chosen.to_dict()) <= {"broker", "queue", "pattern", "reason", "status"}:
        return None
    if chosen.queue or chosen.pattern or chosen.reason:
        return counted_matches(chosen)
    return int(_counted_cells(chosen).aggregate(total=Sum("count"))["total"] or 0)


def _counted_cells(chosen: DeadLetterFilter) -> QuerySet[DeadLetterCount]:
    """The counter cells of the filter's brokers and statuses; without a status filter, archived dead letters are
    left out (as DeadLetterFilter.apply hides them)."""
    cells = DeadLetterCount.objects.filter(count__gt=0)
    cells = cells.filter(status__in=chosen.status) if chosen.status else cells.exclude(status="archived")
    return _of_brokers(cells, chosen)


def _of_brokers(cells: QuerySet[DeadLetterCount], chosen: DeadLetterFilter) -> QuerySet[DeadLetterCount]:
    return cells.filter(broker_id__in=named_broker_ids(chosen.broker)) if chosen.broker else cells


def ancestors(dead_letter: DeadLetter, *, columns: tuple[str, ...] = (), limit: int = 20) -> list[DeadLetter]:
    """The records this one was replayed from, nearest first: a bounded walk (links only point back, and a loop is
    cut where it closes). `columns` loads only those of each record (its link to the one before always)."""
    chain: list[DeadLetter] = []
    seen = {dead_letter.pk}
    previous_id = dead_letter.previous_id
    while previous_id is not None and previous_id not in seen and len(chain) < limit:
        found = DeadLetter.objects.filter(pk=previous_id)
        row = (found.only(*columns, "previous_id") if columns else found).first()
        if row is None:
            break
        chain.append(row)
        seen.add(row.pk)
        previous_id = row.previous_id
    return chain
