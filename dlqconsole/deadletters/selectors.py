"""Reads for the pages that span apps: the dashboard, the patterns table, backpressure, alerts, operations.

Counts come from the counters (DeadLetterCount, FailurePattern.total_count), never from COUNT(*) over the dead
letters. The only scans of dead letters here are bounded in time (the arrivals of the last hour or day, through
the (status, ingested_at) index) or are single-row index probes (oldest and newest parked per queue).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

from django.db.models import Count, Q, Sum
from django.utils import timezone

from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
)

# Statuses whose dead letters are still to be dealt with (they are what "parked" means on the dashboard).
WAITING = (DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED)
ALL_STATUSES = tuple(DeadLetterStatus.values)
LEVELS = ("normal", "warning", "critical", "emergency")


@dataclass
class QueueSummary:
    queue: str
    parked: int
    scheduled: int
    oldest_at: dt.datetime | None = None
    newest_at: dt.datetime | None = None


@dataclass
class PatternSummary:
    pattern: FailurePattern
    parked: int
    queues: list[str] = field(default_factory=list)
    trend: list[int] = field(default_factory=list)


@dataclass
class Backpressure:
    queue: str
    depth: int | None
    consumers: int | None
    level: str
    sampled_at: dt.datetime | None
    thresholds: tuple[int, int, int]


def queue_summaries() -> list[QueueSummary]:
    """Dead letters waiting per source queue (from the counters), with the age of the oldest and newest parked
    one (two index probes per queue on (source_queue, status, -id))."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = (
        DeadLetterCount.objects.filter(status__in=WAITING, count__gt=0)
        .values("source_queue", "status")
        .annotate(total=Sum("count"))
    )
    for row in rows:
        totals[row["source_queue"]][row["status"]] += int(row["total"] or 0)
    summaries = []
    for queue in sorted(totals):
        parked = DeadLetter.objects.filter(source_queue=queue, status=DeadLetterStatus.PARKED)
        summary = QueueSummary(
            queue=queue,
            parked=totals[queue][DeadLetterStatus.PARKED],
            scheduled=totals[queue][DeadLetterStatus.SCHEDULED] + totals[queue][DeadLetterStatus.FAILED],
        )
        if summary.parked:
            summary.oldest_at = parked.order_by("id").values_list("ingested_at", flat=True).first()
            summary.newest_at = parked.order_by("-id").values_list("ingested_at", flat=True).first()
        summaries.append(summary)
    summaries.sort(key=lambda item: (-item.parked, item.queue))
    return summaries


