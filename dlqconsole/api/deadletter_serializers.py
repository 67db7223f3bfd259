"""What the dead-letters resources answer and take: a list row (the columns the list reads, the error message cut
short), one dead letter whole (headers, properties, death history, the chain of records it belongs to, the body
as text or base64), and the filter parameters of the list, made from DeadLetterFilter's fields so that the API, the
messages page and the CLI filter alike."""

from __future__ import annotations

import base64
import typing
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework import serializers

from dlqconsole.api.base import Links
from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailureReason

# A list row carries this many characters of the error message at most (the whole one is in the detail).
ERROR_EXCERPT_CHARS = 300

# What each filter parameter means; the parameters themselves come from DeadLetterFilter.FIELDS.
FILTER_HELP = {
    "pattern": "Failure pattern id.",
    "broker": "Broker name.",
    "queue": "Dead-letter (source) queue or original queue.",
    "reason": "Failure reason, e.g. TIMEOUT (any case).",
    "status": "Status. Without one, archived dead letters are left out.",
    "error_type": "Error type, exactly.",
    "since": "Arrived at or after: an ISO 8601 date/time, or an age like 2h or 7d.",
    "until": "Arrived before: an ISO 8601 date/time, or an age like 30m.",
    "priority": "Priority, or a range like 5-9.",
    "message_id": "Message id (AMQP property), exactly.",
    "correlation_id": "Correlation id (AMQP property), exactly.",
    "ids": "Dead letter id.",
    "host": "Processing host, exactly.",
    "version": "Application version, exactly.",
    "text": "Text in the error type, the error message or the body's first DLQ_SEARCH_BODY_BYTES (any case; 3 "
    "characters or more).",
    "payload": "Text in the body (its UTF-8 bytes). Scans: narrow it with a queue, a pattern or a time range.",
}
FILTER_CHOICES: dict[str, list[str]] = {
    "status": list(DeadLetterStatus.values),
    "reason": list(FailureReason.values),
}


def filter_parameters() -> list[OpenApiParameter]:
    """One query parameter per DeadLetterFilter field, typed as the field is: a list field is repeatable (or
    comma-separated), a text field is one value."""
    hints = typing.get_type_hints(DeadLetterFilter)
    parameters = []
    for name in DeadLetterFilter.FIELDS:
        hint = hints[name]
        many = typing.get_origin(hint) is list
        item = typing.get_args(hint)[0] if many else hint
        help_text = FILTER_HELP.get(name, name.replace("_", " ").capitalize() + ".")
        if many:
            help_text += " Repeat the parameter, or separate values with commas, for any of several."
        parameters.append(
            OpenApiParameter(
                name,
                OpenApiTypes.INT if item is int else OpenApiTypes.STR,
                OpenApiParameter.QUERY,
                description=help_text,
                many=many,
                explode=True if many else None,
                enum=FILTER_CHOICES.get(name),
            )
        )
    return parameters


class DeadLetterLinks(Links):
    api_route = "api-dead-letter-detail"
    page_route = "deadletters:message"


class LinkedDeadLetterSerializer(DeadLetterLinks):
    """Another record of the same message (replayed from, replayed into, edited, identical)."""

    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=DeadLetterStatus.choices)
    ingested_at = serializers.DateTimeField()


# The columns a list row reads; the error message's first characters come as the annotation `error_excerpt`.
ROW_COLUMNS = (
    "id",
    "broker_id",
    "broker__name",
    "source_queue",
    "original_queue",
    "original_exchange",
    "original_routing_keys",
    "status",
    "status_changed_at",
    "failure_reason",
    "death_reason",
    "error_type",
    "pattern_id",
    "message_id",
    "correlation_id",
    "host",
    "app_version",
    "priority",
    "attempt_count",
    "ingested_at",
    "first_failed_at",
    "last_failed_at",
    "body_size",
    "body_truncated",
    "replay_count",
)


