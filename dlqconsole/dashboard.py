"""The dashboard: arrivals, dead letters waiting per queue, the top failure patterns, the backpressure of work
queues, firing alerts and running operations. It reads every app, so it sits above them all, beside metrics.py.

The dead letters' part comes from dlqconsole.deadletters.selectors (counters and index probes, never a count of
the dead letters); the rest from small tables: the newest queue sample of each watched queue, active alerts,
unfinished operations.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db.models import Case, OuterRef, Subquery, Value, When
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from dlqconsole.alerts.models import Alert
from dlqconsole.core.views import HtmxHttpRequest, partial_template
from dlqconsole.deadletters import selectors
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.operations.models import Operation, OperationStatus

LEVELS = ("normal", "warning", "critical", "emergency")


@dataclass
class Backpressure:
    queue: str
    depth: int | None
    consumers: int | None
    level: str
    sampled_at: dt.datetime | None
    thresholds: tuple[int, int, int]


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
    """The latest depth sample of each watched work queue, with its level from the queue's thresholds (one query:
    a probe of the (queue, -sampled_at) index per queue)."""
    latest = QueueSample.objects.filter(queue=OuterRef("name")).order_by("-sampled_at")
    watched = WatchedQueue.objects.filter(enabled=True).annotate(
        depth=Subquery(latest.values("messages")[:1]),
        consumer_count=Subquery(latest.values("consumers")[:1]),
        sampled_at=Subquery(latest.values("sampled_at")[:1]),
    )
    found = []
    for queue in watched.order_by("name"):
        depth = queue.depth  # type: ignore[attr-defined]
        found.append(
            Backpressure(
                queue=queue.name,
                depth=depth,
                consumers=queue.consumer_count,  # type: ignore[attr-defined]
                level=backpressure_level(
                    depth=depth,
                    warning=queue.warning_depth,
                    critical=queue.critical_depth,
                    emergency=queue.emergency_depth,
                ),
                sampled_at=queue.sampled_at,  # type: ignore[attr-defined]
                thresholds=(queue.warning_depth, queue.critical_depth, queue.emergency_depth),
            )
        )
    order = {level: index for index, level in enumerate(reversed(LEVELS))}
    found.sort(key=lambda item: (order.get(item.level, len(LEVELS)), item.queue))
    return found


def firing_alerts(*, limit: int = 8) -> tuple[list[Any], int]:
    """(The alerts firing or acknowledged now that matter most: not yet acknowledged, then the most severe, then
    the newest; how many there are in all). The dashboard shows a few and links to the rest: an alert storm must
    not push everything else off the page."""
    active = Alert.objects.active()
    severity = Case(
        *(When(severity=name, then=Value(rank)) for rank, name in enumerate(("emergency", "critical", "warning"))),
        default=Value(3),
    )
    acknowledged = Case(When(status="acknowledged", then=Value(1)), default=Value(0))
    alerts = list(
        active.select_related("rule")
        .annotate(acknowledged_rank=acknowledged, severity_rank=severity)
        .order_by("acknowledged_rank", "severity_rank", "-started_at", "-id")[:limit]
    )
    return alerts, active.count() if len(alerts) == limit else len(alerts)


def running_operations(*, limit: int = 20) -> list[Operation]:
    """Operations under way (canary, running, paused), newest first; plans nobody started are left out."""
    return list(Operation.objects.unfinished().exclude(status=OperationStatus.PLANNED).order_by("-id")[:limit])


@require_GET
@vary_on_headers("HX-Request")
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    now = timezone.now()
    queues = selectors.queue_summaries()
    day = selectors.arrivals(now=now, width=dt.timedelta(hours=1), buckets=24)
    hour = selectors.arrivals(now=now, width=dt.timedelta(minutes=5), buckets=12)
    oldest = [queue.oldest_at for queue in queues if queue.oldest_at]
    newest = [queue.newest_at for queue in queues if queue.newest_at]
    alerts, alerts_total = firing_alerts()
    context = {
        "now": now,
        "queues": queues,
        "waiting": sum(queue.parked + queue.scheduled for queue in queues),
        "parked": sum(queue.parked for queue in queues),
        "oldest_at": min(oldest) if oldest else None,
        "newest_at": max(newest) if newest else None,
        "day": day,
        "hour": hour,
        "day_total": sum(count for _, count in day),
        "hour_total": sum(count for _, count in hour),
        "top_patterns": selectors.top_patterns(limit=10, now=now),
        "backpressure": backpressure(),
        "alerts": alerts,
        "alerts_total": alerts_total,
        "operations": running_operations(),
    }
    return render(request, partial_template(request, "deadletters/dashboard.html", "panels"), context)
