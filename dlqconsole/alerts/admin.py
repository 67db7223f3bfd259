from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.roles import ADMIN
from dlqconsole.alerts.models import Alert, AlertRule, Channel, Notification


@admin.register(AlertRule)
class AlertRuleAdmin(AuditedModelAdmin[AlertRule]):
    list_display = ["name", "kind", "queue", "pattern", "threshold", "severity", "enabled", "silenced_until"]
    list_filter = ["kind", "severity", "enabled"]
    search_fields = ["name", "queue"]
    raw_id_fields = ["pattern"]
    filter_horizontal = ["channels"]


@admin.register(Channel)
class ChannelAdmin(AuditedModelAdmin[Channel]):
    # A webhook target carries its token: admins only, as on the console's channel pages.
    view_role = ADMIN
    list_display = ["name", "kind", "enabled", "disabled_reason", "sent_count", "failed_count"]
    list_filter = ["kind", "enabled"]
    readonly_fields = [
        "sent_count",
        "failed_count",
        "failure_streak",
        "disabled_at",
        "notice_window_ends_at",
        "notice_window_sent",
        "notice_window_rules",
    ]

    def save_model(self, request: HttpRequest, obj: Channel, form: Any, change: bool) -> None:
        # An edit writes what the form edits: the tick may have moved the budget and counters since it was read.
        if change:
            obj.save(update_fields=[name for name in form.fields if name not in self.readonly_fields])
        else:
            obj.save()


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
