"""What the alerts resources read and answer: an alert as JSON, the list's filter, and the body of a silence."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dlqconsole.alerts.forms import MAX_DURATION
from dlqconsole.alerts.models import OPEN_STATUSES, Alert, AlertQuerySet, AlertRule, AlertStatus, Severity
from dlqconsole.api.base import Links, StrictSerializer
from dlqconsole.brokers.models import NAME_PATTERN as BROKER_NAME
from dlqconsole.core.durations import format_duration, parse_duration
from dlqconsole.deadletters.filters import FilterError, broker_ids

# `state`: an alert's status, or a group of them as the alerts page shows them.
STATES = {
    "pending": "the condition holds, not yet for the rule's duration; nothing was sent",
    "firing": "firing and not acknowledged",
    "acknowledged": "someone is on it: no more reminders",
    "resolved": "the condition cleared (the page's history)",
    "active": "firing or acknowledged (the page's current alerts)",
    "open": "pending, firing or acknowledged",
    "silenced": "open, and silenced now (the alert itself or its whole rule)",
}


class AlertRuleRefSerializer(serializers.ModelSerializer):
    class Meta:
        model = AlertRule
        fields = ["id", "name", "kind", "severity", "silenced_until"]
        read_only_fields = fields


class AlertSerializer(Links, serializers.ModelSerializer):
    api_route = "api-alert-detail"
    page_route = "alerts:detail"
    rule = AlertRuleRefSerializer(read_only=True)
    broker = serializers.CharField(
        source="broker_name",
        read_only=True,
        help_text="The broker the alert is about: its queue's, else its rule's; empty for an alert of no one broker.",
    )
    acknowledged_by = serializers.SerializerMethodField(help_text="Who acknowledged it (a user name), or null.")
    link = serializers.SerializerMethodField(
        help_text="What the alert is about in the console (a queue's messages, a pattern), absolute; empty if none."
    )
    silence_ends = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="When the silence on the alert or on its whole rule ends (the later), or null when neither is "
        "silenced now: a silenced alert still fires and shows, but nobody is told.",
    )

    class Meta:
        model = Alert
        fields = [
            "id",
            "url",
            "page",
            "rule",
            "subject",
            "subject_label",
            "broker",
            "severity",
            "status",
            "value",
            "summary",
            "link",
            "started_at",
            "fired_at",
            "acknowledged_at",
            "acknowledged_by",
            "resolved_at",
            "silenced_until",
            "silence_ends",
            "last_notified_at",
            "notified_count",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "subject": {"help_text": 'What the alert is about: "queue:orders.dlq", "queue@staging:x", "pattern:12".'},
            "silenced_until": {"help_text": "The alert's own silence (the rule's is `rule.silenced_until`)."},
        }

    def get_link(self, alert: Alert) -> str:
        request = self.context.get("request")
        return request.build_absolute_uri(alert.link) if request is not None and alert.link else alert.link

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_acknowledged_by(self, alert: Alert) -> str | None:
        user = alert.acknowledged_by
        return user.get_username() if user is not None else None


class AlertFilterSerializer(serializers.Serializer):
    """The list's query parameters (every one optional; together they narrow)."""

    state = serializers.ChoiceField(
        choices=list(STATES),
        required=False,
        help_text="; ".join(f"`{name}`: {meaning}" for name, meaning in STATES.items()) + ".",
    )
    rule = serializers.IntegerField(min_value=1, required=False, help_text="A rule's id.")
    severity = serializers.ChoiceField(choices=Severity.choices, required=False)
    broker = serializers.RegexField(
        BROKER_NAME,
        required=False,
        help_text="A broker's name: alerts about its queues, and those of rules scoped to it.",
    )
    subject = serializers.CharField(
        required=False, max_length=300, help_text='A subject key, exactly: "queue:orders.dlq", "pattern:12".'
    )

    def validate_broker(self, value: str) -> str:
        """A name no broker has is refused, naming those there are (as the other lists do): an empty list would
        read as "nothing firing there"."""
        try:
            broker_ids([value])
        except FilterError as problem:
            raise serializers.ValidationError(str(problem)) from None
        return value

    def narrow(self, alerts: AlertQuerySet) -> AlertQuerySet:
        chosen = self.validated_data
        state = chosen.get("state")
        if state == "active":
            alerts = alerts.filter(status__in=(AlertStatus.FIRING, AlertStatus.ACKNOWLEDGED))
        elif state == "open":
            alerts = alerts.filter(status__in=OPEN_STATUSES)
        elif state == "silenced":
            now = timezone.now()
            silenced = Q(silenced_until__gt=now) | Q(rule__silenced_until__gt=now)
            alerts = alerts.filter(silenced, status__in=OPEN_STATUSES)
        elif state:
            alerts = alerts.filter(status=state)
        if "rule" in chosen:
            alerts = alerts.filter(rule_id=chosen["rule"])
        if "severity" in chosen:
            alerts = alerts.filter(severity=chosen["severity"])
        if "broker" in chosen:
            alerts = alerts.about_broker(chosen["broker"])
        if "subject" in chosen:
            alerts = alerts.filter(subject=chosen["subject"])
        return alerts


class SilenceSerializer(StrictSerializer):
    """`{"for": "2h"}` or `{"until": "2026-11-26T18:00:00Z"}`; `{"for": "0"}` lifts the silence, as the page's
    "Lift the silence" does."""

    until = serializers.DateTimeField(required=False, help_text="Silence until this moment (ISO 8601).")
    duration = serializers.CharField(
        required=False,
        max_length=40,
        help_text=f"Silence for this long from now: 90s, 30m, 2h, 1d, 1w (at most {format_duration(MAX_DURATION)}); "
        '"0" lifts the silence.',
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        # The body names it `for`, a word Python keeps for itself.
        fields = super().get_fields()
        fields["for"] = fields.pop("duration")
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("until" in attrs) == ("for" in attrs):
            raise serializers.ValidationError('Send either "until" (a moment) or "for" (a duration such as 2h).')
        now = timezone.now()
        if "for" in attrs:
            try:
                seconds = parse_duration(attrs["for"])
            except ValueError as problem:
                raise serializers.ValidationError({"for": str(problem)}) from None
            if seconds > MAX_DURATION:
                raise serializers.ValidationError({"for": f"At most {format_duration(MAX_DURATION)}."})
            return {"until": now + dt.timedelta(seconds=seconds) if seconds else None}
        until = attrs["until"]
        if until <= now:
            raise serializers.ValidationError({"until": 'This moment has passed; "for": "0" lifts the silence.'})
        if until - now > dt.timedelta(seconds=MAX_DURATION):
            raise serializers.ValidationError({"until": f"At most {format_duration(MAX_DURATION)} from now."})
        return {"until": until}
