"""The shapes of the operations resource: what a plan, a start and the other controls take, and an operation as the
API answers it (its plan, breakdown and warnings as the operation page shows them before Start, its progress and
time left as the page shows them while it runs)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dlqconsole.api.base import Links, StrictSerializer
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.filters import MAX_IDS, DeadLetterFilter
from dlqconsole.operations import history, services
from dlqconsole.operations.cli import LIST_FILTERS, TEXT_FILTERS
from dlqconsole.operations.item_sql import CameBack
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from dlqconsole.operations.worker_watch import watch_worker

PLANNABLE_KINDS = [
    OperationKind.RETRY,
    OperationKind.MOVE,
    OperationKind.PURGE,
    OperationKind.ARCHIVE,
    OperationKind.RESTORE,
]
# The most a 32-bit column holds: the canary's wait in seconds.
MAX_SECONDS = 2_147_483_647
# What each filter field means, in the words of `dlq retry --help`.
FILTER_HELP = {name: text for _, name, text in (*LIST_FILTERS, *TEXT_FILTERS)}
STALE_MINUTES = int(services.STALE_PLAN_AGE.total_seconds() // 60)
# What a plan's warnings are about (warnings() below says each in words).
WARNING_CODES = (
    "broker_span",  # its set spans several brokers
    "empty_plan",  # nothing in it: a start is refused
    "nothing_replayable",  # none of its messages can be replayed: a start is refused
    "unreplayable",  # some cannot be replayed: they will be marked failed
    "unchecked",  # a broker could not be asked whether its destinations exist
    "no_consumer",  # a destination queue has no consumer
    "stale_plan",  # older than STALE_MINUTES: a start needs stale_confirmed
    "confirm_count",  # a purge: a start needs confirm_count
)


# Requests -------------------------------------------------------------------------------------------------------


def _filter_field(spec: dataclasses.Field[Any]) -> serializers.Field:
    """A field of the dead-letter filter as JSON takes it: a list of ids or of strings (at most MAX_IDS, as the
    filter takes ids), or a string."""
    help_text = FILTER_HELP.get(spec.name, spec.name.replace("_", " "))
    kind = str(spec.type)
    if kind.startswith("list["):
        child = serializers.IntegerField() if "int" in kind else serializers.CharField(trim_whitespace=True)
        return serializers.ListField(
            child=child, required=False, max_length=MAX_IDS, help_text=f"{help_text} (any of these)"
        )
    return serializers.CharField(required=False, allow_blank=True, help_text=help_text)


class OperationFilterSerializer(StrictSerializer):
    """The dead-letter filter of a plan, as the messages page and `dlq retry` take it; a field it does not know is
    refused (a misspelt one would otherwise widen the plan)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {spec.name: _filter_field(spec) for spec in dataclasses.fields(DeadLetterFilter)}


class OperationPlanSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=PLANNABLE_KINDS, help_text="A purge needs the admin role.")
    filter = OperationFilterSerializer(help_text="Which dead letters; an empty filter is refused.")
    limit = serializers.IntegerField(
        required=False, allow_null=True, help_text="At most this many dead letters, oldest first."
    )
    rate = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text='N/period[:burst], e.g. 50/1s, for a retry or a move; "" for no limit. Left out: the console\'s '
        "default replay rate (DLQ_DEFAULT_REPLAY_RATE), as the plan page starts from.",
    )
    canary = serializers.IntegerField(
        required=False, default=0, help_text="Replay this many first, then watch them before the rest; 0 for none."
    )
    canary_wait = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_SECONDS,
        help_text="Seconds to watch the canary for returns (default DLQ_CANARY_WAIT_SECONDS).",
    )
    target_queue = serializers.CharField(required=False, allow_blank=True, default="", help_text="A move's queue.")
    target_exchange = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="A move's exchange (with routing_key)."
    )
    routing_key = serializers.CharField(required=False, allow_blank=True, default="")
    target_broker = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="A move's broker; empty: each dead letter's own."
    )


