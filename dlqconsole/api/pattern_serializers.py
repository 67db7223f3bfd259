"""What the patterns resources answer and take: a pattern as the list gives it, one pattern with its counts and
history, the list's filters (those of the patterns page), and the bodies of triage, merge and split with their
answers."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from dlqconsole.api.base import Links, StrictSerializer
from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.models import FailurePattern, FailureReason, PatternEvent, PatternStatus

# The owner filter's words besides a username.
OWNER_WORDS = ("me", "none")


class PatternSerializer(Links, serializers.ModelSerializer):
    """A failure pattern: what groups its dead letters, its triage, and how many of them wait."""

    api_route = "api-pattern-detail"
    page_route = "deadletters:pattern"
    dead_letters = serializers.SerializerMethodField(help_text="Its dead letters in the API (the list, filtered).")
    owner = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who owns it (a username), or null."
    )
    merged_into = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True, help_text="The pattern that absorbed it in a merge, or null."
    )
    waiting = serializers.SerializerMethodField(
        help_text="Dead letters waiting (parked, scheduled or failed); with ?broker=, on that broker."
    )
    queues = serializers.SerializerMethodField(
        help_text="The queues they wait in (named with their broker where there are several)."
    )
    is_new = serializers.BooleanField(read_only=True, help_text="First seen within the last hour.")

    class Meta:
        model = FailurePattern
        fields = [
            "id",
            "url",
            "page",
            "dead_letters",
            "template",
            "error_type",
            "failure_reason",
            "transient",
            "origin",
            "status",
            "status_changed_at",
            "owner",
            "note",
            "total_count",
            "waiting",
            "queues",
            "first_seen_at",
            "last_seen_at",
            "is_new",
            "merged_into",
            "merged_at",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.URI)
    def get_dead_letters(self, pattern: FailurePattern) -> str:
        return reverse("api-dead-letter-list", request=self.context.get("request")) + f"?pattern={pattern.pk}"

    def get_waiting(self, pattern: FailurePattern) -> int:
        waiting: dict[int, int] = self.context.get("waiting", {})
        return int(getattr(pattern, "waiting", waiting.get(pattern.pk, 0)) or 0)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_queues(self, pattern: FailurePattern) -> list[str]:
        queues: dict[int, list[str]] = self.context.get("queues", {})
        return queues.get(pattern.pk, [])


class PatternEventSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = PatternEvent
        fields = ["kind", "from_status", "to_status", "detail", "actor", "created_at"]
        read_only_fields = fields


class PatternDetailSerializer(PatternSerializer):
    """One pattern with its counts: per status (every broker), waiting per broker, and the arrivals of the last
    24 hours; its latest history, and the patterns merged into it."""

    counts = serializers.SerializerMethodField(help_text="Dead letters per status, on every broker.")
    waiting_by_broker = serializers.SerializerMethodField(help_text="Dead letters waiting, per broker name.")
    trend = serializers.SerializerMethodField(help_text="Arrivals per hour over the last 24 hours, oldest first.")
    events = serializers.SerializerMethodField(help_text="Its history, newest first (at most 50 events).")
    absorbed = serializers.SerializerMethodField(help_text="Ids of the patterns merged into it (at most 50).")

    class Meta(PatternSerializer.Meta):
        fields = [*PatternSerializer.Meta.fields, "counts", "waiting_by_broker", "trend", "events", "absorbed"]
        read_only_fields = fields

    def _detail(self, pattern: FailurePattern) -> dict[str, Any]:
        details: dict[int, dict[str, Any]] = self.context.get("details", {})
        return details.get(pattern.pk, {})

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_counts(self, pattern: FailurePattern) -> dict[str, int]:
        return self._detail(pattern).get("counts", {})  # type: ignore[no-any-return]

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_waiting_by_broker(self, pattern: FailurePattern) -> dict[str, int]:
        return self._detail(pattern).get("waiting_by_broker", {})  # type: ignore[no-any-return]

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_trend(self, pattern: FailurePattern) -> list[int]:
        return self._detail(pattern).get("trend", [])  # type: ignore[no-any-return]

    @extend_schema_field(PatternEventSerializer(many=True))
    def get_events(self, pattern: FailurePattern) -> Any:
        return PatternEventSerializer(self._detail(pattern).get("events", []), many=True).data

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_absorbed(self, pattern: FailurePattern) -> list[int]:
        return self._detail(pattern).get("absorbed", [])  # type: ignore[no-any-return]


# Requests ---------------------------------------------------------------------------------------------------------


# The orders the pattern list pages by cursor: the first field is the cursor's position (a whole number, as the
# cursor check wants), ties are paged by the cursor's offset and end on the id.
PATTERN_ORDERS = {"newest": ("-id",), "waiting": ("-waiting", "-id"), "total": ("-total_count", "-id")}


class PatternFilterSerializer(serializers.Serializer):
    """The patterns page's filters."""

    status = serializers.ChoiceField(
        choices=["active", *PatternStatus.values],
        required=False,
        help_text='A triage status, or "active" for open and acknowledged ones.',
    )
    reason = serializers.ChoiceField(choices=FailureReason.values, required=False, help_text="Failure reason.")
    queue = serializers.CharField(required=False, help_text="Only patterns with dead letters in this source queue.")
    broker = serializers.CharField(
        required=False,
        help_text="Only patterns with dead letters on this broker; `waiting` then counts that broker's.",
    )
    q = serializers.CharField(required=False, help_text="Text in the template or the error type (any case).")
    owner = serializers.CharField(required=False, help_text='"me", "none" (nobody owns it) or a username.')
    sort = serializers.ChoiceField(
        choices=list(PATTERN_ORDERS),
        required=False,
        help_text='"newest" (the default), "waiting" (most dead letters waiting first: the ones to look at in an '
        'incident) or "total" (most dead letters ever first). Cursors page through any of them.',
    )

    def validate_broker(self, value: str) -> str:
        if not Broker.objects.filter(name=value).exists():
            known = ", ".join(Broker.objects.values_list("name", flat=True)) or "none"
            raise serializers.ValidationError(f"No broker named {value[:64]!r} (known: {known}).")
        return value

    def validate_owner(self, value: str) -> str:
        if value not in OWNER_WORDS and not get_user_model().objects.filter(username=value).exists():
            raise serializers.ValidationError(f'No user named {value[:150]!r}; or use "me" or "none".')
        return value


