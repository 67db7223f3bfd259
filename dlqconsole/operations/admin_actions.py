"""Admin actions on dead letters: retry, move, archive, restore or purge the selected ones.

Each action first shows a confirmation page with the plan (how many, by queue, pattern and destination, and
what cannot be replayed and why), computed by a dry run that leaves nothing behind. Only "Start" plans the
operation for good and starts it, through the same services as the pages and the `dlq` command.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import reverse

from dlqconsole.accounts.roles import has_role
from dlqconsole.brokers import registry
from dlqconsole.deadletters.filters import MAX_IDS
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import PUBLISHING_KINDS, Operation, OperationKind
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import OperationError, required_role, start_operation

TEMPLATE = "admin/operations/operation_confirm.html"


class OperationOptionsForm(forms.Form):
    target_queue = forms.CharField(required=False, max_length=255)
    target_exchange = forms.CharField(required=False, max_length=255)
    target_routing_key = forms.CharField(required=False, max_length=255, label="Routing key")
    target_broker = forms.ChoiceField(required=False, label="Target broker")
    rate = forms.CharField(required=False, max_length=32, help_text="N/period[:burst], e.g. 50/1s; empty: no limit")
    canary_size = forms.IntegerField(required=False, min_value=0, initial=0, label="Canary size")
    canary_wait_seconds = forms.IntegerField(required=False, min_value=0, label="Canary wait (seconds)")

    def __init__(self, *args: Any, kind: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = [broker.name for broker in registry.brokers()] if kind == OperationKind.MOVE else []
        if len(names) > 1:
            # plan_operation judges the name again: a broker disabled since the page was drawn is refused there.
            field = self.fields["target_broker"]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [("", "each dead letter's own broker"), *((name, name) for name in names)]
        else:
            del self.fields["target_broker"]
        if kind != OperationKind.MOVE:
            for name in ("target_queue", "target_exchange", "target_routing_key"):
                del self.fields[name]
        if kind not in PUBLISHING_KINDS:
            for name in ("rate", "canary_size", "canary_wait_seconds"):
                del self.fields[name]

    def plan_options(self) -> dict[str, Any]:
        options = {name: value for name, value in self.cleaned_data.items() if value not in (None, "")}
        return options


def confirm_operation(
    modeladmin: admin.ModelAdmin[DeadLetter], request: HttpRequest, queryset: QuerySet[DeadLetter], *, kind: str
) -> HttpResponse | None:
    if not has_role(request.user, required_role(kind)):
        messages.error(request, f"A {kind} needs the {required_role(kind)} role.")
        return None
    ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: MAX_IDS + 1])
    if len(ids) > MAX_IDS:
        messages.error(request, f"Select at most {MAX_IDS:,} dead letters here; use a filter on the operations pages.")
        return None
    step = request.POST.get("step", "")
    form = OperationOptionsForm(request.POST if step else None, kind=kind)
    plan: Operation | None = None
    error = ""
    options = form.plan_options() if form.is_bound and form.is_valid() else {}
    if step == "start" and form.is_valid():
        try:
            # One transaction: a start that is refused leaves no plan behind (the page shows the plan again).
            with transaction.atomic():
                operation = plan_operation(kind=kind, filter={"ids": ids}, actor=request.user, **options)
                # As on the operation page: a plan that could only mark every message failed is not started.
                start_operation(operation=operation, actor=request.user, require_replayable=True)
        except (OperationError, PermissionDenied) as failure:
            error = str(failure)
        else:
            messages.success(request, f"Started operation #{operation.pk}: {kind} of {_dead_letters(operation.total)}.")
            return HttpResponseRedirect(reverse("admin:operations_operation_change", args=[operation.pk]))
    if not form.is_bound or form.is_valid():
        plan, preview_error = preview_plan(kind=kind, ids=ids, actor=request.user, options=options)
        error = error or preview_error
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"{OperationKind(kind).label} {len(ids):,} selected dead letter{pluralize(len(ids))}",
        "opts": modeladmin.model._meta,
        "kind": kind,
        "kind_label": OperationKind(kind).label,
        "form": form,
        "plan": plan,
        "error": error,
        "ids": ids,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "destructive": kind == OperationKind.PURGE,
    }
    return TemplateResponse(request, TEMPLATE, context)


def _dead_letters(count: int) -> str:
    return f"{count:,} dead letter{pluralize(count)}"


def preview_plan(*, kind: str, ids: list[int], actor: Any, options: dict[str, Any]) -> tuple[Operation | None, str]:
    """The plan as it would be, by planning in a transaction that is rolled back: nothing stays behind."""
    if kind == OperationKind.MOVE and not (options.get("target_queue") or options.get("target_exchange")):
        return None, ""
    try:
        with transaction.atomic():
            operation = plan_operation(kind=kind, filter={"ids": ids}, actor=actor, **options)
            transaction.set_rollback(True)
    except (OperationError, PermissionDenied) as failure:
        return None, str(failure)
    return operation, ""


def _action(kind: str, description: str) -> Any:
    def action(
        modeladmin: admin.ModelAdmin[DeadLetter], request: HttpRequest, queryset: QuerySet[DeadLetter]
    ) -> HttpResponse | None:
        return confirm_operation(modeladmin, request, queryset, kind=kind)

    action.__name__ = f"{kind}_selected"
    # The dead letters' admin shows the action only to this role (DeadLetterAdmin.get_actions); it is checked
    # again when the action runs (confirm_operation, plan_operation).
    action.required_role = required_role(kind)  # type: ignore[attr-defined]
    return admin.action(description=description)(action)


retry_selected = _action(OperationKind.RETRY, "Retry selected dead letters…")
move_selected = _action(OperationKind.MOVE, "Move selected dead letters…")
archive_selected = _action(OperationKind.ARCHIVE, "Archive selected dead letters…")
restore_selected = _action(OperationKind.RESTORE, "Restore selected dead letters…")
purge_selected = _action(OperationKind.PURGE, "Purge selected dead letters for good…")

DEAD_LETTER_ACTIONS = [retry_selected, move_selected, archive_selected, restore_selected, purge_selected]
