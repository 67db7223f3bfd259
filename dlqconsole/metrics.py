"""Prometheus metrics about dead letters, computed from the database when /metrics is scraped.

Every number comes from counters or small tables (DeadLetterCount, IngestStat, FailurePattern, Operation,
Alert, Channel, the newest QueueSamples) or from one indexed lookup per queue, never from counting dead letters,
so a scrape costs the same with a million stored dead letters. Every series about a queue carries its broker and
queue (`broker="staging", queue="orders.dlq"`). Labels stay bounded: queues are capped at DLQ_METRICS_MAX_QUEUES
(broker, queue) pairs (the rest of each broker's are summed as queue="other"), and no label ever carries a pattern
or message id.
Only unfinished operations (at most MAX_OPERATIONS of them) are labelled by id.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dlqconsole.alerts.facts import oldest_parked_by_queue
from dlqconsole.alerts.models import (
    OPEN_STATUSES,
    Alert,
    Channel,
    EvaluationState,
    Notification,
    NotificationStatus,
    Severity,
)
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.core.breaker import STATE_VALUES
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    PatternEvent,
    PatternStatus,
)
from dlqconsole.ingest.models import IngestStat, QueueSample, WatchedQueue
from dlqconsole.operations.breakers import BreakerSetting, breaker_views, ranked
from dlqconsole.operations.models import FINISHED_STATUSES, Operation

logger = logging.getLogger(__name__)

OTHER = "other"
MAX_OPERATIONS = 20
# Breakers labelled at most (those waited for or set in the admin first, then open ones).
MAX_BREAKERS = 200

# A queue: (broker id, queue name). Every series labelled by queue is labelled by its broker too, so that the same
# queue name on two brokers is two series.
QueueKey = tuple[int, str]

# name: (type, help, labels). describe() and collect() both read this, so the two cannot drift apart.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "dlq_metrics_up": ("gauge", "1 when the database metrics below could be read.", ()),
    "dlq_dead_letters": (
        "gauge",
        "Dead letters stored, by queue, failure reason, status and the triage status of their pattern.",
        ("broker", "queue", "reason", "status", "pattern_status"),
    ),
    "dlq_oldest_parked_dead_letter_age_seconds": ("gauge", "Age of the oldest parked dead letter.", ()),
    "dlq_oldest_parked_age_seconds": (
        "gauge",
        "Age of the oldest parked dead letter of a queue.",
        ("broker", "queue"),
    ),
    "dlq_patterns": ("gauge", "Failure patterns (not merged away), by triage status.", ("status",)),
    "dlq_patterns_created": ("counter", "Failure patterns ever created.", ()),
    "dlq_pattern_reopens": ("counter", "Resolved patterns that received a new dead letter.", ()),
    "dlq_ingest_received": (
        "counter",
        "Deliveries taken from a dead-letter queue and committed.",
        ("broker", "queue"),
    ),
    "dlq_ingest_inserted": ("counter", "New dead letters stored.", ("broker", "queue")),
    "dlq_ingest_duplicates": (
        "counter",
        "Redelivered copies of dead letters already stored.",
        ("broker", "queue"),
    ),
    "dlq_ingest_malformed": (
        "counter",
        "Dead letters stored with envelope parse problems.",
        ("broker", "queue"),
    ),
    "dlq_ingest_last_batch_timestamp_seconds": (
        "gauge",
        "When consume_dlq last committed a batch.",
        ("broker", "queue"),
    ),
    "dlq_operation_messages": (
        "counter",
        "Messages handled by operations, by kind (retry, move, archive, ...) and outcome.",
        ("kind", "outcome"),
    ),
    "dlq_operation_returned": ("counter", "Replayed messages that came back to a dead-letter queue.", ("kind",)),
    "dlq_operations": ("gauge", "Operations by kind and status.", ("kind", "status")),
    "dlq_operation_progress_ratio": (
        "gauge",
        "Share of an unfinished operation's messages with an outcome.",
        ("operation", "kind", "status"),
    ),
    "dlq_operation_remaining_messages": (
        "gauge",
        "Messages an unfinished operation has still to handle.",
        ("operation", "kind", "status"),
    ),
    "dlq_breaker_state": (
        "gauge",
        "Circuit breaker of a replay destination: 0 closed, 1 half-open (probing), 2 open. The destination is its key:"
        " queue:NAME or exchange:NAME/ROUTING_KEY (% and / in NAME written %25 and %2F), prefixed broker:NAME: off"
        " the default broker.",
        ("destination",),
    ),
    "dlq_breakers_not_shown": (
        "gauge",
        "Circuit breakers with a state left out of dlq_breaker_state (it labels at most 200: those operations wait for"
        " or set in the admin first).",
        (),
    ),
    "dlq_alerts": ("gauge", "Open alerts of the console's rules, by severity and status.", ("severity", "status")),
    "dlq_alert_evaluation_timestamp_seconds": ("gauge", "When the alert rules were last evaluated.", ()),
    "dlq_alert_evaluation_duration_seconds": ("gauge", "How long the last alert evaluation took.", ()),
    "dlq_notifications": (
        "counter",
        "Alert notifications sent or failed for good, by channel kind.",
        ("kind", "outcome"),
    ),
    "dlq_channels_disabled": ("gauge", "Notification channels switched off after permanent failures.", ()),
    "dlq_notifications_held": (
        "gauge",
        "Alert notices over their channel's budget, held for the digest sent when the channel's window ends.",
        ("kind",),
    ),
    "dlq_queue_messages": (
        "gauge",
        "Messages ready in a watched queue (role: work or dlq).",
        ("broker", "queue", "role"),
    ),
    "dlq_queue_consumers": (
        "gauge",
        "Consumers of a watched queue (role: work or dlq).",
        ("broker", "queue", "role"),
    ),
    "dlq_queue_sample_timestamp_seconds": (
        "gauge",
        "When the queue's depth was sampled.",
        ("broker", "queue", "role"),
    ),
    "dlq_consumer_lag_messages": (
        "gauge",
        "Dead letters in a DLQ not yet ingested by consume_dlq.",
        ("broker", "queue"),
    ),
    "dlq_queue_depth_threshold": (
        "gauge",
        "Depth thresholds of a watched work queue (level: warning, critical, emergency).",
        ("broker", "queue", "level"),
    ),
}


class Families:
    """Metric families being filled for one scrape."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}
        for name, (kind, documentation, labels) in METRICS.items():
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            self.families[name] = family_type(name, documentation, labels=list(labels))

    def add(self, name: str, value: float, *labels: str) -> None:
        family = self.families[name]
        family.add_metric(list(labels), value)  # type: ignore[attr-defined]


