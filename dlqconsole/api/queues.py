"""/api/v1/queues/: every dead-letter queue the console knows, per broker: those it has stored dead letters from and
those of its watched queues, each with its stored dead letters per status (from the counters), the age of its
oldest and newest parked one, and its depth and consumers at the latest sample where the console samples it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db.models import OuterRef, Subquery, Sum
from django.urls import path, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from dlqconsole.api.base import ApiView
from dlqconsole.api.problems import REFUSED
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.filters import DeadLetterFilter, broker_ids
from dlqconsole.deadletters.models import DeadLetterCount, DeadLetterStatus
from dlqconsole.ingest.models import QueueSample, WatchedQueue

# The list is not paged: it stops at this many queues and says so (`truncated`).
MAX_QUEUES = 1000


@dataclass
class KnownQueue:
    broker_id: int
    queue: str
    work_queue: str | None = None
    depth: int | None = None
    consumers: int | None = None
    sampled_at: Any = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DeadLetterStatus.values, 0))
    oldest_parked_at: Any = None
    newest_parked_at: Any = None


class QueueSerializer(serializers.Serializer):
    broker = serializers.CharField(help_text="The broker's name.")
    queue = serializers.CharField(help_text="The dead-letter queue.")
    work_queue = serializers.CharField(
        allow_null=True, help_text="The watched work queue that dead-letters into it, or null when none is watched."
    )
    watched = serializers.BooleanField(help_text="The console samples its depth (a watched queue's DLQ).")
    depth = serializers.IntegerField(
        allow_null=True, help_text="Messages in the queue (not yet ingested) at the latest sample; null if unsampled."
    )
    consumers = serializers.IntegerField(allow_null=True, help_text="Its consumers at the latest sample.")
    sampled_at = serializers.DateTimeField(allow_null=True, help_text="When it was last sampled.")
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="Dead letters stored from it, per status."
    )
    waiting = serializers.IntegerField(help_text="Those parked, scheduled or failed: still to be dealt with.")
    oldest_parked_at = serializers.DateTimeField(allow_null=True)
    newest_parked_at = serializers.DateTimeField(allow_null=True)
    dead_letters = serializers.URLField(help_text="Its dead letters in the API.")
    page = serializers.URLField(help_text="Its dead letters on the console's messages page.")


class QueueListSerializer(serializers.Serializer):
    results = QueueSerializer(many=True)
    truncated = serializers.BooleanField(help_text=f"More than {MAX_QUEUES} queues: only the first are listed.")


def known_queues(*, only: list[int] | None) -> list[KnownQueue]:
    """The dead-letter queues of the counters and of the enabled watched queues, on the brokers named (all when
    None): a few small tables and one index probe per watched queue, never a count of dead letters."""
    found: dict[tuple[int, str], KnownQueue] = {}

    def known(broker_id: int | None, queue: str) -> KnownQueue:
        key = (broker_id or 0, queue)
        if key not in found:
            found[key] = KnownQueue(broker_id=broker_id or 0, queue=queue)
        return found[key]

    cells = DeadLetterCount.objects.all()
    watched = WatchedQueue.objects.filter(enabled=True)
    if only is not None:
        cells = cells.filter(broker_id__in=only)
        watched = watched.filter(broker_id__in=only)
    totals = cells.values_list("broker_id", "source_queue", "status").annotate(total=Sum("count")).order_by()
    for broker_id, queue, status, total in totals:
        known(broker_id, queue).counts[status] += int(total or 0)
    latest = QueueSample.objects.filter(broker=OuterRef("broker"), queue=OuterRef("dead_letter_queue")).order_by(
        "-sampled_at"
    )
    sampled = watched.annotate(
        depth=Subquery(latest.values("messages")[:1]),
        consumer_count=Subquery(latest.values("consumers")[:1]),
        sampled_at=Subquery(latest.values("sampled_at")[:1]),
    ).values_list("broker_id", "name", "dead_letter_queue", "depth", "consumer_count", "sampled_at")
    for broker_id, name, dead_letter_queue, depth, consumers, sampled_at in sampled:
        row = known(broker_id, dead_letter_queue)
        row.work_queue, row.depth, row.consumers, row.sampled_at = name, depth, consumers, sampled_at
    for summary in selectors.queue_summaries(broker_ids=only):
        row = known(summary.broker_id, summary.queue)
        row.oldest_parked_at, row.newest_parked_at = summary.oldest_at, summary.newest_at
    return list(found.values())


class QueueListView(ApiView):
    """Every dead-letter queue known to the console."""

    query_parameters = {"get": frozenset({"broker"})}

    @extend_schema(
        operation_id="list_queues",
        summary="List dead-letter queues",
        description="Every dead-letter queue the console has stored dead letters from or watches, per broker, with "
        "its dead letters per status and, for a watched queue's DLQ, its depth and consumers at the latest sample. "
        f"Sorted by broker and queue; at most {MAX_QUEUES}.",
        parameters=[
            OpenApiParameter(
                "broker",
                OpenApiTypes.STR,
                OpenApiParameter.QUERY,
                many=True,
                explode=True,
                description="Only this broker's queues (repeatable, or comma-separated).",
            )
        ],
        responses={200: QueueListSerializer, 400: REFUSED},
    )
    def get(self, request: Request) -> Response:
        # Broker names read and checked as the dead-letter filter reads them (FilterError, a 400, names the known).
        # (`broker` is the only parameter this view takes: query_parameters.)
        chosen = DeadLetterFilter.from_querydict(request.query_params)
        only = broker_ids(chosen.broker) if chosen.broker else None
        brokers = selectors.broker_names()
        rows = sorted(known_queues(only=only), key=lambda row: (brokers.get(row.broker_id, ""), row.queue))
        list_url = request.build_absolute_uri(reverse("api-dead-letter-list"))
        page_url = request.build_absolute_uri(reverse("deadletters:messages"))
        results = []
        for row in rows[:MAX_QUEUES]:
            broker = brokers.get(row.broker_id, "")
            query = urlencode({"broker": broker, "queue": row.queue})
            results.append(
                {
                    "broker": broker,
                    "queue": row.queue,
                    "work_queue": row.work_queue,
                    "watched": row.work_queue is not None,
                    "depth": row.depth,
                    "consumers": row.consumers,
                    "sampled_at": row.sampled_at,
                    "counts": row.counts,
                    "waiting": sum(row.counts.get(status, 0) for status in selectors.WAITING),
                    "oldest_parked_at": row.oldest_parked_at,
                    "newest_parked_at": row.newest_parked_at,
                    "dead_letters": f"{list_url}?{query}",
                    "page": f"{page_url}?{query}",
                }
            )
        data = {"results": results, "truncated": len(rows) > MAX_QUEUES}
        return Response(QueueListSerializer(data).data)


urlpatterns = [path("queues/", QueueListView.as_view(), name="api-queues")]
