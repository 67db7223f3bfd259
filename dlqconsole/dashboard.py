"""The dashboard: arrivals, dead letters waiting per queue, the top failure patterns, the backpressure of work
queues, firing alerts and running operations. It reads every app, so it sits above them all, beside metrics.py.

The dead letters' part comes from dlqconsole.deadletters.selectors (counters and index probes, never a count of
the dead letters); the rest from small tables: the newest queue sample of each watched queue, active alerts,
unfinished operations.

Where there are several brokers, the queue tables are grouped by broker with each broker's totals, a card says how
each broker is doing (its URL without the password, when its queues were last sampled, when a batch of its dead
letters was last ingested), and ?broker=NAME narrows the page to one broker. With the broker default alone the
page is as it always was.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Case, Max, OuterRef, Subquery, Value, When
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from dlqconsole.alerts.models import Alert
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.core.views import HtmxHttpRequest, partial_template
from dlqconsole.deadletters import selectors
from dlqconsole.ingest.models import IngestStat, QueueSample, WatchedQueue
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
    broker: str = DEFAULT
    # Whether a shed may take from it: a classic queue (a quorum queue is refused, so no Shed link is offered).
    sheddable: bool = True


@dataclass
class BrokerGroup:
    """One broker's rows of a queue table, with its totals for the group's heading."""

    broker: str
    rows: list[Any] = field(default_factory=list)
    parked: int = 0
    scheduled: int = 0


@dataclass
class BrokerStatus:
    broker: Broker
    parked: int
    watched: int
    sampled_at: dt.datetime | None
    ingested_at: dt.datetime | None
    # "sampled" (its queues answered recently), "stale" (they have not), "idle" (no watched queue) or "disabled".
    state: str


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


def backpressure(*, broker_ids: list[int] | None = None) -> list[Backpressure]:
    """The latest depth sample of each watched work queue, with its level from the queue's thresholds (one query:
    a probe of the (broker, queue, -sampled_at) index per queue). Only the brokers named, when given."""
    latest = QueueSample.objects.filter(broker=OuterRef("broker"), queue=OuterRef("name")).order_by("-sampled_at")
    watched = WatchedQueue.objects.filter(enabled=True)
    if broker_ids is not None:
        watched = watched.filter(broker_id__in=broker_ids)
    watched = watched.annotate(
        depth=Subquery(latest.values("messages")[:1]),
        consumer_count=Subquery(latest.values("consumers")[:1]),
        sampled_at=Subquery(latest.values("sampled_at")[:1]),
    )
    names = selectors.broker_names()
    found = []
    for queue in watched.order_by("name", "broker_id"):
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
                broker=names.get(queue.broker_id or 0, DEFAULT),
                sheddable=queue.kind == WatchedQueue.Kind.CLASSIC,
            )
        )
    order = {level: index for index, level in enumerate(reversed(LEVELS))}
    found.sort(key=lambda item: (order.get(item.level, len(LEVELS)), item.queue, item.broker))
    return found


def by_broker(rows: list[Any]) -> list[BrokerGroup]:
    """Rows (queue summaries or backpressure) grouped by their broker, in broker name order, each group's rows in
    the order given; queue summaries add up to their group's parked and scheduled totals."""
    groups: dict[str, BrokerGroup] = {}
    for row in rows:
        group = groups.setdefault(row.broker, BrokerGroup(broker=row.broker))
        group.rows.append(row)
        group.parked += getattr(row, "parked", 0)
        group.scheduled += getattr(row, "scheduled", 0)
    return [groups[name] for name in sorted(groups)]


def broker_statuses(
    brokers: list[Broker], *, queues: list[selectors.QueueSummary], pressure: list[Backpressure], now: dt.datetime
) -> list[BrokerStatus]:
    """How each broker is doing, from what the page has read already (its queues' newest samples and parked
    counts) and the ingest totals (one small table): whether the sampler reached it lately, and when a batch of its
    dead letters was last ingested."""
    fresh_after = now - dt.timedelta(seconds=max(30.0, 3 * settings.DLQ_QUEUE_SAMPLE_SECONDS))
    ingested = dict(IngestStat.objects.values_list("broker__name").annotate(last=Max("last_batch_at")).order_by())
    statuses = []
    for broker in brokers:
        own = [row for row in pressure if row.broker == broker.name]
        sampled = [row.sampled_at for row in own if row.sampled_at is not None]
        sampled_at = max(sampled, default=None)
        if not broker.enabled:
            state = "disabled"
        elif not own:
            state = "idle"
        else:
            state = "sampled" if sampled_at is not None and sampled_at >= fresh_after else "stale"
        statuses.append(
            BrokerStatus(
                broker=broker,
                parked=sum(queue.parked for queue in queues if queue.broker == broker.name),
                watched=len(own),
                sampled_at=sampled_at,
                ingested_at=ingested.get(broker.name),
                state=state,
            )
        )
    return statuses


def firing_alerts(*, limit: int = 8, broker: str = "") -> tuple[list[Any], int]:
    """(The alerts firing or acknowledged now that matter most: not yet acknowledged, then the most severe, then
    the newest; how many there are in all). The dashboard shows a few and links to the rest: an alert storm must
    not push everything else off the page. Only those about the broker named, when one is."""
    active = Alert.objects.active()
    if broker:
        active = active.about_broker(broker)
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
    brokers = registry.brokers(enabled=False)
    several = len(brokers) > 1
    # ?broker=NAME: one broker's queues, arrivals, patterns and alerts; a name that is none of them is ignored.
    asked = request.GET.get("broker", "")
    chosen = next((broker for broker in brokers if broker.name == asked), None)
    only = [chosen.pk] if chosen is not None else None
    queues = selectors.queue_summaries(broker_ids=only)
    pressure = backpressure(broker_ids=only)
    day = selectors.arrivals(now=now, width=dt.timedelta(hours=1), buckets=24, broker_ids=only)
    hour = selectors.arrivals(now=now, width=dt.timedelta(minutes=5), buckets=12, broker_ids=only)
    oldest = [queue.oldest_at for queue in queues if queue.oldest_at]
    newest = [queue.newest_at for queue in queues if queue.newest_at]
    alerts, alerts_total = firing_alerts(broker=chosen.name if chosen is not None else "")
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
        "top_patterns": selectors.top_patterns(limit=10, now=now, broker_ids=only),
        "backpressure": pressure,
        "alerts": alerts,
        "alerts_total": alerts_total,
        "operations": running_operations(),
        "several_brokers": several,
        "chosen_broker": chosen,
        "unknown_broker": registry.unknown_broker_notice(asked, [broker.name for broker in brokers]),
        "refresh_url": reverse("dashboard") + (f"?{urlencode({'broker': chosen.name})}" if chosen else ""),
    }
    if several:
        context["queue_groups"] = by_broker(queues)
        context["backpressure_groups"] = by_broker(pressure)
        context["broker_statuses"] = broker_statuses(
            [chosen] if chosen is not None else brokers, queues=queues, pressure=pressure, now=now
        )
    return render(request, partial_template(request, "deadletters/dashboard.html", "panels"), context)