class DeadLetterCollector(Collector):
    def describe(self) -> Iterator[Metric]:
        # Registration calls describe() instead of collect(), so starting a process never queries the database.
        yield from Families().families.values()

    def collect(self) -> Iterator[Metric]:
        families = Families()
        try:
            fill(families, now=timezone.now())
        except DatabaseError:
            logger.exception("dead-letter metrics could not be read")
            families = Families()
            families.add("dlq_metrics_up", 0)
        else:
            families.add("dlq_metrics_up", 1)
        yield from families.families.values()


def fill(families: Families, *, now: dt.datetime) -> None:
    label = QueueLabels.read()
    _dead_letters(families, label=label, now=now)
    _patterns(families)
    _ingest(families, label=label)
    _operations(families)
    _breakers(families)
    _alerts(families)
    _queues(families, label=label, now=now)


class QueueLabels:
    """Which queues get a label of their own, as (broker id, queue name): watched queues first, then the DLQs
    holding the most. The rest of each broker's queues are summed under queue="other" of that broker."""

    def __init__(self, *, brokers: dict[int, str], chosen: set[QueueKey]) -> None:
        self.brokers = brokers
        self.chosen = chosen

    @classmethod
    def read(cls) -> QueueLabels:
        ranked: list[QueueKey] = []
        for broker_id, name, dead_letter_queue in WatchedQueue.objects.filter(enabled=True).values_list(
            "broker_id", "name", "dead_letter_queue"
        ):
            ranked += [(broker_id or 0, name), (broker_id or 0, dead_letter_queue)]
        totals = (
            DeadLetterCount.objects.values_list("broker_id", "source_queue")
            .annotate(total=Sum("count"))
            .order_by("-total", "source_queue", "broker_id")
        )
        ranked += [(broker_id or 0, queue) for broker_id, queue, _total in totals]
        chosen = set(list(dict.fromkeys(ranked))[: settings.DLQ_METRICS_MAX_QUEUES])
        return cls(brokers=dict(Broker.objects.values_list("pk", "name")), chosen=chosen)

    def broker(self, broker_id: int | None) -> str:
        return self.brokers.get(broker_id or 0, DEFAULT)

    def __call__(self, broker_id: int | None, queue: str) -> tuple[str, str]:
        """The (broker, queue) labels of a queue: its own, or "other" of its broker."""
        key = (broker_id or 0, queue)
        return self.broker(broker_id), queue if key in self.chosen else OTHER

    def __contains__(self, key: QueueKey) -> bool:
        return key in self.chosen


