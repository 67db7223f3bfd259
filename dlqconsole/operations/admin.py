"""Admin for operations (read-only, with pause / resume / cancel), their items, retry policies and the thresholds of
circuit breakers.

Operations change only through the services (which keep the counters and write the audit log), so their admin
pages are views with actions; retry policies are configuration, edited by admins, and every change is audited.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.deadletters.admin import DeadLetterAdmin
from dlqconsole.deadletters.models import FailureReason
from dlqconsole.operations.admin_actions import DEAD_LETTER_ACTIONS
from dlqconsole.operations.breakers import BreakerSetting, breaker_views
from dlqconsole.operations.models import MAX_RETRY_DELAY_SECONDS, Operation, OperationItem, RetryPolicy
from dlqconsole.operations.services import (
    OperationError,
    cancel_operation,
    close_breaker,
    pause_operation,
    resume_operation,
)

# The bulk actions of the dead letters' admin (retry, move, archive, restore, purge the selected ones) are
# operations; deadletters cannot import this app, so they are added to its admin here, when the admins load.
DeadLetterAdmin.actions = [*DeadLetterAdmin.actions, *DEAD_LETTER_ACTIONS]


class ReadOnlyAdmin(AuditedModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _control(request: HttpRequest, queryset: QuerySet[Operation], verb: str, service: Any) -> None:
    done, refused = 0, []
    for operation in queryset:
        try:
            service(operation=operation, actor=request.user)
            done += 1
        except (OperationError, PermissionDenied) as error:
            refused.append(f"#{operation.pk}: {error}")
    if done:
        messages.success(request, f"{verb} {done} operation(s).")
    for text in refused:
        messages.warning(request, text)


@admin.action(description="Pause selected operations")
def pause_selected(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Operation]) -> None:
    _control(request, queryset, "Paused", pause_operation)


@admin.action(description="Resume selected operations")
def resume_selected(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Operation]) -> None:
    _control(request, queryset, "Resumed", resume_operation)


@admin.action(description="Cancel selected operations")
def cancel_selected(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Operation]) -> None:
    _control(request, queryset, "Cancelled", cancel_operation)


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "kind",
        "status",
        "total",
        "succeeded",
        "failed",
        "skipped",
        "rate",
        "created_by",
        "created_at",
    ]
    list_filter = ["status", "kind", "automatic"]
    ordering = ["-created_at"]
    actions = [pause_selected, resume_selected, cancel_selected]
    show_full_result_count = False
    readonly_fields = [
        "kind",
        "status",
        "pause_reason",
        "last_error",
        "filter_json",
        "target_broker",
        "target_queue",
        "target_exchange",
        "target_routing_key",
        "rate",
        "canary_size",
        "canary_wait_seconds",
        "canary_until",
        "canary_passed",
        "canary_failed",
        "max_return_share",
        "automatic",
        "total",
        "succeeded",
        "failed",
        "skipped",
        "in_flight",
        "duplicates",
        "returned",
        "unreplayable",
        "unreplayable_json",
        "breakdown_json",
        "items_link",
        "created_by",
        "created_at",
        "started_at",
        "finished_at",
        "heartbeat_at",
    ]
    fields = tuple(readonly_fields)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Controlling operations is an operator's job; viewers only look.
        return super().get_actions(request) if has_role(request.user, OPERATOR) else {}

    @admin.display(description="filter")
    def filter_json(self, obj: Operation) -> str:
        return _pre(obj.filter)

    @admin.display(description="breakdown")
    def breakdown_json(self, obj: Operation) -> str:
        return _pre(obj.breakdown)

    @admin.display(description="why not replayable")
    def unreplayable_json(self, obj: Operation) -> str:
        return _pre(obj.unreplayable_reasons) if obj.unreplayable_reasons else "-"

    @admin.display(description="items")
    def items_link(self, obj: Operation) -> str:
        if obj.items_removed_at is not None:
            # The figures above are the record now; a link would open an empty list.
            when = f"{timezone.localtime(obj.items_removed_at):%Y-%m-%d %H:%M %Z}"
            return format_html("removed by retention on {}: the figures above are its summary", when)
        url = reverse("admin:operations_operationitem_changelist") + f"?operation__id__exact={obj.pk}"
        return format_html('<a href="{}">{} items</a>', url, obj.total)


@admin.register(OperationItem)
class OperationItemAdmin(ReadOnlyAdmin):
    list_display = ["id", "operation", "dead_letter_link", "status", "attempts", "published_at", "destination", "error"]
    list_filter = ["status"]
    # Exact ids only: the item table is as long as every operation's frozen lists together.
    search_fields = ["=operation__id", "=dead_letter__id"]
    ordering = ["-id"]
    show_full_result_count = False
    list_per_page = 200

    @admin.display(description="dead letter")
    def dead_letter_link(self, obj: OperationItem) -> str:
        url = reverse("admin:deadletters_deadletter_change", args=[obj.dead_letter_id])
        return format_html('<a href="{}">#{}</a>', url, obj.dead_letter_id)


class RetryPolicyForm(forms.ModelForm[RetryPolicy]):
    delays = forms.CharField(
        help_text="Seconds before each automatic attempt, comma-separated (the last one repeats).",
        initial="60, 300, 1800, 7200, 43200",
    )
    permanent_reasons = forms.MultipleChoiceField(
        choices=FailureReason.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Never retried automatically.",
    )

    class Meta:
        model = RetryPolicy
        fields = [
            "name",
            "enabled",
            "broker",
            "queue",
            "failure_reason",
            "pattern",
            "delays",
            "max_attempts",
            "permanent_reasons",
            "rate",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["delays"] = ", ".join(str(value) for value in self.instance.delays)

    def clean_delays(self) -> list[int]:
        parts = [part.strip() for part in self.cleaned_data["delays"].split(",") if part.strip()]
        try:
            delays = [int(part) for part in parts]
        except ValueError:
            raise forms.ValidationError("whole numbers of seconds, comma-separated") from None
        if not delays or any(delay < 0 for delay in delays):
            raise forms.ValidationError("at least one delay, none negative")
        if any(delay > MAX_RETRY_DELAY_SECONDS for delay in delays):
            raise forms.ValidationError(f"at most {MAX_RETRY_DELAY_SECONDS:,} seconds (a year) each")
        return delays

    def clean_max_attempts(self) -> int:
        value = self.cleaned_data["max_attempts"]
        if value < 1:
            raise forms.ValidationError("at least 1")
        return int(value)

    def clean_rate(self) -> str:
        text = self.cleaned_data["rate"].strip()
        if text:
            try:
                text = str(parse_rate(text))
            except ValueError as error:
                raise forms.ValidationError(str(error)) from None
        return text


@admin.register(RetryPolicy)
class RetryPolicyAdmin(AuditedModelAdmin[RetryPolicy]):
    # save_model and the deletes below write their own audit rows (retrypolicy.*).
    writes_own_audit = True
    form = RetryPolicyForm
    list_display = [
        "name",
        "enabled",
        "broker",
        "queue",
        "failure_reason",
        "pattern",
        "delays",
        "max_attempts",
        "rate",
    ]
    list_filter = ["enabled", "broker", "failure_reason"]
    list_select_related = ["broker", "pattern"]
    raw_id_fields = ["pattern"]

    # Policies replay messages without anyone watching: only admins write them.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, ADMIN) and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: RetryPolicy | None = None) -> bool:
        return has_role(request.user, ADMIN) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: RetryPolicy | None = None) -> bool:
        return has_role(request.user, ADMIN) and super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: RetryPolicy, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        record_audit(
            actor=request.user,
            action="retrypolicy.change" if change else "retrypolicy.add",
            target=f"retrypolicy:{obj.pk}",
            detail=_pretty(form.cleaned_data, default=str),
        )

    def delete_model(self, request: HttpRequest, obj: RetryPolicy) -> None:
        record_audit(actor=request.user, action="retrypolicy.delete", target=f"retrypolicy:{obj.pk}", detail=obj.name)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RetryPolicy]) -> None:
        for policy in queryset:
            record_audit(
                actor=request.user, action="retrypolicy.delete", target=f"retrypolicy:{policy.pk}", detail=policy.name
            )
        super().delete_queryset(request, queryset)


@admin.action(description="Close the circuit breaker now (waiting replays go on)")
def close_selected_breakers(modeladmin: Any, request: HttpRequest, queryset: QuerySet[BreakerSetting]) -> None:
    if not has_role(request.user, ADMIN):
        raise PermissionDenied
    for row in queryset.select_related("broker"):
        close_breaker(key=row.destination.limit_key, actor=request.user)
    messages.success(request, f"Closed {queryset.count()} circuit breaker(s) by hand.")


@admin.register(BreakerSetting)
class BreakerSettingAdmin(AuditedModelAdmin[BreakerSetting]):
    """Thresholds of one destination's circuit breaker (empty: the DLQ_BREAKER_* settings), its state, and closing
    it by hand."""

    list_display = [
        "__str__",
        "state",
        "failures",
        "failure_share",
        "min_sample",
        "cooldown_seconds",
        "probe_size",
        "watch_seconds",
    ]
    list_filter = ["broker"]
    list_select_related = ["broker"]
    actions = [close_selected_breakers]

    @admin.display(description="state now")
    def state(self, obj: BreakerSetting) -> str:
        views = breaker_views([obj.destination.limit_key])
        if not views:
            return "unknown (Redis cannot be reached)"
        view = views[0]
        return f"{view.label}: {view.state.reason}" if view.state.reason and not view.is_closed else view.label


def _pretty(value: Any, **options: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, **options)


def _pre(value: Any) -> str:
    # format_html escapes the JSON: stored filters and reasons are shown as text, never as markup.
    return format_html("<pre>{}</pre>", _pretty(value))