class TriageSerializer(StrictSerializer):
    """Any of a status, an owner and a note; what is left out stays as it is."""

    status = serializers.ChoiceField(choices=PatternStatus.choices, required=False)
    owner = serializers.CharField(
        required=False, allow_null=True, help_text="A username (an active operator or admin), or null for nobody."
    )
    note = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, help_text="Replaces the note; empty clears it."
    )

    def validate_owner(self, value: str | None) -> Any:
        if value is None:
            return None
        owner = get_user_model().objects.filter(username=value).first()
        if owner is None:
            raise serializers.ValidationError(f"No user named {value[:150]!r}.")
        return owner

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Send at least one of status, owner and note.")
        return attrs


class MergeSerializer(StrictSerializer):
    target = serializers.IntegerField(min_value=1, help_text="The pattern that absorbs the others.")
    sources = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        min_length=1,
        max_length=1000,
        help_text="The patterns merged into the target (their dead letters, counts and fingerprints move there).",
    )
    preview = serializers.BooleanField(
        default=False, help_text="Only say what the merge would do (how many move, what differs); merge nothing."
    )


class SplitSerializer(StrictSerializer):
    name = serializers.CharField(
        max_length=200, help_text="The rule's name; the new pattern's template. No other rule or pattern has it."
    )
    regex = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        trim_whitespace=False,
        help_text="A Python regular expression searched in the error message and in 'ErrorType: message' (or in "
        "the header's value when a header is named).",
    )
    header = serializers.CharField(
        required=False, default="", allow_blank=True, help_text="Match this message header (any case) instead."
    )
    preview = serializers.BooleanField(
        default=False, help_text="Only count what the rule would take (of the newest 10,000); split nothing."
    )


# Answers ----------------------------------------------------------------------------------------------------------


class MergeResultSerializer(serializers.Serializer):
    merged = serializers.BooleanField(help_text="False for a preview.")
    target = PatternDetailSerializer()
    sources = PatternSerializer(many=True, help_text="The sources, after the merge (merged_into set).")
    moved = serializers.IntegerField(allow_null=True, help_text="Dead letters moved; null for a preview.")
    moving = serializers.IntegerField(help_text="Dead letters the sources held before the merge, in all.")
    warnings = serializers.ListField(child=serializers.CharField(), help_text="What differs between them.")


class SplitExampleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    error_message = serializers.CharField()


class SplitPreviewSerializer(serializers.Serializer):
    matching = serializers.IntegerField(help_text="Dead letters the rule matches, among those examined.")
    examined = serializers.IntegerField(help_text="The pattern's newest dead letters examined.")
    exact = serializers.BooleanField(help_text="Every dead letter of the pattern was examined.")
    splits = serializers.BooleanField(help_text="The rule takes some but not all: a split would be made.")
    examples = SplitExampleSerializer(many=True)


class SplitResultSerializer(serializers.Serializer):
    split = serializers.BooleanField(help_text="False for a preview.")
    pattern = PatternDetailSerializer(help_text="The pattern split, after the split.")
    part = PatternDetailSerializer(allow_null=True, help_text="The new pattern; null for a preview.")
    preview = SplitPreviewSerializer(allow_null=True, help_text="What the rule would take; null after a split.")
