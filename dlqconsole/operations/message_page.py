"""The operations part of a dead letter's pages, lent to them through dlqconsole.deadletters.replays (they
cannot import this app, which sits above theirs): the message page's operation history and Retry button, and the
sending of an edited copy."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from django.template.defaultfilters import pluralize
from django.urls import reverse

from dlqconsole.accounts.roles import OPERATOR, has_role
from dlqconsole.core.views import HtmxHttpRequest
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.deadletters.replays import ReplayRefused
from dlqconsole.deadletters.templatetags.charts import stamp
from dlqconsole.operations.destinations import retry_destination
from dlqconsole.operations.message_retry import edit_and_retry
from dlqconsole.operations.models import ALLOWED_STATUSES, ItemStatus, OperationItem, OperationKind
from dlqconsole.operations.services import OperationError


class MessageReplays:
    """What this app lends the dead letters' pages (deadletters.replays.Replays); OperationsConfig.ready registers
    it."""

    def page_context(self, request: HtmxHttpRequest, dead_letter: DeadLetter) -> dict[str, Any]:
        history = _operation_history(dead_letter)
        return {"history": history, "retry": _quick_retry(request, dead_letter, history)}

    def send_edited(
        self, *, dead_letter: DeadLetter, body: bytes, headers: dict[str, Any], actor: Any, submission: str
    ) -> str:
        try:
            operation = edit_and_retry(
                dead_letter=dead_letter, body=body, headers=headers, actor=actor, submission=submission
            )
        except OperationError as problem:
            raise ReplayRefused(str(problem)) from problem
        return reverse("operations:detail", args=[operation.pk])


def _operation_history(dead_letter: DeadLetter) -> list[OperationItem]:
    return list(
        OperationItem.objects.filter(dead_letter_id=dead_letter.pk).select_related("operation").order_by("-id")[:50]
    )


def _quick_retry(
    request: HtmxHttpRequest, dead_letter: DeadLetter, history: list[OperationItem]
) -> dict[str, Any] | None:
    """The Retry button of an operator, for a message a retry can take: where it goes, whether it was replayed
    already (retrying sends it again: the page and the confirm dialog say so), and a fresh submission token (one
    per page load, so a double click retries once). None when the button is not shown."""
    if not has_role(request.user, OPERATOR) or dead_letter.status not in ALLOWED_STATUSES[OperationKind.RETRY]:
        return None
    destination = retry_destination(
        exchange=dead_letter.original_exchange,
        routing_keys=dead_letter.original_routing_keys,
        queue=dead_letter.original_queue,
    )
    if destination is None:
        return {"destination": None}
    # The same queue name may exist on several brokers: say which one, where there are several.
    several = len(selectors.broker_names()) > 1
    where = f"{destination} on broker {dead_letter.broker.name}" if several else str(destination)
    confirm = f"Retry dead letter #{dead_letter.pk}: publish it again to {where}?"
    sent = _last_sent(dead_letter, history)
    if sent is not None:
        confirm = f"{sent['warning']}\n\n{confirm}"
    return {"destination": where, "submission": uuid4().hex, "confirm": confirm, "sent": sent}


def _last_sent(dead_letter: DeadLetter, history: list[OperationItem]) -> dict[str, Any] | None:
    """When this dead letter was last published by a retry or a move, and by which operation; also when its
    status or replay count says it was replayed but no operation at hand shows it (an older history)."""
    for item in history:  # newest first
        kind = item.operation.kind
        if item.status in (ItemStatus.PUBLISHED, ItemStatus.DONE) and kind in (OperationKind.RETRY, OperationKind.MOVE):
            done = "moved" if kind == OperationKind.MOVE else "replayed"
            at = item.published_at or item.operation.created_at
            return {
                "done": done,
                "at": at,
                "operation": item.operation.pk,
                "warning": f"Already {done} at {stamp(at)} by operation #{item.operation.pk}; retrying sends it again.",
            }
    if dead_letter.status != DeadLetterStatus.REPLAYED and dead_letter.replay_count:
        # A boomerang: this record is the copy that died again; it was never replayed itself.
        times = f"{dead_letter.replay_count} replay{pluralize(dead_letter.replay_count)}"
        earlier = f" of #{dead_letter.previous_id}" if dead_letter.previous_id else ""
        return {
            "done": "boomerang",
            "at": None,
            "operation": None,
            "previous": dead_letter.previous_id,
            "times": times,
            "warning": f"This message died again after {times}{earlier}; retrying sends it once more.",
        }
    if dead_letter.status == DeadLetterStatus.REPLAYED:
        replayed_at = dead_letter.status_changed_at
        when = f" at {stamp(replayed_at)}" if replayed_at else ""
        return {
            "done": "replayed",
            "at": replayed_at,
            "operation": None,
            "warning": f"Already replayed{when}; retrying sends it again.",
        }
    return None
