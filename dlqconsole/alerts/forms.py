from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.db.models import Q
from django.utils import timezone

from dlqconsole.alerts.models import (
    CHANNEL_SETTINGS,
    PATTERN_SCOPED_KINDS,
    RULE_DURATION_MAX,
    THRESHOLD_MAX,
    WINDOW_KINDS,
    Alert,
    AlertRule,
    AlertStatus,
    Channel,
    RuleKind,
)
from dlqconsole.alerts.notifiers import NOTIFIERS
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.core.durations import format_duration, parse_duration
from dlqconsole.deadletters.models import DeadLetterCount, FailurePattern
from dlqconsole.ingest.models import WatchedQueue

SILENCE_CHOICES = [
    ("3600", "1 hour"),
    ("14400", "4 hours"),
    ("86400", "1 day"),
    ("604800", "1 week"),
    ("0", "Lift the silence"),
]


MAX_DURATION = RULE_DURATION_MAX


class DurationField(forms.Field):
    """Seconds, entered and shown as a duration (5m, 1h30m). Empty is None."""

    def __init__(self, *, min_seconds: int = 0, **kwargs: Any) -> None:
        self.min_seconds = min_seconds
        kwargs.setdefault("widget", forms.TextInput(attrs={"size": 10, "autocomplete": "off", "spellcheck": "false"}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return format_duration(int(value))
        return value

    def to_python(self, value: Any) -> int | None:
        if value in (None, ""):
            return None
        if isinstance(value, int):
            return value
        try:
            seconds = parse_duration(str(value))
        except ValueError as error:
            raise forms.ValidationError(str(error)) from error
        if seconds > MAX_DURATION:
            raise forms.ValidationError("At most a year.")
        if seconds < self.min_seconds:
            raise forms.ValidationError(f"At least {format_duration(self.min_seconds)}.")
        return seconds


# Which kinds each kind-specific field matters for; the others are ignored (and hidden by static/js/alerts.js).
THRESHOLD_KINDS = frozenset({RuleKind.DLQ_NOT_EMPTY, RuleKind.DLQ_GROWTH, RuleKind.QUEUE_DEPTH})
FIELD_KINDS: dict[str, frozenset[str]] = {
    "pattern": PATTERN_SCOPED_KINDS,
    "threshold": THRESHOLD_KINDS,
    "age": frozenset({RuleKind.OLDEST_AGE}),
    "window_seconds": WINDOW_KINDS,
}
KIND_HELP = {
    RuleKind.DLQ_NOT_EMPTY: "Fires while dead letters wait in a dead-letter queue (or a pattern), parked or not "
    "yet ingested.",
    RuleKind.DLQ_GROWTH: "Fires when more dead letters than the threshold arrive within the window.",
    RuleKind.QUEUE_DEPTH: "Fires when a watched work queue holds too many ready messages (backpressure).",
    RuleKind.NEW_PATTERN: "Fires for a failure pattern first seen within the window, until someone triages it.",
    RuleKind.PATTERN_REOPENED: "Fires when a resolved failure pattern comes back within the window.",
    RuleKind.OLDEST_AGE: "Fires when the oldest parked dead letter has waited longer than the age.",
    RuleKind.OPERATION_PAUSED: "Fires when a retry or move operation pauses itself (canary, boomerangs, errors).",
    RuleKind.BREAKER_OPEN: "Fires when the circuit breaker of a replay destination opens (refusals or boomerangs): "
    "replays into it wait until its probe stays away. Resolves when it closes.",
}
THRESHOLD_HELP = {
    RuleKind.DLQ_NOT_EMPTY: "Dead letters waiting: fires above this many (0: the first one). Empty: 0.",
    RuleKind.DLQ_GROWTH: "New dead letters within the window: fires above this many. Required.",
    RuleKind.QUEUE_DEPTH: "Ready messages: fires at this many or more. Empty: each watched queue's own depth for "
    "the rule's severity (warning, critical or emergency).",
}
# Values a new rule starts with when its kind is chosen, as the form shows them (static/js/alerts.js swaps
# them in when the kind changes and the field was not touched).
KIND_DEFAULTS: dict[str, dict[str, str]] = {
    RuleKind.DLQ_NOT_EMPTY: {"threshold": "0", "for_seconds": "0"},
    RuleKind.DLQ_GROWTH: {"threshold": "100", "window_seconds": "1m", "for_seconds": "0"},
    RuleKind.QUEUE_DEPTH: {"threshold": "", "for_seconds": "30s"},
    RuleKind.NEW_PATTERN: {"window_seconds": "1h", "for_seconds": "0"},
    RuleKind.PATTERN_REOPENED: {"window_seconds": "1h", "for_seconds": "0"},
    RuleKind.OLDEST_AGE: {"age": "1d", "for_seconds": "0"},
    RuleKind.OPERATION_PAUSED: {"for_seconds": "0"},
    RuleKind.BREAKER_OPEN: {"for_seconds": "0"},
}
# The form's sections, in order: (title, fields).
RULE_SECTIONS = [
    ("What", ["name", "kind", "severity", "enabled"]),
    ("Scope", ["broker", "queue", "pattern"]),
    ("When", ["threshold", "age", "window_seconds", "for_seconds"]),
    ("Who to tell", ["channels", "cooldown_seconds", "reminder_seconds"]),
]


def known_queues(broker: Broker | None = None) -> list[str]:
    """Queue names a rule's scope can name: watched work queues, their DLQs, and DLQs holding dead letters (of one
    broker, or of any)."""
    watched = WatchedQueue.objects.all() if broker is None else WatchedQueue.objects.filter(broker=broker)
    counted = DeadLetterCount.objects.all() if broker is None else DeadLetterCount.objects.filter(broker=broker)
    names = set(watched.values_list("name", flat=True))
    names.update(watched.values_list("dead_letter_queue", flat=True))
    names.update(counted.values_list("source_queue", flat=True).distinct())
    return sorted(names)


class BrokerChoiceField(forms.ModelChoiceField[Broker]):
    """A broker, by name in the page (names are what people know and what --broker takes)."""

    def label_from_instance(self, obj: Broker) -> str:
        return obj.name if obj.enabled else f"{obj.name} (disabled)"


class RuleForm(forms.ModelForm[AlertRule]):
    """An alert rule, in four sections. Fields that do not matter for the chosen kind are ignored."""

    kind = forms.ChoiceField(choices=RuleKind.choices, initial=RuleKind.DLQ_NOT_EMPTY, label="Kind")
    broker = BrokerChoiceField(
        queryset=Broker.objects.all(),
        required=False,
        empty_label="Every broker",
        label="Broker",
        help_text="Only this broker's queues (and its dead letters of the pattern); every broker when empty, each "
        "queue of each broker then alerting on its own.",
        error_messages={"invalid_choice": "No such broker: choose one of the list."},
    )
    queue = forms.CharField(
        required=False,
        max_length=255,
        label="Queue",
        help_text="A dead-letter queue or its work queue (either means both); empty for every queue.",
        widget=forms.TextInput(attrs={"list": "known-queues", "autocomplete": "off", "spellcheck": "false"}),
    )
    pattern = forms.ModelChoiceField(
        queryset=FailurePattern.objects.active(),
        required=False,
        widget=forms.NumberInput(attrs={"min": 1}),
        error_messages={
            "invalid_choice": "No such pattern (or it was merged into another): type the number of a "
            "pattern listed on the patterns page."
        },
        label="Pattern id",
        help_text="Only this failure pattern: the number in its address, /patterns/<id>/. Empty for queues.",
    )
    threshold = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=THRESHOLD_MAX,
        label="Threshold (messages)",
        error_messages={
            "min_value": "At least 0.",
            "max_value": f"At most {THRESHOLD_MAX:,} messages (no queue holds more).",
        },
    )
    age = DurationField(
        required=False,
        min_seconds=1,
        label="Older than",
        help_text="How long the oldest parked dead letter may wait, e.g. 30m, 6h, 1d.",
    )
    window_seconds = DurationField(
        required=False,
        min_seconds=1,
        label="Window",
        help_text="Growth: arrivals are counted over this span. Patterns: how recent counts as new. E.g. 1m, 1h.",
    )
    for_seconds = DurationField(
        required=False,
        label="Must hold for",
        help_text="The condition must last this long before the alert fires (0: at once), e.g. 30s, 5m.",
    )
    cooldown_seconds = DurationField(
        required=False,
        label="Cooldown",
        help_text="After a notification, the same rule and subject wait this long before notifying again "
        "(a flapping condition), e.g. 5m.",
    )
    reminder_seconds = DurationField(
        required=False,
        label="Remind every",
        help_text="While an alert fires and nobody has acknowledged it, e.g. 4h; 0 for no reminders.",
    )

    class Meta:
        model = AlertRule
        fields = [
            "name",
            "kind",
            "severity",
            "enabled",
            "broker",
            "queue",
            "pattern",
            "threshold",
            "window_seconds",
            "for_seconds",
            "channels",
            "cooldown_seconds",
            "reminder_seconds",
        ]
        help_texts = {
            "channels": "Where notifications go. No channel: alerts show here but nobody is told.",
            "enabled": "A disabled rule raises no alerts; its open ones end quietly.",
        }
        widgets = {"channels": forms.CheckboxSelectMultiple}

    def __init__(self, *args: Any, kind: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.warnings: list[str] = []
        self.known_queues = known_queues()
        rule = self.instance
        # With the broker default alone there is nothing to choose: the field is carried along, unseen.
        if rule.broker_id is None and len(registry.brokers(enabled=False)) <= 1:
            self.fields["broker"].widget = forms.HiddenInput()
        if rule.pk is not None:
            threshold = int(rule.threshold) if rule.threshold is not None else None
            self.initial["threshold"] = threshold if rule.kind in THRESHOLD_KINDS else None
            self.initial["age"] = threshold if rule.kind == RuleKind.OLDEST_AGE else None
        elif not self.is_bound:
            # A new rule starts from its kind's defaults (?kind= picks the kind without JavaScript).
            chosen = kind if kind in KIND_DEFAULTS else RuleKind.DLQ_NOT_EMPTY
            self.initial.update({"kind": chosen, **KIND_DEFAULTS[chosen]})
        for name, kinds in FIELD_KINDS.items():
            field = self.fields[name]
            field.kinds = " ".join(sorted(kinds))  # type: ignore[attr-defined]
            field.applies_to = ", ".join(str(label) for value, label in RuleKind.choices if value in kinds)  # type: ignore[attr-defined]
        # Fields that do not matter for the posted kind are ignored, whatever they hold: hidden in the browser,
        # left over from another kind, or filled in without JavaScript. Django reads nothing from a disabled field.
        self.ignored = [
            name for name, kinds in FIELD_KINDS.items() if self.is_bound and self.data.get("kind") not in kinds
        ]
        for name in self.ignored:
            self.fields[name].disabled = True
            self.initial[name] = None

    def sections(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [(title, [self[name] for name in names]) for title, names in RULE_SECTIONS]

    def kind_help(self) -> list[tuple[str, str, str]]:
        return [(str(kind), RuleKind(kind).label, text) for kind, text in KIND_HELP.items()]

    def threshold_help(self) -> list[tuple[str, str, str]]:
        return [(str(kind), RuleKind(kind).label, text) for kind, text in THRESHOLD_HELP.items()]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if kind is None:
            return data
        kind_label = RuleKind(kind).label
        # The rule must not keep a scope or threshold its kind does not use.
        if kind not in PATTERN_SCOPED_KINDS:
            if self.data.get("pattern"):
                self.warnings.append(f"The pattern was left out: a “{kind_label}” rule watches queues.")
            data["pattern"] = None
        if kind == RuleKind.OLDEST_AGE:
            if data.get("age") is None and "age" not in self.errors:
                self.add_error("age", "Required: how long the oldest dead letter may wait, e.g. 1d.")
            data["threshold"] = data.get("age")
        elif kind not in THRESHOLD_KINDS:
            data["threshold"] = None
        elif kind == RuleKind.DLQ_GROWTH and data.get("threshold") is None and "threshold" not in self.errors:
            self.add_error("threshold", "Required: how many new dead letters within the window make an alert.")
        elif kind == RuleKind.QUEUE_DEPTH and data.get("threshold") == 0:
            self.add_error("threshold", "At least 1 (0 would fire on an empty queue); empty uses the queue's depths.")
        if kind in WINDOW_KINDS and data.get("window_seconds") is None and "window_seconds" not in self.errors:
            self.add_error("window_seconds", "Required for this kind, e.g. 1m or 1h.")
        elif kind not in WINDOW_KINDS:
            data.pop("window_seconds", None)  # the rule keeps its own value
        for name in ("for_seconds", "cooldown_seconds", "reminder_seconds"):
            if data.get(name) is None:
                data[name] = 0
        if data.get("pattern") is not None and data.get("queue"):
            self.add_error("queue", "Choose a queue or a pattern, not both.")
        self._check_queue(kind, data.get("queue") or "", data.get("broker"))
        return data

    def _check_queue(self, kind: str, queue: str, broker: Broker | None) -> None:
        """A queue nobody knows is allowed (it may be declared later), but probably a typo: say so."""
        if not queue:
            return
        where = f" on broker “{broker.name}”" if broker is not None else ""
        if kind == RuleKind.QUEUE_DEPTH:
            watched = WatchedQueue.objects.filter(Q(name=queue) | Q(dead_letter_queue=queue))
            if broker is not None:
                watched = watched.filter(broker=broker)
            if not watched.exists():
                self.warnings.append(
                    f"No watched queue is named “{queue}”{where}: depth is only sampled for watched queues, so this "
                    "rule cannot fire until it is watched (declare_topology or the admin adds it)."
                )
        elif queue not in (self.known_queues if broker is None else known_queues(broker)):
            self.warnings.append(
                f"No queue named “{queue}” is watched or holds dead letters{where} yet: check the spelling. "
                "The rule watches it once it appears."
            )

    def full_clean(self) -> None:
        super().full_clean()
        # Shown again (after an error), every field can be filled in for whichever kind is chosen next.
        for name in self.ignored:
            self.fields[name].disabled = False


class ChannelForm(forms.ModelForm[Channel]):
    attach_to_all_rules = forms.BooleanField(
        required=False, initial=True, label="Attach to every existing rule", help_text="You can change it per rule."
    )

    class Meta:
        model = Channel
        fields = CHANNEL_SETTINGS
        widgets = {"target": forms.TextInput(attrs={"size": 60})}
        help_texts = {"target": " ".join(f"{n.label}: {n.target_help}" for n in NOTIFIERS.values())}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            del self.fields["attach_to_all_rules"]

    # The target is checked by its kind's notifier in Channel.clean, for this form and the Django admin alike.


class SilenceForm(forms.Form):
    duration = forms.TypedChoiceField(choices=SILENCE_CHOICES, coerce=int, initial="3600")

    def until(self) -> dt.datetime | None:
        seconds = self.cleaned_data["duration"]
        return timezone.now() + dt.timedelta(seconds=seconds) if seconds else None


# At most this many alerts in one bulk action (a page lists far fewer; the cap only bounds a forged request).
BULK_MAX = 1000


class IdListField(forms.Field):
    """Repeated `ids` values, as whole numbers."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        values = [str(item).strip() for item in value or []]
        if not all(item.isascii() and item.isdigit() for item in values):
            raise forms.ValidationError("Alert ids are whole numbers.")
        return list(dict.fromkeys(int(item) for item in values))


class BulkAlertForm(SilenceForm):
    """Acknowledge or silence the ticked alerts, or every firing one."""

    action = forms.ChoiceField(choices=[("acknowledge", "Acknowledge"), ("silence", "Silence")])
    scope = forms.ChoiceField(
        choices=[("selected", "Ticked alerts"), ("firing", "All firing alerts")], initial="selected"
    )
    ids = IdListField(required=False)
    # The firing alerts the page showed: "all firing" means those, not one that fired after the page was drawn.
    shown = IdListField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["duration"].required = False

    def clean_ids(self) -> list[int]:
        return self.cleaned_data["ids"][:BULK_MAX]

    def clean_shown(self) -> list[int]:
        return self.cleaned_data["shown"][:BULK_MAX]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scope") == "selected" and not data.get("ids"):
            raise forms.ValidationError("Tick the alerts to act on, or choose all firing alerts.")
        if data.get("action") == "silence" and data.get("duration") in (None, ""):
            self.add_error("duration", "Choose how long to silence the alerts.")
        return data

    def alerts(self) -> list[Alert]:
        if self.cleaned_data["scope"] == "firing":
            chosen = Alert.objects.filter(status=AlertStatus.FIRING, pk__in=self.cleaned_data["shown"])
        else:
            chosen = Alert.objects.filter(pk__in=self.cleaned_data["ids"])
        return list(chosen.select_related("rule").order_by("pk")[:BULK_MAX])
