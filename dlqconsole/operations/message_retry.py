"""One message's retry from its page, and the retry of an edited copy of it: a plan of one dead letter, started at
once, and sent once however often its form is sent."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers.models import default_broker_id
from dlqconsole.core import jsonsafe
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, add_counts, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.item_sql import busy_elsewhere
from dlqconsole.operations.models import Operation, OperationItem, OperationKind
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import Actor, OperationError, check_role, start_operation


def retry_dead_letter(
    *, dead_letter: DeadLetter, actor: Actor, submission: str, seen_status: str | None = None
) -> Operation:
    """Retry one dead letter from its page: plan a retry of just this message and start it.

    `submission` names the form that asked: sent again (a double click, a reload of the POST), it returns the
    operation of the first send. `seen_status` is the status the page showed: a dead letter whose status changed
    since (replayed by someone else, say) is not retried unseen."""
    check_role(actor, OperationKind.RETRY)
    if not submission:
        raise OperationError("the request names no submission; reload the page")
    key = hashlib.sha256(f"retry:{dead_letter.pk}:{submission}".encode()).hexdigest()
    with transaction.atomic():
        # Locked, so that a second send of the same form waits for the first and then finds its operation.
        locked = DeadLetter.objects.select_for_update().get(pk=dead_letter.pk)
        earlier = Operation.objects.filter(submission=key).first()
        if earlier is not None:
            return earlier
        if seen_status is not None and seen_status != locked.status:
            raise OperationError(
                f"it is {locked.get_status_display().lower()} now (the page showed it "
                f"{seen_status or 'in another state'}); look again before retrying"
            )
        operation = plan_operation(
            kind=OperationKind.RETRY, filter={"ids": [locked.pk], "status": [locked.status]}, actor=actor
        )
        Operation.objects.filter(pk=operation.pk).update(submission=key)
        record_audit(
            actor=actor,
            action="deadletter.retry",
            target=f"deadletter:{locked.pk}",
            filter=operation.filter,
            count=operation.total,
            detail=f"operation {operation.pk}",
        )
        return start_operation(operation=operation, actor=actor)


def edit_and_retry(
    *, dead_letter: DeadLetter, body: bytes, headers: dict[str, Any], actor: Actor, submission: str = ""
) -> Operation:
    """Retry an edited copy of a dead letter. The copy links to the original (edited_from), which is archived
    when it is waiting (see _archive_edited_original).

    `submission` names one editing session: the same one sent again (a double click, a reloaded form) returns the
    operation of the first send instead of sending a second copy."""
    check_role(actor, OperationKind.EDIT_RETRY)
    if not isinstance(headers, dict):
        raise OperationError("headers must be a table of names and values")
    now = timezone.now()
    key = hashlib.sha256(f"edit:{dead_letter.pk}:{submission or uuid.uuid4().hex}".encode()).hexdigest()
    # One transaction for the copy, its plan and its start: a second send of the same submission waits on the
    # copy's dedupe key until the first commits, then finds its operation.
    with transaction.atomic():
        try:
            with transaction.atomic():
                return _edit_and_retry(
                    dead_letter=dead_letter, body=body, headers=headers, actor=actor, key=key, now=now
                )
        except IntegrityError:
            sent = OperationItem.objects.filter(dead_letter__dedupe_key=key).select_related("operation").first()
            if sent is None:
                raise
            return sent.operation


def _edit_and_retry(
    *, dead_letter: DeadLetter, body: bytes, headers: dict[str, Any], actor: Actor, key: str, now: dt.datetime
) -> Operation:
    """Store the edited copy under `key`, plan and start its operation (in the caller's transaction)."""
    original = DeadLetter.objects.get(pk=dead_letter.pk)
    copy = DeadLetter.objects.get(pk=dead_letter.pk)
    copy.pk = None
    copy.dedupe_key = key
    copy.body = bytes(body)
    copy.body_size = len(body)
    copy.headers = jsonsafe.encode({str(name): value for name, value in headers.items()})
    copy.edited_from = original
    copy.previous = None
    copy.status = DeadLetterStatus.PARKED
    copy.status_changed_at = now
    copy.ingested_at = now
    copy.next_retry_at = None
    copy.retry_exhausted = False
    copy.search_text = None  # computed again by save(), from the edited body
    copy.save(force_insert=True)
    add_counts([(*_cell(copy), DeadLetterStatus.PARKED, 1)])
    record_audit(
        actor=actor,
        action="deadletter.edit_retry",
        target=f"deadletter:{original.pk}",
        count=1,
        detail=f"edited copy {copy.pk} of dead letter {original.pk}",
    )
    operation = plan_operation(kind=OperationKind.EDIT_RETRY, filter={"ids": [copy.pk]}, actor=actor)
    _archive_edited_original(original_id=original.pk, copy_id=copy.pk, actor=actor, now=now)
    return start_operation(operation=operation, actor=actor)


def _archive_edited_original(*, original_id: int, copy_id: int, actor: Actor, now: dt.datetime) -> None:
    """The original of an edited copy is dealt with: archive it (restorable), so that it no longer counts as
    waiting and a later retry of its pattern does not replay the broken message next to its fixed copy. One that
    another operation is replaying right now, or that is not waiting, is left as it is."""
    row = (
        DeadLetter.objects.select_for_update(no_key=True)
        .filter(pk=original_id, status__in=selectors.WAITING)
        .values_list(*COUNTED_FIELDS)
        .first()
    )
    if row is None or busy_elsewhere([original_id], operation_id=0):
        return
    DeadLetter.objects.filter(pk=original_id).update(
        status=DeadLetterStatus.ARCHIVED, status_changed_at=now, next_retry_at=None
    )
    count_status_change([CountedRow(*row)], to_status=DeadLetterStatus.ARCHIVED)
    record_audit(
        actor=actor,
        action="deadletter.archive",
        target=f"deadletter:{original_id}",
        count=1,
        detail=f"archived: replaced by its edited copy {copy_id}",
    )


def _cell(letter: DeadLetter) -> tuple[int, str, int, str]:
    """(broker id, queue, pattern id, reason): where the dead letter counts, but for its status. (The stubs type
    broker_id as optional, for its field has a default; the row always has one.)"""
    return letter.broker_id or default_broker_id(), letter.source_queue, letter.pattern_id, letter.failure_reason