def bucket_starts(*, now: dt.datetime, width: dt.timedelta, buckets: int) -> list[dt.datetime]:
    """Starts of `buckets` consecutive buckets of `width`, aligned to the width, the last one holding now."""
    seconds = int(width.total_seconds())
    aligned = dt.datetime.fromtimestamp(int(now.timestamp()) // seconds * seconds, tz=dt.UTC)
    return [aligned - width * (buckets - 1 - index) for index in range(buckets)]


def arrivals(*, now: dt.datetime | None = None, width: dt.timedelta, buckets: int) -> list[tuple[dt.datetime, int]]:
    """How many dead letters arrived in each bucket (every status, so replayed ones still count as arrivals).

    One query over the (status, ingested_at) index, bounded to the window: its cost grows with the arrivals in
    the window, not with the table.
    """
    starts = bucket_starts(now=now or timezone.now(), width=width, buckets=buckets)
    window = DeadLetter.objects.filter(
        status__in=ALL_STATUSES, ingested_at__gte=starts[0], ingested_at__lt=starts[-1] + width
    )
    counts = window.aggregate(
        **{
            f"b{index}": Count("ingested_at", filter=Q(ingested_at__gte=start, ingested_at__lt=start + width))
            for index, start in enumerate(starts)
        }
    )
    return [(start, int(counts[f"b{index}"] or 0)) for index, start in enumerate(starts)]


def pattern_trends(
    *, pattern_ids: list[int], now: dt.datetime | None = None, width: dt.timedelta, buckets: int
) -> dict[int, list[int]]:
    """Arrivals per pattern and bucket (oldest first), for sparklines; bounded to the window like `arrivals`."""
    if not pattern_ids:
        return {}
    starts = bucket_starts(now=now or timezone.now(), width=width, buckets=buckets)
    rows = (
        DeadLetter.objects.filter(
            status__in=ALL_STATUSES,
            ingested_at__gte=starts[0],
            ingested_at__lt=starts[-1] + width,
            pattern_id__in=pattern_ids,
        )
        .values("pattern_id")
        .annotate(
            **{
                f"b{index}": Count("ingested_at", filter=Q(ingested_at__gte=start, ingested_at__lt=start + width))
                for index, start in enumerate(starts)
            }
        )
    )
    trends = {pattern_id: [0] * buckets for pattern_id in pattern_ids}
    for row in rows:
        values = cast(dict[str, Any], row)
        trends[values["pattern_id"]] = [int(values[f"b{index}"] or 0) for index in range(buckets)]
    return trends


def waiting_by_pattern(pattern_ids: list[int] | None = None) -> tuple[dict[int, int], dict[int, list[str]]]:
    """Dead letters waiting per pattern, and the queues they wait in, from the counters."""
    cells = DeadLetterCount.objects.filter(status__in=WAITING, count__gt=0)
    if pattern_ids is not None:
        cells = cells.filter(pattern_id__in=pattern_ids)
    counts: dict[int, int] = defaultdict(int)
    queues: dict[int, set[str]] = defaultdict(set)
    for pattern_id, queue, count in cells.values_list("pattern_id", "source_queue", "count"):
        counts[pattern_id] += count
        queues[pattern_id].add(queue)
    return dict(counts), {pattern_id: sorted(names) for pattern_id, names in queues.items()}


def top_patterns(*, limit: int = 10, now: dt.datetime | None = None) -> list[PatternSummary]:
    """The patterns with the most dead letters waiting, with a 24-hour trend."""
    counts, queues = waiting_by_pattern()
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


def backpressure_level(*, depth: int | None, warning: int, critical: int, emergency: int) -> str:
    if depth is None:
        return "unknown"
    if depth >= emergency:
        return "emergency"
    if depth >= critical:
        return "critical"
    if depth >= warning:
        return "warning"
    return "normal"


def backpressure() -> list[Backpressure]:
    """The latest depth sample of each watched work queue, with its level from the queue's thresholds."""
    from dlqconsole.ingest.models import QueueSample, WatchedQueue

    found = []
    for watched in WatchedQueue.objects.filter(enabled=True).order_by("name"):
        sample = QueueSample.objects.filter(queue=watched.name).order_by("-sampled_at").first()
        depth = sample.messages if sample else None
        found.append(
            Backpressure(
                queue=watched.name,
                depth=depth,
                consumers=sample.consumers if sample else None,
                level=backpressure_level(
                    depth=depth,
                    warning=watched.warning_depth,
                    critical=watched.critical_depth,
                    emergency=watched.emergency_depth,
                ),
                sampled_at=sample.sampled_at if sample else None,
                thresholds=(watched.warning_depth, watched.critical_depth, watched.emergency_depth),
            )
        )
    order = {level: index for index, level in enumerate(reversed(LEVELS))}
    found.sort(key=lambda item: (order.get(item.level, len(LEVELS)), item.queue))
    return found


def firing_alerts(*, limit: int = 20) -> list[Any]:
    """Alerts firing or acknowledged now, the most severe and newest first."""
    from dlqconsole.alerts.models import Alert

    alerts = list(Alert.objects.active().select_related("rule").order_by("-started_at", "-id")[:limit])
    rank = {"emergency": 0, "critical": 1, "warning": 2, "info": 3}
    alerts.sort(key=lambda alert: rank.get(alert.severity, len(rank)))
    return alerts


def running_operations(*, limit: int = 20) -> list[Any]:
    """Operations that are not finished (planned, canary, running, paused), newest first."""
    from dlqconsole.operations.models import Operation

    return list(Operation.objects.unfinished().order_by("-id")[:limit])