class OperationStartSerializer(StrictSerializer):
    confirm_count = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        help_text="The number of messages the plan holds (its `confirm_count`): required to start a purge; for "
        "another kind, when sent, nothing starts unless it is the plan's count.",
    )
    stale_confirmed = serializers.BooleanField(
        required=False,
        default=False,
        help_text=f"Start a plan older than {STALE_MINUTES} minutes anyway (dead letters that arrived since are not "
        "in it).",
    )


class OperationPauseSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class OperationRateSerializer(StrictSerializer):
    rate = serializers.CharField(allow_blank=True, max_length=64, help_text='N/period[:burst], or "" for no limit.')


class OperationListQuerySerializer(serializers.Serializer):  # type: ignore[type-arg]
    status = serializers.ChoiceField(
        choices=[history.UNFINISHED, *OperationStatus.values],
        required=False,
        help_text='One status, or "unfinished" for every operation not yet over.',
    )
    kind = serializers.ChoiceField(choices=OperationKind.values, required=False)
    broker = serializers.CharField(
        required=False, help_text="Operations that touched this broker: its dead letters, or a move onto it."
    )

    def validate_broker(self, value: str) -> str:
        if value not in selectors.broker_names().values():
            raise serializers.ValidationError(f"No broker named {value[:64]!r}.")
        return value


# Responses ------------------------------------------------------------------------------------------------------


class OperationTargetSerializer(serializers.Serializer):  # type: ignore[type-arg]
    queue = serializers.CharField()
    exchange = serializers.CharField()
    routing_key = serializers.CharField()
    broker = serializers.CharField(allow_null=True, help_text="A move's broker; null: each dead letter's own.")
    display = serializers.CharField(help_text="Where its messages go, in words.")


class OperationCountSerializer(serializers.Serializer):  # type: ignore[type-arg]
    name = serializers.CharField()
    count = serializers.IntegerField()