class DeadLetterRowSerializer(DeadLetterLinks, serializers.ModelSerializer):
    """A dead letter as the list gives it: what the messages page's table shows and a little more."""

    broker = serializers.CharField(source="broker.name", help_text="The broker it was consumed from.")
    original_routing_keys = serializers.ListField(child=serializers.CharField())
    pattern = serializers.IntegerField(source="pattern_id", help_text="The id of its failure pattern.")
    error_message = serializers.SerializerMethodField(
        help_text=f"The error message; in a list, its first {ERROR_EXCERPT_CHARS} characters (see "
        "error_message_truncated)."
    )
    error_message_truncated = serializers.SerializerMethodField(
        help_text="True when error_message is cut short; the dead letter's own URL has all of it."
    )

    class Meta:
        model = DeadLetter
        fields = [
            "id",
            "url",
            "page",
            "broker",
            "source_queue",
            "original_queue",
            "original_exchange",
            "original_routing_keys",
            "status",
            "status_changed_at",
            "failure_reason",
            "death_reason",
            "error_type",
            "error_message",
            "error_message_truncated",
            "pattern",
            "message_id",
            "correlation_id",
            "host",
            "app_version",
            "priority",
            "attempt_count",
            "ingested_at",
            "first_failed_at",
            "last_failed_at",
            "body_size",
            "body_truncated",
            "replay_count",
        ]

    def get_error_message(self, letter: DeadLetter) -> str:
        excerpt = getattr(letter, "error_excerpt", None)
        return letter.error_message if excerpt is None else excerpt[:ERROR_EXCERPT_CHARS]

    def get_error_message_truncated(self, letter: DeadLetter) -> bool:
        excerpt = getattr(letter, "error_excerpt", None)
        return excerpt is not None and len(excerpt) > ERROR_EXCERPT_CHARS

    def to_representation(self, letter: DeadLetter) -> dict[str, Any]:
        """The row, built directly: what the fields above give (tests compare the two), at a fifth of the cost of
        DRF's field by field walk, which would take most of the time of a page of 500 rows."""
        when = _moments()
        keys = letter.original_routing_keys
        return {
            "id": letter.pk,
            "url": self.link("api-dead-letter-detail", letter.pk),
            "page": self.link("deadletters:message", letter.pk),
            "broker": letter.broker.name,
            "source_queue": letter.source_queue,
            "original_queue": letter.original_queue,
            "original_exchange": letter.original_exchange,
            "original_routing_keys": [None if key is None else str(key) for key in keys] if keys is not None else None,
            "status": letter.status,
            "status_changed_at": when(letter.status_changed_at),
            "failure_reason": letter.failure_reason,
            "death_reason": letter.death_reason,
            "error_type": letter.error_type,
            "error_message": self.get_error_message(letter),
            "error_message_truncated": self.get_error_message_truncated(letter),
            "pattern": letter.pattern_id,
            "message_id": letter.message_id,
            "correlation_id": letter.correlation_id,
            "host": letter.host,
            "app_version": letter.app_version,
            "priority": letter.priority,
            "attempt_count": letter.attempt_count,
            "ingested_at": when(letter.ingested_at),
            "first_failed_at": when(letter.first_failed_at),
            "last_failed_at": when(letter.last_failed_at),
            "body_size": letter.body_size,
            "body_truncated": letter.body_truncated,
            "replay_count": letter.replay_count,
        }