def _dead_letters(families: Families, *, label: QueueLabels, now: dt.datetime) -> None:
    # The pattern's triage status lets Prometheus rules leave ignored patterns out, as the console's rules do.
    cells: dict[tuple[str, str, str, str, str], int] = defaultdict(int)
    parked_queues: set[QueueKey] = set()
    for broker_id, queue, reason, status, pattern_status, total in (
        DeadLetterCount.objects.values_list("broker_id", "source_queue", "failure_reason", "status", "pattern__status")
        .annotate(total=Sum("count"))
        .order_by()
    ):
        cells[(*label(broker_id, queue), reason, status, pattern_status)] += int(total or 0)
        if status == DeadLetterStatus.PARKED and total and (broker_id or 0, queue) in label:
            parked_queues.add((broker_id or 0, queue))
    for (broker, queue, reason, status, pattern_status), total in sorted(cells.items()):
        families.add("dlq_dead_letters", total, broker, queue, reason, status, pattern_status)
    # Both walk the (status, ingested_at) or (queue, status, id) index from its oldest end: one row each (the
    # queues' lookups in one statement).
    oldest = DeadLetter.objects.parked().order_by("ingested_at").values_list("ingested_at", flat=True).first()
    families.add("dlq_oldest_parked_dead_letter_age_seconds", _age(oldest, now))
    firsts = oldest_parked_by_queue(parked_queues, leave_out_ignored=False)
    for broker_id, queue in sorted(parked_queues, key=lambda key: (key[1], key[0])):
        if (first := firsts.get((broker_id, queue))) is not None:
            families.add("dlq_oldest_parked_age_seconds", _age(first, now), *label(broker_id, queue))


def _age(moment: dt.datetime | None, now: dt.datetime) -> float:
    return max(0.0, (now - moment).total_seconds()) if moment is not None else 0.0


def _patterns(families: Families) -> None:
    by_status = dict(FailurePattern.objects.active().values_list("status").annotate(total=Count("pk")).order_by())
    for status in PatternStatus.values:
        families.add("dlq_patterns", by_status.get(status, 0), status)
    families.add("dlq_patterns_created", FailurePattern.objects.count())
    families.add("dlq_pattern_reopens", PatternEvent.objects.filter(kind=PatternEvent.Kind.REOPENED).count())


def _ingest(families: Families, *, label: QueueLabels) -> None:
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for stat in IngestStat.objects.all():
        labels = label(stat.broker_id, stat.source_queue)
        for field in ("received", "inserted", "duplicates", "malformed"):
            sums[labels][field] += getattr(stat, field)
        if stat.last_batch_at is not None:
            sums[labels]["last"] = max(sums[labels]["last"], stat.last_batch_at.timestamp())
    for labels, values in sorted(sums.items()):
        for field in ("received", "inserted", "duplicates", "malformed"):
            families.add(f"dlq_ingest_{field}", values[field], *labels)
        if values["last"]:
            families.add("dlq_ingest_last_batch_timestamp_seconds", values["last"], *labels)


def _operations(families: Families) -> None:
    totals = (
        Operation.objects.values("kind")
        .annotate(succeeded=Sum("succeeded"), failed=Sum("failed"), skipped=Sum("skipped"), returned=Sum("returned"))
        .order_by("kind")
    )
    for row in totals:
        for outcome in ("succeeded", "failed", "skipped"):
            families.add("dlq_operation_messages", row[outcome] or 0, row["kind"], outcome)
        families.add("dlq_operation_returned", row["returned"] or 0, row["kind"])
    for kind, status, total in (
        Operation.objects.values_list("kind", "status").annotate(total=Count("pk")).order_by("kind", "status")
    ):
        families.add("dlq_operations", total, kind, status)
    unfinished = Operation.objects.exclude(status__in=FINISHED_STATUSES).order_by("-id")[:MAX_OPERATIONS]
    for operation in unfinished:
        labels = (str(operation.pk), operation.kind, operation.status)
        families.add("dlq_operation_progress_ratio", operation.progress, *labels)
        families.add("dlq_operation_remaining_messages", operation.remaining, *labels)


