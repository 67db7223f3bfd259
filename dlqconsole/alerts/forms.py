from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.utils import timezone

from dlqconsole.alerts.models import (
    PATTERN_SCOPED_KINDS,
    THRESHOLD_HELP,
    WINDOW_KINDS,
    Alert,
    AlertRule,
    AlertStatus,
    Channel,
    RuleKind,
)
from dlqconsole.alerts.notifiers import NOTIFIERS
from dlqconsole.deadletters.models import FailurePattern

SILENCE_CHOICES = [
    ("3600", "1 hour"),
    ("14400", "4 hours"),
    ("86400", "1 day"),
    ("604800", "1 week"),
    ("0", "Lift the silence"),
]


class RuleForm(forms.ModelForm[AlertRule]):
    pattern = forms.ModelChoiceField(
        queryset=FailurePattern.objects.active(),
        required=False,
        widget=forms.NumberInput(attrs={"min": 1}),
        label="Pattern id",
        help_text="Only this pattern (leave empty for queues).",
    )

    class Meta:
        model = AlertRule
        fields = [
            "name",
            "kind",
            "severity",
            "queue",
            "pattern",
            "threshold",
            "window_seconds",
            "for_seconds",
            "cooldown_seconds",
            "reminder_seconds",
            "channels",
            "enabled",
        ]
        labels = {
            "queue": "Queue",
            "window_seconds": "Window (s)",
            "for_seconds": "Must hold for (s)",
            "cooldown_seconds": "Cooldown (s)",
            "reminder_seconds": "Remind every (s)",
        }
        help_texts = {
            "queue": "A DLQ or work queue name; empty for every queue.",
            "threshold": " ".join(f"{RuleKind(kind).label}: {text}" for kind, text in THRESHOLD_HELP.items()),
            "window_seconds": "Growth: arrivals counted over this window. Patterns: how recent counts as new.",
            "reminder_seconds": "While firing and not acknowledged; 0 for no reminders.",
        }
        widgets = {"channels": forms.CheckboxSelectMultiple}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if data.get("pattern") is not None and kind not in PATTERN_SCOPED_KINDS:
            self.add_error("pattern", "This kind of rule watches queues or patterns on its own; leave it empty.")
        if data.get("pattern") is not None and data.get("queue"):
            self.add_error("queue", "Choose a queue or a pattern, not both.")
        for name in ("threshold", "for_seconds", "cooldown_seconds", "reminder_seconds"):
            value = data.get(name)
            if value is not None and value < 0:
                self.add_error(name, "Must not be negative.")
        window = data.get("window_seconds")
        if kind in WINDOW_KINDS and (window is None or window < 1):
            self.add_error("window_seconds", "At least 1 second.")
        return data


class ChannelForm(forms.ModelForm[Channel]):
    attach_to_all_rules = forms.BooleanField(
        required=False, initial=True, label="Attach to every existing rule", help_text="You can change it per rule."
    )

    class Meta:
        model = Channel
        fields = ["name", "kind", "target"]
        widgets = {"target": forms.TextInput(attrs={"size": 60})}
        help_texts = {"target": " ".join(f"{n.label}: {n.target_help}" for n in NOTIFIERS.values())}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            del self.fields["attach_to_all_rules"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        notifier = NOTIFIERS.get(data.get("kind") or "")
        target = data.get("target")
        if notifier is not None and target is not None:
            try:
                data["target"] = notifier.clean_target(target)
            except forms.ValidationError as error:
                self.add_error("target", error)
        return data


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
        if not all(item.isdigit() for item in values):
            raise forms.ValidationError("Alert ids are whole numbers.")
        return list(dict.fromkeys(int(item) for item in values))


class BulkAlertForm(SilenceForm):
    """Acknowledge or silence the ticked alerts, or every firing one."""

    action = forms.ChoiceField(choices=[("acknowledge", "Acknowledge"), ("silence", "Silence")])
    scope = forms.ChoiceField(
        choices=[("selected", "Ticked alerts"), ("firing", "All firing alerts")], initial="selected"
    )
    ids = IdListField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["duration"].required = False

    def clean_ids(self) -> list[int]:
        return self.cleaned_data["ids"][:BULK_MAX]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scope") == "selected" and not data.get("ids"):
            raise forms.ValidationError("Tick the alerts to act on, or choose all firing alerts.")
        if data.get("action") == "silence" and data.get("duration") in (None, ""):
            self.add_error("duration", "Choose how long to silence the alerts.")
        return data

    def alerts(self) -> list[Alert]:
        if self.cleaned_data["scope"] == "firing":
            chosen = Alert.objects.filter(status=AlertStatus.FIRING)
        else:
            chosen = Alert.objects.filter(pk__in=self.cleaned_data["ids"])
        return list(chosen.select_related("rule").order_by("pk")[:BULK_MAX])