def _moments() -> Any:
    """A function writing a moment as DRF's DateTimeField does: ISO 8601 in the current time zone, UTC as Z."""
    zone = timezone.get_current_timezone()

    def when(moment: Any) -> str | None:
        if moment is None:
            return None
        text: str = moment.astimezone(zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return when


class DeadLetterSerializer(DeadLetterRowSerializer):
    """One dead letter, all of it. Headers and properties are as stored: JSON, with the values JSON cannot hold
    tagged ({"$bytes": base64}, {"$ts": seconds}, {"$dec": "1.50"}, {"$str": base64}, {"$float": "nan"},
    {"$map": [[key, value], ...]}). The body is `body_encoding` "text" (UTF-8) or "base64"; asked as text, a body
    that is not UTF-8 comes as base64 all the same."""

    pattern_template = serializers.CharField(source="pattern.template")
    pattern_url = serializers.SerializerMethodField(help_text="Its failure pattern in the API.")
    headers = serializers.DictField(child=serializers.JSONField())
    properties = serializers.DictField(child=serializers.JSONField())
    x_death = serializers.ListField(
        child=serializers.JSONField(), help_text="The death history (x-death) as delivered, newest first."
    )
    parse_errors = serializers.ListField(child=serializers.JSONField())
    body = serializers.SerializerMethodField(help_text="The body, as body_encoding says.")
    body_encoding = serializers.SerializerMethodField()
    previous = serializers.SerializerMethodField(help_text="The record this one was replayed from.")
    ancestors = serializers.SerializerMethodField(
        help_text="The records this one was replayed from, nearest first (at most 20)."
    )
    boomerangs = serializers.SerializerMethodField(
        help_text="Later records of this message: it was replayed and died again (at most 50)."
    )
    edited_from = serializers.SerializerMethodField(help_text="The record this edited copy was made from.")
    edits = serializers.SerializerMethodField(help_text="Edited copies made from this one (at most 50).")
    identical_to = serializers.SerializerMethodField(
        help_text="The first stored dead letter identical to this one in every byte, when this is a further one."
    )
    identical_copies = serializers.SerializerMethodField(
        help_text="Further dead letters identical to this one in every byte (at most 50)."
    )

    class Meta(DeadLetterRowSerializer.Meta):
        fields = [
            *DeadLetterRowSerializer.Meta.fields,
            "pattern_template",
            "pattern_url",
            "transient",
            "stack_trace",
            "fingerprint",
            "content_type",
            "content_encoding",
            "task_name",
            "task_id",
            "task_retries",
            "next_retry_at",
            "retry_exhausted",
            "headers",
            "properties",
            "x_death",
            "parse_errors",
            "body",
            "body_encoding",
            "previous",
            "ancestors",
            "boomerangs",
            "edited_from",
            "edits",
            "identical_to",
            "identical_copies",
        ]

    _decoded: tuple[int, tuple[str, str]] | None = None

    def to_representation(self, letter: DeadLetter) -> dict[str, Any]:
        # One dead letter: DRF's field by field walk (its fields are many more than a row's, and it is one).
        return serializers.ModelSerializer.to_representation(self, letter)  # type: ignore[no-any-return]

    def _body(self, letter: DeadLetter) -> tuple[str, str]:
        """(body, encoding) as asked: text when asked and the bytes are UTF-8, else base64 (byte-exact). Decoded
        once for both fields."""
        if self._decoded is None or self._decoded[0] != letter.pk:
            self._decoded = (letter.pk, body_as(bytes(letter.body), self.context.get("body", "text")))
        return self._decoded[1]

    @extend_schema_field(OpenApiTypes.URI)
    def get_pattern_url(self, letter: DeadLetter) -> str:
        return self.link("api-pattern-detail", letter.pattern_id)

    def get_body(self, letter: DeadLetter) -> str:
        return self._body(letter)[0]

    @extend_schema_field(serializers.ChoiceField(choices=["text", "base64"]))
    def get_body_encoding(self, letter: DeadLetter) -> str:
        return self._body(letter)[1]

    def _linked(self, key: str) -> Any:
        chain: dict[str, Any] = self.context.get("chain", {})
        return chain.get(key)

    @extend_schema_field(LinkedDeadLetterSerializer(allow_null=True))
    def get_previous(self, letter: DeadLetter) -> Any:
        return self._linked("previous")

    @extend_schema_field(LinkedDeadLetterSerializer(many=True))
    def get_ancestors(self, letter: DeadLetter) -> Any:
        return self._linked("ancestors") or []

    @extend_schema_field(LinkedDeadLetterSerializer(many=True))
    def get_boomerangs(self, letter: DeadLetter) -> Any:
        return self._linked("boomerangs") or []

    @extend_schema_field(LinkedDeadLetterSerializer(allow_null=True))
    def get_edited_from(self, letter: DeadLetter) -> Any:
        return self._linked("edited_from")

    @extend_schema_field(LinkedDeadLetterSerializer(many=True))
    def get_edits(self, letter: DeadLetter) -> Any:
        return self._linked("edits") or []

    @extend_schema_field(LinkedDeadLetterSerializer(allow_null=True))
    def get_identical_to(self, letter: DeadLetter) -> Any:
        return self._linked("identical_to")

    @extend_schema_field(LinkedDeadLetterSerializer(many=True))
    def get_identical_copies(self, letter: DeadLetter) -> Any:
        return self._linked("identical_copies") or []


def body_as(raw: bytes, asked: str) -> tuple[str, str]:
    """(body, encoding): UTF-8 text when text is asked and the bytes are UTF-8, else base64."""
    if asked != "base64":
        try:
            return raw.decode("utf-8"), "text"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(raw).decode("ascii"), "base64"


class BodyQuerySerializer(serializers.Serializer):
    body = serializers.ChoiceField(
        choices=["text", "base64"],
        default="text",
        help_text="text: the body as UTF-8 text when it is UTF-8 (else base64, and body_encoding says so); "
        "base64: always base64, byte for byte.",
    )