class OperationPatternCountSerializer(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.IntegerField()
    template = serializers.CharField()
    count = serializers.IntegerField()


class OperationDestinationQueueSerializer(serializers.Serializer):  # type: ignore[type-arg]
    queue = serializers.CharField()
    messages = serializers.IntegerField(help_text="Ready messages when the plan was made.")
    consumers = serializers.IntegerField()


class OperationShedSerializer(serializers.Serializer):  # type: ignore[type-arg]
    queue = serializers.CharField()
    broker = serializers.CharField()
    priority_below = serializers.IntegerField()
    older_than = serializers.IntegerField(allow_null=True, help_text="Seconds; null: any age.")
    limit = serializers.IntegerField(allow_null=True)
    depth = serializers.IntegerField(help_text="Ready messages when the plan was made.")
    consumers = serializers.IntegerField(help_text="Consumers when the plan was made.")
    type = serializers.CharField(help_text="The queue's type (a shed runs on classic queues).")
    max_priority = serializers.IntegerField(allow_null=True, help_text="Its x-max-priority; null: none.")
    examined = serializers.IntegerField(allow_null=True, help_text="Messages its scans looked at.")
    stopped = serializers.CharField(help_text="Why its scan stopped; empty while it runs.")


class OperationBreakdownSerializer(serializers.Serializer):  # type: ignore[type-arg]
    brokers = OperationCountSerializer(many=True)
    queues = OperationCountSerializer(many=True)
    patterns = OperationPatternCountSerializer(many=True)
    destinations = OperationCountSerializer(many=True)
    destination_queues = OperationDestinationQueueSerializer(many=True)
    bindings = serializers.CharField(help_text="Whether the destination exchanges' bindings were checked, and where.")
    shed = OperationShedSerializer(allow_null=True, help_text="A shed's queue, flags and scan; null for other kinds.")


class OperationUnreplayableSerializer(serializers.Serializer):  # type: ignore[type-arg]
    count = serializers.IntegerField()
    reasons = OperationCountSerializer(many=True)


class OperationWarningSerializer(serializers.Serializer):  # type: ignore[type-arg]
    code = serializers.ChoiceField(choices=WARNING_CODES)
    message = serializers.CharField()


class OperationCameBackReasonSerializer(serializers.Serializer):  # type: ignore[type-arg]
    reason = serializers.CharField(
        help_text="Why their boomerangs died: the broker's death reason (`rejected`, `expired`, `maxlen`, "
        "`delivery_limit`), or, for one without (published to the dead-letter queue by an application), its failure "
        "reason as the dead letters' `reason` filter takes it."
    )
    label = serializers.CharField(help_text='In words: "rejected", "queue overflow", "expired (TTL)"...')
    count = serializers.IntegerField()


class OperationProgressSerializer(serializers.Serializer):  # type: ignore[type-arg]
    done = serializers.IntegerField(help_text="Replayed, moved, deleted, archived or restored.")
    failed = serializers.IntegerField()
    skipped = serializers.IntegerField()
    not_attempted = serializers.IntegerField(help_text="Left untouched by a cancel.")
    in_flight = serializers.IntegerField()
    waiting = serializers.IntegerField()
    processed = serializers.IntegerField()
    remaining = serializers.IntegerField()
    fraction = serializers.FloatField(help_text="Share of the plan with an outcome, 0 to 1.")
    came_back = serializers.IntegerField(
        help_text="Replayed messages that died again, each counted once, counted on after the operation paused, was "
        "cancelled or finished."
    )
    came_back_reasons = OperationCameBackReasonSerializer(
        many=True, help_text="Why they came back: why their boomerangs died, commonest first."
    )
    duplicates = serializers.IntegerField(help_text="Published twice after a worker restart.")
    settled = serializers.BooleanField(help_text="Over, with nothing in flight left: the numbers are final.")


class OperationCanarySerializer(serializers.Serializer):  # type: ignore[type-arg]
    size = serializers.IntegerField()
    wait_seconds = serializers.IntegerField()
    until = serializers.DateTimeField(allow_null=True)
    passed = serializers.BooleanField()
    failed = serializers.BooleanField()
    label = serializers.CharField()
    share = serializers.CharField(help_text="What share of the plan the canary is.")


def _shed(plan: dict[str, Any]) -> dict[str, Any] | None:
    if not plan:
        return None
    return {
        "queue": str(plan.get("queue", "")),
        "broker": str(plan.get("broker", "")),
        "priority_below": int(plan.get("priority_below") or 0),
        "older_than": plan.get("older_than"),
        "limit": plan.get("limit"),
        "depth": int(plan.get("depth") or 0),
        "consumers": int(plan.get("consumers") or 0),
        "type": str(plan.get("type", "")),
        "max_priority": plan.get("max_priority"),
        "examined": plan.get("examined"),
        "stopped": str(plan.get("stopped", "")),
    }


class OperationSerializer(Links, serializers.ModelSerializer):  # type: ignore[type-arg]
    api_route = "api-operations-detail"
    page_route = "operations:detail"
    outcome = serializers.SerializerMethodField(help_text="Its state in words, as its page's chip says it.")
    target = serializers.SerializerMethodField()
    unreplayable = serializers.SerializerMethodField()
    breakdown = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField(help_text="What its page says before Start (planned only).")
    confirm_count = serializers.SerializerMethodField(
        help_text="What a start must send as confirm_count (a planned purge); null when nothing is asked."
    )
    progress = serializers.SerializerMethodField()
    eta_seconds = serializers.SerializerMethodField(help_text="Time left, in seconds; null when unknown.")
    waiting_for_worker_since = serializers.SerializerMethodField(
        help_text="Started (or resumed, or sent again by the sweeper) and no worker has taken it yet: since when. "
        "Null otherwise."
    )
    heartbeat_age_seconds = serializers.SerializerMethodField(
        help_text="While a worker holds it (running or in its canary): seconds since that worker last wrote. Null "
        "otherwise."
    )
    worker_note = serializers.SerializerMethodField(
        help_text="The same in words, as its page says it; past DLQ_OPERATION_STALE_SECONDS it says that no worker "
        'took it or that its worker went quiet (the sweeper sends it to the workers again). "" when it is not '
        "running."
    )
    canary = serializers.SerializerMethodField()
    created_by = serializers.SerializerMethodField()
    filter = serializers.DictField(
        read_only=True, help_text="The dead-letter filter it was planned from, as the plan's `filter` takes it."
    )

    class Meta:
        model = Operation
        fields = [
            "id",
            "url",
            "page",
            "kind",
            "status",
            "outcome",
            "automatic",
            "filter",
            "target",
            "total",
            "unreplayable",
            "breakdown",
            "warnings",
            "confirm_count",
            "progress",
            "eta_seconds",
            "waiting_for_worker_since",
            "heartbeat_age_seconds",
            "worker_note",
            "rate",
            "canary",
            "pause_reason",
            "paused_automatically",
            "breaker_wait",
            "breaker_wait_until",
            "last_error",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "items_removed_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "total": {"help_text": "Dead letters in the plan (frozen when it was made)."},
            "breaker_wait": {
                "help_text": "What it waits for while a destination's circuit breaker is open (its task comes back "
                "by itself); empty when it waits for none."
            },
            "breaker_wait_until": {"help_text": "When it looks at that breaker again; null when it waits for none."},
            "items_removed_at": {
                "help_text": "When retention removed its per-message rows (DLQ_FINISHED_RETENTION_DAYS after it "
                "finished); null while they are kept. Its figures stay as its summary."
            },
        }

    def get_outcome(self, operation: Operation) -> str:
        return operation.outcome[0]

    @extend_schema_field(OperationTargetSerializer)
    def get_target(self, operation: Operation) -> dict[str, Any]:
        broker = operation.target_broker
        return {
            "queue": operation.target_queue,
            "exchange": operation.target_exchange,
            "routing_key": operation.target_routing_key,
            "broker": broker.name if broker is not None else None,
            "display": operation.target_display,
        }

    @extend_schema_field(OperationUnreplayableSerializer)
    def get_unreplayable(self, operation: Operation) -> dict[str, Any]:
        return {"count": operation.unreplayable, "reasons": _counts(operation.unreplayable_reasons)}

    @extend_schema_field(OperationBreakdownSerializer)
    def get_breakdown(self, operation: Operation) -> dict[str, Any]:
        breakdown = operation.breakdown or {}
        return {
            "brokers": [{"name": name, "count": count} for name, count in operation.broker_counts],
            "queues": _counts(breakdown.get("queue")),
            "patterns": [
                {"id": row.get("id"), "template": row.get("template", ""), "count": int(row.get("count", 0))}
                for row in breakdown.get("pattern") or []
            ],
            "destinations": _counts(breakdown.get("destination")),
            "destination_queues": [
                {"queue": queue, "messages": messages, "consumers": consumers}
                for queue, messages, consumers in operation.destination_queues
            ],
            "bindings": operation.bindings_note,
            "shed": _shed(operation.shed_plan),
        }

    @extend_schema_field(OperationWarningSerializer(many=True))
    def get_warnings(self, operation: Operation) -> list[dict[str, str]]:
        return [{"code": code, "message": message} for code, message in warnings(operation)]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_confirm_count(self, operation: Operation) -> int | None:
        planned = operation.status == OperationStatus.PLANNED
        return operation.total if planned and operation.kind in services.TYPED_KINDS else None

    @extend_schema_field(OperationProgressSerializer)
    def get_progress(self, operation: Operation) -> dict[str, Any]:
        counted = self.context.get("not_attempted")
        figures = history.figures(operation, not_attempted=None if counted is None else counted.get(operation.pk, 0))
        return {
            **dataclasses.asdict(figures),
            "processed": operation.processed,
            "remaining": operation.remaining,
            "fraction": round(operation.progress, 4),
            "came_back": operation.returned,
            "came_back_reasons": [
                {"reason": reason, "label": words, "count": count}
                for reason, words, count in CameBack.of(operation).rows
            ],
            "duplicates": operation.duplicates,
            "settled": operation.is_finished and not operation.in_flight,
        }

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_eta_seconds(self, operation: Operation) -> int | None:
        eta = operation.eta
        return None if eta is None else round(eta.total_seconds())

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_waiting_for_worker_since(self, operation: Operation) -> str | None:
        since = operation.waiting_for_worker_since
        return serializers.DateTimeField().to_representation(since) if since is not None else None

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_heartbeat_age_seconds(self, operation: Operation) -> int | None:
        watch = watch_worker(operation)
        return watch.heartbeat_age_seconds if watch is not None else None

    def get_worker_note(self, operation: Operation) -> str:
        watch = watch_worker(operation)
        return watch.text if watch is not None else ""

    @extend_schema_field(OperationCanarySerializer)
    def get_canary(self, operation: Operation) -> dict[str, Any]:
        until = operation.canary_until
        return {
            "size": operation.canary_size,
            "wait_seconds": operation.canary_wait_seconds,
            "until": serializers.DateTimeField().to_representation(until) if until is not None else None,
            "passed": operation.canary_passed,
            "failed": operation.canary_failed,
            "label": operation.canary_label,
            "share": operation.canary_share,
        }

    @extend_schema_field(serializers.CharField(allow_null=True, help_text="Who planned it; null: the system."))
    def get_created_by(self, operation: Operation) -> str | None:
        user = operation.created_by
        return user.get_username() if user is not None else None


def _counts(mapping: dict[str, Any] | None) -> list[dict[str, Any]]:
    """{name: count} as rows, biggest first, as the operation page lists them."""
    rows = [{"name": str(name), "count": int(count)} for name, count in (mapping or {}).items()]
    return sorted(rows, key=lambda row: -row["count"])


def warnings(operation: Operation) -> list[tuple[str, str]]:
    """(code, message) of what the operation page says of a plan before its Start: what it spans, what it cannot
    do, what a start must send. Nothing once it has started."""
    if operation.status != OperationStatus.PLANNED:
        return []
    found: list[tuple[str, str]] = []
    kind = operation.get_kind_display().lower()
    if operation.broker_span:
        goes = (
            f"Each message goes to {operation.target_display}."
            if operation.kind == OperationKind.MOVE
            else "Each message goes back to the broker its dead letter came from."
        )
        found.append(("broker_span", f"{operation.broker_span}. {goes}"))
    if operation.total == 0:
        found.append(
            (
                "empty_plan",
                f"Nothing to do: none of the dead letters chosen is in a state a {kind} acts on. A start is refused: "
                "plan again with another filter or status, or cancel this plan.",
            )
        )
    unreplayable = sum(int(count) for count in (operation.unreplayable_reasons or {}).values())
    if operation.nothing_replayable:
        noun = "This message cannot" if operation.total == 1 else f"None of these {operation.total:,} messages can"
        found.append(
            (
                "nothing_replayable",
                f"{noun} be replayed (see unreplayable.reasons). A start is refused: plan again with a destination "
                "that exists, or cancel this plan.",
            )
        )
    elif unreplayable:
        found.append(
            (
                "unreplayable",
                f"{unreplayable:,} of these {operation.total:,} messages cannot be replayed (see "
                "unreplayable.reasons). They will be marked failed.",
            )
        )
    if operation.last_error:
        found.append(("unchecked", operation.last_error))
    idle = [queue for queue, _, consumers in operation.destination_queues if not consumers]
    if idle:
        found.append(
            (
                "no_consumer",
                f"No consumer on {', '.join(idle)}: replayed messages will wait there until one comes.",
            )
        )
    age = timezone.now() - operation.created_at
    if age > services.STALE_PLAN_AGE:
        found.append(
            (
                "stale_plan",
                f"This plan was made {_minutes(age)} ago: dead letters that arrived since are not in it. Start it "
                'with "stale_confirmed": true, or plan again.',
            )
        )
    if operation.kind == OperationKind.PURGE and operation.total:
        found.append(
            (
                "confirm_count",
                f'A purge deletes for good: start it with "confirm_count": {operation.total} (the number of messages).',
            )
        )
    return found


def _minutes(age: dt.timedelta) -> str:
    minutes = int(age.total_seconds() // 60)
    return f"{minutes:,} minute{'' if minutes == 1 else 's'}"
