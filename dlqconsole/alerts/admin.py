from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.roles import ADMIN
from dlqconsole.alerts.channel_secrets import reveal_signing_secret
from dlqconsole.alerts.models import PATTERN_SCOPED_KINDS, Alert, AlertRule, Channel, Notification, RuleKind


def rule_problems(*, kind: str, threshold: float | None, pattern: Any, queue: str) -> list[tuple[str, str]]:
    """(field, message) for a rule that would fire on nothing, or never: what the console's rule form refuses,
    for the admin, whose form shows every field whatever the kind."""
    problems: list[tuple[str, str]] = []
    if kind == RuleKind.OLDEST_AGE and threshold is None:
        problems.append(("threshold", "Required for this kind: how long the oldest dead letter may wait, in seconds."))
    elif kind == RuleKind.DLQ_GROWTH and threshold is None:
        problems.append(("threshold", "Required for this kind: how many new dead letters within the window alert."))
    elif kind == RuleKind.QUEUE_DEPTH and threshold == 0:
        problems.append(("threshold", "At least 1 (0 would fire on an empty queue); empty uses the queue's depths."))
    if pattern is not None and queue:
        problems.append(("queue", "Choose a queue or a pattern, not both."))
    if pattern is not None and kind not in PATTERN_SCOPED_KINDS:
        problems.append(("pattern", "This kind watches queues: leave the pattern empty."))
    return problems


class AlertRuleAdminForm(forms.ModelForm[AlertRule]):
    class Meta:
        model = AlertRule
        fields = [
            "name",
            "kind",
            "broker",
            "queue",
            "pattern",
            "threshold",
            "window_seconds",
            "for_seconds",
            "severity",
            "channels",
            "cooldown_seconds",
            "reminder_seconds",
            "enabled",
            "silenced_until",
            "created_at",
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for field, message in rule_problems(
            kind=data.get("kind") or "",
            threshold=data.get("threshold"),
            pattern=data.get("pattern"),
            queue=data.get("queue") or "",
        ):
            self.add_error(field, message)
        return data


@admin.register(AlertRule)
class AlertRuleAdmin(AuditedModelAdmin[AlertRule]):
    # Rules are the admin role's, as on the console's rule pages (which refuse other roles).
    view_role = ADMIN
    form = AlertRuleAdminForm
    list_display = ["name", "kind", "broker", "queue", "pattern", "threshold", "severity", "enabled", "silenced_until"]
    list_filter = ["kind", "broker", "severity", "enabled"]
    list_select_related = ["broker", "pattern"]
    search_fields = ["name", "queue"]
    raw_id_fields = ["pattern"]
    filter_horizontal = ["channels"]


@admin.register(Channel)
class ChannelAdmin(AuditedModelAdmin[Channel]):
    # A webhook target carries its token: admins only, as on the console's channel pages.
    view_role = ADMIN
    list_display = ["name", "kind", "enabled", "disabled_reason", "sent_count", "failed_count"]
    list_filter = ["kind", "enabled"]
    # The signing secret is no field of the form (it is not editable): "signature" only says where to rotate it.
    readonly_fields = [
        "signature",
        "sent_count",
        "failed_count",
        "failure_streak",
        "disabled_at",
        "notice_window_ends_at",
        "notice_window_sent",
        "notice_window_rules",
    ]

    @admin.display(description="Signature")
    def signature(self, obj: Channel) -> str:
        if obj.pk is None:
            return "Webhook and Slack-compatible channels get a signing secret, shown once after saving."
        if not obj.is_signed:
            return "E-mail is not signed."
        return format_html(
            "Signed with the channel's secret, shown once when the channel was made or its secret rotated. "
            '<a href="{}">Rotate it on the channel\'s page</a> to see a new one.',
            reverse("alerts:channel", args=[obj.pk]),
        )

    def save_model(self, request: HttpRequest, obj: Channel, form: Any, change: bool) -> None:
        # An edit writes what the form edits: the tick may have moved the budget and counters since it was read.
        if change:
            obj.save(update_fields=[name for name in form.fields if name not in self.readonly_fields])
        else:
            obj.save()

    def response_add(self, request: HttpRequest, obj: Channel, post_url_continue: str | None = None) -> HttpResponse:
        # The secret is shown once, on the console's page of the new channel: the admin's own pages never show it.
        if not obj.is_signed:
            return super().response_add(request, obj, post_url_continue)
        reveal_signing_secret(request, obj)
        messages.success(request, "Channel added. Its signing secret is shown below, this once.")
        return redirect("alerts:channel", pk=obj.pk)


@admin.register(Alert)
class AlertAdmin(AuditedModelAdmin[Alert]):
    list_display = ["rule", "subject_label", "severity", "status", "started_at", "fired_at", "resolved_at"]
    list_filter = ["status", "severity", "rule"]
    search_fields = ["subject", "subject_label", "summary"]
    readonly_fields = [field.name for field in Alert._meta.fields]

    def has_add_permission(self, request: object) -> bool:  # type: ignore[override]
        return False


@admin.register(Notification)
class NotificationAdmin(AuditedModelAdmin[Notification]):
    # Send errors and contexts of channels: admins only, as on the console's channel pages.
    view_role = ADMIN
    list_display = ["created_at", "channel", "kind", "status", "attempts", "error"]
    list_filter = ["status", "kind", "channel"]
    readonly_fields = [field.name for field in Notification._meta.fields]

    def has_add_permission(self, request: object) -> bool:  # type: ignore[override]
        return False