def _breakers(families: Families) -> None:
    """Every breaker with a state (they expire a while after closing) and every destination set in the admin."""
    views = {view.key: view for view in breaker_views()}
    configured = sorted({row.destination.limit_key for row in BreakerSetting.objects.select_related("broker")})
    for key in configured:
        if key not in views:
            views.update({view.key: view for view in breaker_views([key])})
    shown, left_out = ranked(list(views.values()), limit=MAX_BREAKERS)
    for view in shown:
        families.add("dlq_breaker_state", STATE_VALUES.get(view.state.state, 0), view.key)
    families.add("dlq_breakers_not_shown", left_out)


def _alerts(families: Families) -> None:
    open_counts: dict[tuple[str, str], int] = {
        (severity, status): total
        for severity, status, total in Alert.objects.open()
        .values_list("severity", "status")
        .annotate(total=Count("pk"))
        .order_by()
    }
    for severity in Severity.values:
        for status in OPEN_STATUSES:
            families.add("dlq_alerts", open_counts.get((severity, status), 0), severity, status)
    state = EvaluationState.objects.filter(pk=1).first()
    if state is not None and state.last_finished_at is not None:
        families.add("dlq_alert_evaluation_timestamp_seconds", state.last_finished_at.timestamp())
        families.add("dlq_alert_evaluation_duration_seconds", state.last_duration_ms / 1000)
    sent: dict[tuple[str, str], float] = defaultdict(float)
    disabled = 0
    for kind, enabled, sent_count, failed_count in Channel.objects.values_list(
        "kind", "enabled", "sent_count", "failed_count"
    ):
        sent[(kind, "sent")] += sent_count
        sent[(kind, "failed")] += failed_count
        disabled += not enabled
    for (kind, outcome), total in sorted(sent.items()):
        families.add("dlq_notifications", total, kind, outcome)
    families.add("dlq_channels_disabled", disabled)
    held: dict[str, int] = dict.fromkeys(sorted({kind for kind, _ in sent}), 0)
    for kind, total in (
        Notification.objects.filter(status=NotificationStatus.HELD)
        .values_list("channel__kind")
        .annotate(total=Count("pk"))
        .order_by()
    ):
        held[kind] = total
    for kind, total in sorted(held.items()):
        families.add("dlq_notifications_held", total, kind)


def _queues(families: Families, *, label: QueueLabels, now: dt.datetime) -> None:
    watched = list(WatchedQueue.objects.filter(enabled=True))
    roles: dict[QueueKey, str] = {}
    for queue in watched:
        work = (queue.broker_id or 0, queue.name)
        roles.setdefault(work, "work")
        roles.setdefault((queue.broker_id or 0, queue.dead_letter_queue), "dlq")
        if work in label:
            for level in ("warning", "critical", "emergency"):
                families.add("dlq_queue_depth_threshold", getattr(queue, f"{level}_depth"), *label(*work), level)
    named = {key for key in roles if key in label}
    if not named:
        return
    # Only recent samples: an index range on sampled_at, a few rows per queue (a stale queue shows no depth).
    recent_after = now - dt.timedelta(seconds=max(60.0, 6 * settings.DLQ_QUEUE_SAMPLE_SECONDS))
    newest: dict[QueueKey, Any] = {}
    for sample in QueueSample.objects.filter(
        queue__in={name for _, name in named}, sampled_at__gte=recent_after
    ).order_by("queue", "broker_id", "-sampled_at"):
        key = (sample.broker_id or 0, sample.queue)
        if key in named:
            newest.setdefault(key, sample)
    for key, sample in sorted(newest.items(), key=lambda item: (item[0][1], item[0][0])):
        role = roles[key]
        labels = label(*key)
        families.add("dlq_queue_messages", sample.messages, *labels, role)
        families.add("dlq_queue_consumers", sample.consumers, *labels, role)
        families.add("dlq_queue_sample_timestamp_seconds", sample.sampled_at.timestamp(), *labels, role)
        if role == "dlq":
            families.add("dlq_consumer_lag_messages", sample.messages, *labels)


_registered = False


def register_collector() -> None:
    """Register the collector with the default registry (once per process; AppConfig.ready may run twice)."""
    global _registered
    if not _registered:
        REGISTRY.register(DeadLetterCollector())
        _registered = True
