"""Admin for watched queues: thresholds and enabling are edited here; the broker-side names and arguments are
read-only once declared (RabbitMQ cannot change them; declare_topology records them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.roles import ADMIN, has_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.deadletters.admin import SourceQueueFilter
from dlqconsole.ingest.models import QueueSample, WatchedQueue

THRESHOLDS = ("warning_depth", "critical_depth", "emergency_depth")


def _watched_dead_letter_queues() -> Iterable[str]:
    return WatchedQueue.objects.values_list("dead_letter_queue", flat=True)


# The dead letters' admin filters by queue; the watched DLQs are offered too, also those that hold no dead letter
# yet. deadletters cannot import this app, so they are added to its filter here, when the admins load.
SourceQueueFilter.more_names.append(_watched_dead_letter_queues)


class WatchedQueueForm(forms.ModelForm[WatchedQueue]):
    class Meta:
        model = WatchedQueue
        fields = ["broker", "name", "dead_letter_queue", "dead_letter_exchange", "kind", *THRESHOLDS, "enabled"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        depths = [cleaned.get(name) for name in THRESHOLDS]
        if all(isinstance(depth, int) for depth in depths):
            warning, critical, emergency = depths
            assert isinstance(warning, int) and isinstance(critical, int) and isinstance(emergency, int)
            if warning < 0:
                self.add_error("warning_depth", "A depth cannot be negative.")
            if not warning <= critical <= emergency:
                raise forms.ValidationError("Thresholds must rise: warning ≤ critical ≤ emergency.")
        return cleaned


@admin.register(WatchedQueue)
class WatchedQueueAdmin(AuditedModelAdmin[WatchedQueue]):
    # save_model and the deletes below write their own audit rows (watched_queue.*).
    writes_own_audit = True
    form = WatchedQueueForm
    list_display = ["name", "broker", "dead_letter_queue", "kind", *THRESHOLDS, "enabled", "declared_at"]
    list_editable = [*THRESHOLDS, "enabled"]
    list_filter = ["broker", "kind", "enabled"]
    list_select_related = ["broker"]
    search_fields = ["name", "dead_letter_queue"]
    readonly_fields = ["arguments", "declared_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: WatchedQueue | None = None) -> list[str]:
        # A queue added by hand (one declared by another tool) names its DLQ once; after that the names and
        # kind mirror the broker and stay as declared.
        if obj is None:
            return list(self.readonly_fields)
        return [*self.readonly_fields, "broker", "name", "dead_letter_queue", "dead_letter_exchange", "kind"]

    # Thresholds decide alerts and backpressure for everyone: a configuration change for admins.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and has_role(request.user, ADMIN)

    def has_change_permission(self, request: HttpRequest, obj: WatchedQueue | None = None) -> bool:
        return super().has_change_permission(request, obj) and has_role(request.user, ADMIN)

    def has_delete_permission(self, request: HttpRequest, obj: WatchedQueue | None = None) -> bool:
        return super().has_delete_permission(request, obj) and has_role(request.user, ADMIN)

    def save_model(self, request: HttpRequest, obj: WatchedQueue, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        changes = ", ".join(f"{name}={form.cleaned_data.get(name)!r}" for name in form.changed_data)
        record_audit(
            actor=request.user,
            action="watched_queue.change" if change else "watched_queue.add",
            target=_target(obj),
            detail=changes,
        )

    def delete_model(self, request: HttpRequest, obj: WatchedQueue) -> None:
        record_audit(actor=request.user, action="watched_queue.delete", target=_target(obj))
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for queue in queryset.select_related("broker"):
            record_audit(actor=request.user, action="watched_queue.delete", target=_target(queue))
        super().delete_queryset(request, queryset)


def _target(queue: WatchedQueue) -> str:
    """The audit target: the queue's name, after its broker's unless that is default."""
    return queue.name if queue.broker.is_default else f"{queue.broker.name}/{queue.name}"


@admin.register(QueueSample)
class QueueSampleAdmin(AuditedModelAdmin[QueueSample]):
    list_display = ["queue", "broker", "messages", "consumers", "sampled_at"]
    list_filter = ["broker", ("sampled_at", admin.DateFieldListFilter)]
    list_select_related = ["broker"]
    search_fields = ["=queue"]
    ordering = ["-sampled_at"]
    show_full_result_count = False

    # Measurements: read-only; retention removes old ones.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: QueueSample | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: QueueSample | None = None) -> bool:
        return False
