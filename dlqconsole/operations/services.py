"""The lifecycle of a bulk recovery operation: start, pause, resume or cancel it, change its rate; and what every
operations service shares: its error, the role each kind needs, handing a run to a worker.

Pages, the admin, the `dlq` command and the Celery tasks all call these. Planning is in planning.py, one message's
retry and edit-and-retry in message_retry.py, the upkeep of Celery beat in upkeep.py, and the run loop in runner.py.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from dlqconsole.accounts.roles import ADMIN, OPERATOR, require_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.core.breaker import BreakerState, get_breakers
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.operations.breakers import describe_key
from dlqconsole.operations.item_sql import finalize_cancelled
from dlqconsole.operations.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    PUBLISHING_KINDS,
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    OperationStatus,
)
from dlqconsole.operations.runner import run_operation

Actor = AbstractBaseUser | AnonymousUser | None
# A plan older than this is a stale snapshot (dead letters that arrived since are not in it): the operation page
# asks for an explicit confirmation before starting it.
STALE_PLAN_AGE = dt.timedelta(minutes=15)

__all__ = [
    "OperationError",
    "cancel_operation",
    "change_rate",
    "pause_operation",
    "required_role",
    "resume_operation",
    "run_operation",
    "start_operation",
]


class OperationError(Exception):
    """An operation cannot be planned or changed as asked; the message says why, in words fit for the user."""


# Kinds whose start asks for their number typed in: a purge deletes for good, a shed takes messages out of a live
# queue.
TYPED_KINDS = frozenset({OperationKind.PURGE, OperationKind.SHED})


def required_role(kind: str) -> str:
    """Purging deletes for good and shedding takes messages out of a live work queue, so they need an admin; every
    other kind an operator."""
    return ADMIN if kind in TYPED_KINDS else OPERATOR


def check_role(actor: Actor, kind: str) -> None:
    # A None actor is the system itself (beat, the shell command); people are checked here as well as in views.
    if actor is not None:
        require_role(actor, required_role(kind))


def audit_target(operation: Operation) -> str:
    """How the audit log names an operation."""
    return f"operation:{operation.pk}"


def enqueue_run(operation: Operation) -> None:
    """Hand the operation to a worker once the current transaction commits."""
    # Imported here: the tasks import this module (a service enqueueing its own task).
    from dlqconsole.operations.tasks import run_operation_task

    # Celery's DjangoTask has delay_on_commit; celery-types does not know it yet.
    run_operation_task.delay_on_commit(operation.pk)  # type: ignore[attr-defined]


def close_breaker(*, key: str, actor: Actor) -> BreakerState:
    """Close a destination's circuit breaker by hand (an admin, audited): the operations waiting for a breaker look
    again at once (those waiting for another one wait again)."""
    if actor is not None:
        require_role(actor, ADMIN)
    state = get_breakers().close(key)
    with transaction.atomic():
        waiting = list(Operation.objects.active().filter(breaker_wait_until__isnull=False))
        Operation.objects.filter(pk__in=[operation.pk for operation in waiting]).update(
            breaker_wait="", breaker_wait_until=None
        )
        record_audit(
            actor=actor,
            action="breaker.close",
            target=f"breaker:{key}"[:255],
            detail=f"closed by hand: {describe_key(key)}; {len(waiting)} waiting operation(s) look again",
        )
        for operation in waiting:
            enqueue_run(operation)
    return state


def describe_operation(operation: Operation) -> str:
    """An operation in a few words for its audit rows: its kind, target, rate and canary."""
    parts = [operation.get_kind_display()]
    if operation.kind == OperationKind.SHED:
        parts.append(operation.target_display)
    elif operation.target_display:
        parts.append(f"to {operation.target_display}")
    if operation.rate:
        parts.append(f"at {operation.rate}")
    if operation.canary_size:
        parts.append(f"canary {operation.canary_size} / {operation.canary_wait_seconds}s")
    return " ".join(parts)


# Lifecycle ---------------------------------------------------------------------------------------------------


def start_operation(
    *,
    operation: Operation,
    actor: Actor,
    typed_count: str | None = None,
    require_replayable: bool = False,
    stale_confirmed: bool | None = None,
) -> Operation:
    """Planned → canary (when it has one) or running, and hand it to a worker.

    `typed_count` is what a person typed to confirm a purge (its page asks for the number of messages): for a
    purge it must be that number, or nothing starts (the refusal is in the audit log). None means the caller
    confirmed another way: the `dlq` command asks for "purge N" itself, the admin shows a confirmation page.

    `require_replayable` refuses a publishing plan none of whose messages can be replayed (the operation page
    asks for it): it could only mark them all failed. Without it such a plan runs, and the run marks each
    failed with its reason, losing none.

    `stale_confirmed` is the operation page's answer to "this plan is old, start it anyway?": False refuses a plan
    older than STALE_PLAN_AGE. None means the caller does not ask (the CLI and the admin start what they just
    planned or showed)."""
    check_role(actor, operation.kind)
    if operation.total == 0 and operation.status == OperationStatus.PLANNED:
        # A run of nothing would only read as "Running" and then "Done": say so instead (the CLI says "Nothing to
        # do" before it gets here; the operation page and the admin would start it).
        raise OperationError(EMPTY_PLAN.format(kind=operation.get_kind_display().lower()))
    if stale_confirmed is False and timezone.now() - operation.created_at > STALE_PLAN_AGE:
        raise OperationError(
            f"Nothing was started: this plan was made {_minutes(timezone.now() - operation.created_at)} ago and "
            "dead letters that arrived since are not in it. Tick the box to start it anyway, or plan again."
        )
    if operation.kind in TYPED_KINDS and typed_count is not None:
        _check_typed_count(operation=operation, actor=actor, typed_count=typed_count)
    if require_replayable:
        _check_replayable(operation)
    now = timezone.now()
    status = OperationStatus.CANARY if operation.canary_size else OperationStatus.RUNNING
    with transaction.atomic():
        started = Operation.objects.filter(pk=operation.pk, status=OperationStatus.PLANNED).update(
            status=status, started_at=now, heartbeat_at=now, runner=""
        )
        if not started:
            operation.refresh_from_db()
            raise OperationError(f"operation {operation.pk} is {operation.status}; only a planned one can start")
        record_audit(
            actor=actor,
            action=f"operation.{operation.kind}.start",
            target=audit_target(operation),
            filter=operation.filter,
            count=operation.total,
            detail=describe_operation(operation),
        )
        enqueue_run(operation)
    operation.refresh_from_db()
    return operation


EMPTY_PLAN = (
    "Nothing was started: the plan holds no dead letter (none of those chosen is in a state a {kind} acts on). "
    "Plan again with another filter or status, or discard this plan."
)


def _minutes(age: dt.timedelta) -> str:
    minutes = int(age.total_seconds() // 60)
    return f"{minutes:,} minute{'' if minutes == 1 else 's'}"


def _check_replayable(operation: Operation) -> None:
    """Refuse to start a publishing plan whose planning found that none of its messages can be replayed."""
    operation.refresh_from_db()
    if not operation.nothing_replayable:
        return
    reasons = operation.unreplayable_reasons or {}
    if operation.status != OperationStatus.PLANNED:
        return  # the start itself says why it cannot start
    why = "; ".join(str(reason) for reason in reasons)
    noun = "this message" if operation.total == 1 else f"any of these {operation.total:,} messages"
    raise OperationError(
        f"Nothing was started: {noun} cannot be replayed ({why}). Plan again with a destination that exists, "
        "or discard this plan."
    )


def _check_typed_count(*, operation: Operation, actor: Actor, typed_count: str) -> None:
    """Refuse to start a purge unless the number typed is its number of messages."""
    operation.refresh_from_db()
    typed = typed_count.strip()
    total = operation.total
    if typed.replace(",", "").replace(" ", "") == str(total):
        return
    record_audit(
        actor=actor,
        action=f"operation.{operation.kind}.start_refused",
        target=audit_target(operation),
        filter=operation.filter,
        count=total,
        detail=f"typed {typed!r} instead of {total}" if typed else "no count typed",
    )
    noun = f"{total:,} message{'' if total == 1 else 's'}"
    if operation.kind == OperationKind.SHED:
        queue = (operation.breakdown or {}).get("shed", {}).get("queue", "")
        if not typed:
            raise OperationError(f"Nothing was shed: type {total} (the messages in {queue} when planned) to confirm.")
        raise OperationError(
            f"Nothing was shed: you typed {typed[:40]}, but {queue} held {noun} when planned. Type {total} to confirm."
        )
    if not typed:
        raise OperationError(f"Nothing was deleted: type {total} (the number of messages) to purge these {noun}.")
    raise OperationError(
        f"Nothing was deleted: you typed {typed[:40]}, but this purge deletes {noun}. Type {total} to confirm."
    )


def pause_operation(*, operation: Operation, actor: Actor, reason: str = "") -> Operation:
    check_role(actor, operation.kind)
    name = actor.get_username() if isinstance(actor, AbstractBaseUser) else "the system"
    reason = reason.strip() or f"paused by {name}"
    with transaction.atomic():
        paused = Operation.objects.filter(pk=operation.pk, status__in=ACTIVE_STATUSES).update(
            status=OperationStatus.PAUSED, pause_reason=reason[:2000], paused_automatically=False
        )
        if not paused:
            operation.refresh_from_db()
            raise OperationError(f"operation {operation.pk} is {operation.status}; only a running one can pause")
        record_audit(actor=actor, action="operation.pause", target=audit_target(operation), detail=reason)
    operation.refresh_from_db()
    return operation


def resume_operation(*, operation: Operation, actor: Actor) -> Operation:
    """Paused → running again; the share of returns that pauses the operation is measured afresh from here.

    A canary not yet judged goes on where it stopped: back to the canary, to publish the rest of it or to watch
    until the end of its wait (judged at once if the pause outlasted the wait). A failed canary is not run a
    second time: a person resuming after it overrides it."""
    check_role(actor, operation.kind)
    operation.refresh_from_db()
    canary_open = operation.canary_size and not operation.canary_passed and not operation.canary_failed
    status = OperationStatus.CANARY if canary_open else OperationStatus.RUNNING
    with transaction.atomic():
        # The error that led to the pause goes into the resume's audit row and off the page: the page's "Last
        # error" is then always one of this stretch of the run.
        resumed = Operation.objects.filter(pk=operation.pk, status=OperationStatus.PAUSED).update(
            status=status,
            pause_reason="",
            paused_automatically=False,
            returned_baseline=operation.returned,
            succeeded_baseline=operation.succeeded,
            heartbeat_at=timezone.now(),
            last_error="",
            breaker_wait="",
            breaker_wait_until=None,
        )
        if not resumed:
            raise OperationError(f"operation {operation.pk} is {operation.status}; only a paused one can resume")
        detail = describe_operation(operation)
        if operation.last_error:
            detail = f"{detail}; the error before the resume: {operation.last_error}"[:2000]
        record_audit(actor=actor, action="operation.resume", target=audit_target(operation), detail=detail)
        enqueue_run(operation)
    operation.refresh_from_db()
    return operation


def cancel_operation(*, operation: Operation, actor: Actor) -> Operation:
    """Stop for good. What was published stays published; the rest is skipped and its dead letters stay as they
    are. A worker in the middle of a chunk finishes recording it first."""
    check_role(actor, operation.kind)
    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS)
    with transaction.atomic():
        cancelled = (
            Operation.objects.filter(pk=operation.pk)
            .exclude(status__in=FINISHED_STATUSES)
            .update(status=OperationStatus.CANCELLED, finished_at=now)
        )
        if not cancelled:
            operation.refresh_from_db()
            raise OperationError(f"operation {operation.pk} is {operation.status} already")
        record_audit(
            actor=actor,
            action="operation.cancel",
            target=audit_target(operation),
            filter=operation.filter,
            detail="plan discarded before it started" if operation.status == OperationStatus.PLANNED else "",
        )
    operation.refresh_from_db()
    # Pending items can be skipped at once (a worker takes items only while they are pending); in-flight ones only
    # when no live worker holds them, else that worker settles them when it notices.
    if not operation.runner or operation.heartbeat_at is None or operation.heartbeat_at < stale:
        finalize_cancelled(operation=operation)
    else:
        OperationItem.objects.filter(operation=operation, status=ItemStatus.PENDING).update(
            status=ItemStatus.SKIPPED, error="cancelled"
        )
        skipped = OperationItem.objects.filter(operation=operation, status=ItemStatus.SKIPPED).count()
        Operation.objects.filter(pk=operation.pk).update(skipped=skipped)
    operation.refresh_from_db()
    return operation


def change_rate(*, operation: Operation, rate: str, actor: Actor) -> Operation:
    """Change the rate of an unfinished operation; a running worker applies it within a couple of seconds."""
    check_role(actor, operation.kind)
    if operation.kind not in PUBLISHING_KINDS and operation.kind != OperationKind.SHED:
        raise OperationError(f"a {operation.kind} publishes nothing, so it takes no rate")
    rate = rate.strip()
    if rate:
        try:
            rate = str(parse_rate(rate))
        except ValueError as error:
            raise OperationError(str(error)) from None
    with transaction.atomic():
        changed = Operation.objects.filter(pk=operation.pk).exclude(status__in=FINISHED_STATUSES).update(rate=rate)
        if not changed:
            operation.refresh_from_db()
            raise OperationError(f"operation {operation.pk} is {operation.status}; its rate cannot change")
        record_audit(
            actor=actor,
            action="operation.rate",
            target=audit_target(operation),
            detail=f"rate {operation.rate or 'unlimited'} -> {rate or 'unlimited'}",
        )
    operation.refresh_from_db()
    return operation
