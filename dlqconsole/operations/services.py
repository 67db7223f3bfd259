"""Bulk recovery: plan an operation over a frozen set of dead letters, start, pause, resume, cancel it, change its
rate; edit and retry one message; hand stale operations to a live worker; expire archives.

Pages, the admin, the `dlq` command and the Celery tasks all call these; the run loop itself is in runner.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import uuid
from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from dlqconsole.accounts.roles import ADMIN, OPERATOR, require_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.core import jsonsafe, replay_guard
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.counters import CountedRow, add_counts, count_status_change
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations import routing
from dlqconsole.operations.destinations import (
    Destination,
    check_destinations,
    move_destination,
    refused_destination,
    retry_destination,
)
from dlqconsole.operations.item_sql import busy_elsewhere, delete_dead_letters, finalize_cancelled
from dlqconsole.operations.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    PUBLISHING_KINDS,
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    OperationStatus,
    eligible_statuses,
)
from dlqconsole.operations.runner import run_operation
from dlqconsole.operations.taking import CUT_BODY

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None
# Breakdown tables keep the biggest entries; the rest are summed under "other".
BREAKDOWN_ROWS = 50
# Bounds on numbers typed into a plan: far beyond any real DLQ, and within the columns and SQL that hold them.
MAX_LIMIT = 1_000_000_000
MAX_CANARY = 1_000_000
# A plan older than this is a stale snapshot (dead letters that arrived since are not in it): the operation page
# asks for an explicit confirmation before starting it.
STALE_PLAN_AGE = dt.timedelta(minutes=15)
NO_DESTINATION = "no known destination (no queue, exchange or routing key in its x-death)"

__all__ = [
    "OperationError",
    "cancel_operation",
    "change_rate",
    "delete_expired_archives",
    "edit_and_retry",
    "pause_operation",
    "plan_operation",
    "requeue_stale_operations",
    "required_role",
    "resume_operation",
    "run_operation",
    "start_operation",
]


class OperationError(Exception):
    """An operation cannot be planned or changed as asked; the message says why, in words fit for the user."""


def required_role(kind: str) -> str:
    """Purging deletes for good, so it needs an admin; every other kind an operator."""
    return ADMIN if kind == OperationKind.PURGE else OPERATOR


def _check_role(actor: Actor, kind: str) -> None:
    # A None actor is the system itself (beat, the shell command); people are checked here as well as in views.
    if actor is not None:
        require_role(actor, required_role(kind))


def _target(operation: Operation) -> str:
    return f"operation:{operation.pk}"


def enqueue_run(operation: Operation) -> None:
    """Hand the operation to a worker once the current transaction commits."""
    # Imported here: the tasks import this module (a service enqueueing its own task).
    from dlqconsole.operations.tasks import run_operation_task

    # Celery's DjangoTask has delay_on_commit; celery-types does not know it yet.
    run_operation_task.delay_on_commit(operation.pk)  # type: ignore[attr-defined]


# Planning ----------------------------------------------------------------------------------------------------


def plan_operation(
    *,
    kind: str,
    filter: DeadLetterFilter | dict[str, Any],  # noqa: A002  (the filter language's own name)
    actor: Actor,
    target_queue: str = "",
    target_exchange: str = "",
    target_routing_key: str = "",
    rate: str = "",
    canary_size: int = 0,
    canary_wait_seconds: int | None = None,
    max_return_share: float | None = None,
    limit: int | None = None,
) -> Operation:
    """Freeze exactly the dead letters matching `filter` now (later arrivals are not swept in) and describe them:
    count, breakdown by queue, pattern and destination, and the ones that cannot be replayed and why."""
    if kind not in OperationKind.values:
        raise OperationError(f"unknown operation {kind!r}; one of {', '.join(OperationKind.values)}")
    _check_role(actor, kind)
    try:
        found = filter if isinstance(filter, DeadLetterFilter) else DeadLetterFilter.from_dict(filter)
        found.validate()
    except FilterError as error:
        raise OperationError(str(error)) from None
    if "\x00" in found.payload:
        # The plan keeps its filter in jsonb, which cannot hold a NUL (the messages page can still search for one).
        raise OperationError(
            "a payload search with a NUL character cannot be kept in a plan; search for the text around it"
        )
    target_queue, target_exchange = target_queue.strip(), target_exchange.strip()
    target_routing_key = target_routing_key.strip()
    for label, name in (("target queue", target_queue), ("target exchange", target_exchange)):
        _check_amqp_name(label, name)
    _check_amqp_name("routing key", target_routing_key)
    if kind == OperationKind.MOVE:
        if bool(target_queue) == bool(target_exchange):
            raise OperationError("a move needs a target queue, or a target exchange and routing key (not both)")
    elif target_queue or target_exchange or target_routing_key:
        raise OperationError(f"only a move takes a target; a {kind} does not")
    if target_routing_key and not target_exchange:
        raise OperationError("a routing key goes with a target exchange")
    if kind == OperationKind.MOVE:
        target = move_destination(
            target_queue=target_queue, target_exchange=target_exchange, target_routing_key=target_routing_key
        )
        if refused := refused_destination(target):
            raise OperationError(f"cannot move there: {refused.removeprefix('refused: ')}")
    rate = rate.strip()
    if rate:
        if kind not in PUBLISHING_KINDS:
            raise OperationError(f"a {kind} publishes nothing, so it takes no rate")
        try:
            rate = str(parse_rate(rate))
        except ValueError as error:
            raise OperationError(str(error)) from None
    if canary_size < 0:
        raise OperationError("the canary size cannot be negative")
    if canary_size > MAX_CANARY:
        raise OperationError(f"the canary size must be at most {MAX_CANARY:,}")
    if canary_size and kind not in PUBLISHING_KINDS:
        raise OperationError(f"a {kind} publishes nothing, so it has no canary")
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise OperationError(f"the limit must be between 1 and {MAX_LIMIT:,}")
    wait = settings.DLQ_CANARY_WAIT_SECONDS if canary_wait_seconds is None else canary_wait_seconds
    if wait < 0:
        raise OperationError("the canary wait cannot be negative")
    share = settings.DLQ_OPERATION_MAX_RETURN_SHARE if max_return_share is None else max_return_share
    if not 0 <= share <= 1:
        raise OperationError("the share of returns that pauses an operation is between 0 and 1")

    if kind == OperationKind.RESTORE and not found.status:
        found.status = [DeadLetterStatus.ARCHIVED]
    statuses = eligible_statuses(kind, found.status)
    if not statuses:
        raise OperationError(f"a {kind} cannot act on dead letters with status {', '.join(found.status)}")
    matching = found.apply().filter(status__in=statuses)

    with transaction.atomic():
        operation = Operation.objects.create(
            kind=kind,
            filter=found.to_dict(),
            target_queue=target_queue,
            target_exchange=target_exchange,
            target_routing_key=target_routing_key,
            rate=rate,
            canary_size=canary_size,
            canary_wait_seconds=wait,
            max_return_share=share,
            created_by=actor if isinstance(actor, User) else None,
        )
        total = _freeze(operation, matching, limit=limit)
        if canary_size and canary_size >= total > 0:
            # Rolls the plan back: such a canary would replay every message before anything is watched.
            raise OperationError(
                f"a canary of {canary_size:,} is not smaller than the plan ({total:,} message"
                f"{'' if total == 1 else 's'}): it would replay them all before watching any; choose a canary "
                f"under {total:,}, or none"
            )
        operation.total = total
        operation.breakdown = _breakdown(operation)
        operation.save(update_fields=["total", "breakdown"])
    if kind in PUBLISHING_KINDS and total:
        _find_unreplayable(operation)
    record_audit(
        actor=actor,
        action=f"operation.{kind}.plan",
        target=_target(operation),
        filter=operation.filter,
        count=total,
        detail=_describe(operation),
    )
    return operation


def _check_amqp_name(label: str, name: str) -> None:
    """AMQP names are at most 255 bytes (so are the columns that keep them); PostgreSQL text holds no NUL."""
    if "\x00" in name:
        raise OperationError(f"the {label} cannot hold a NUL character")
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise OperationError(f"the {label} is longer than 255 bytes, the most AMQP allows")


def _freeze(operation: Operation, matching: Any, *, limit: int | None) -> int:
    """Copy the ids of the matching dead letters into items in one INSERT ... SELECT: one consistent snapshot."""
    ids = matching.order_by("id").values("id")
    if limit is not None:
        ids = ids[:limit]
    sql, params = ids.query.sql_with_params()
    table = connection.ops.quote_name(OperationItem._meta.db_table)
    with connection.cursor() as cursor:
        columns = "operation_id, dead_letter_id, status, attempts, error, destination"
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT %s, frozen.id, %s, 0, '', '' FROM ({sql}) frozen",
            [operation.pk, ItemStatus.PENDING, *params],
        )
        return max(0, cursor.rowcount)


def _frozen(operation: Operation) -> Any:
    return DeadLetter.objects.filter(
        pk__in=OperationItem.objects.filter(operation=operation).values("dead_letter_id")
    ).order_by()


def _top(counts: Counter[str]) -> dict[str, int]:
    top = dict(counts.most_common(BREAKDOWN_ROWS))
    rest = sum(counts.values()) - sum(top.values())
    if rest:
        top["other"] = rest
    return top


def _breakdown(operation: Operation) -> dict[str, Any]:
    frozen = _frozen(operation)
    queues: Counter[str] = Counter()
    for row in frozen.values("source_queue").annotate(n=Count("pk")):
        queues[row["source_queue"]] += row["n"]
    patterns = [
        {"id": row["pattern_id"], "template": row["pattern__template"][:200], "count": row["n"]}
        for row in frozen.values("pattern_id", "pattern__template")
        .annotate(n=Count("pk"))
        .order_by("-n")[:BREAKDOWN_ROWS]
    ]
    destinations: Counter[str] = Counter()
    for destination, n in _destination_groups(operation).items():
        destinations[str(destination) if destination else "none"] += n
    return {"queue": _top(queues), "pattern": patterns, "destination": _top(destinations)}


def _destination_groups(operation: Operation) -> Counter[Destination | None]:
    """How many of the plan's dead letters go to each destination (None: nowhere known). Dead letters whose body
    was cut at ingest are left out: they go nowhere (see _find_unreplayable)."""
    groups: Counter[Destination | None] = Counter()
    if operation.kind == OperationKind.MOVE:
        groups[
            move_destination(
                target_queue=operation.target_queue,
                target_exchange=operation.target_exchange,
                target_routing_key=operation.target_routing_key,
            )
        ] = _frozen(operation).filter(body_truncated=False).count()
    elif operation.kind in PUBLISHING_KINDS:
        rows = (
            _frozen(operation)
            .filter(body_truncated=False)
            .values("original_exchange", "original_routing_keys", "original_queue")
            .annotate(n=Count("pk"))
        )
        for row in rows:
            destination = retry_destination(
                exchange=row["original_exchange"],
                routing_keys=row["original_routing_keys"],
                queue=row["original_queue"],
            )
            groups[destination] += row["n"]
    return groups


def _find_unreplayable(operation: Operation) -> None:
    """Passive declares of every destination: missing exchanges and queues, and dead letters with nowhere to go."""
    groups = _destination_groups(operation)
    reasons: Counter[str] = Counter()
    reasons[NO_DESTINATION] = groups.pop(None, 0)
    reasons[CUT_BODY] = _frozen(operation).filter(body_truncated=True).count()
    state: dict[str, tuple[int, int]] = {}
    refused = {
        destination: reason
        for destination in groups
        if destination is not None and (reason := refused_destination(destination))
    }
    try:
        problems = check_destinations(
            {destination for destination in groups if destination is not None and destination not in refused},
            queue_state=state,
        )
    except Exception as error:  # noqa: BLE001  (a plan is still useful without the broker's view)
        operation.last_error = f"could not check the destinations on RabbitMQ: {error}"[:2000]
        problems = {}
    problems.update(refused)
    operation.breakdown["bindings"] = _check_bindings(
        [destination for destination in groups if destination is not None and destination.exchange], problems
    )
    # What the destination queues looked like when the plan was made: a queue nobody consumes, or one already
    # deep, is worth a second look (and a lower rate) before replaying into it.
    operation.breakdown["destination_queues"] = {
        name: {"messages": messages, "consumers": consumers}
        for name, (messages, consumers) in sorted(state.items())[:BREAKDOWN_ROWS]
    }
    for destination, n in groups.items():
        if destination is not None and problems.get(destination):
            reasons[problems[destination]] += n
    # A CC or BCC header routes a message further, on the same exchange: each of its keys is a destination too.
    for destination, by_reason in _routing_header_refusals(operation).items():
        if destination is not None and not problems.get(destination):
            reasons.update(by_reason)
    operation.unreplayable_reasons = {reason: n for reason, n in reasons.most_common() if n}
    operation.unreplayable = sum(operation.unreplayable_reasons.values())
    operation.save(update_fields=["unreplayable", "unreplayable_reasons", "last_error", "breakdown"])


def _routing_header_refusals(operation: Operation) -> dict[Destination | None, Counter[str]]:
    """Per destination, how many of the plan's dead letters their CC or BCC header keeps from being replayed, by
    reason. Few dead letters carry those headers: they are read one by one."""
    found: dict[Destination | None, Counter[str]] = {}
    rows = (
        _frozen(operation)
        .filter(body_truncated=False, headers__has_any_keys=list(replay_guard.ROUTING_HEADERS))
        .values_list("original_exchange", "original_routing_keys", "original_queue", "headers")
    )
    for exchange, routing_keys, queue, headers in rows.iterator(chunk_size=500):
        if operation.kind == OperationKind.MOVE:
            destination: Destination | None = move_destination(
                target_queue=operation.target_queue,
                target_exchange=operation.target_exchange,
                target_routing_key=operation.target_routing_key,
            )
        else:
            destination = retry_destination(exchange=exchange, routing_keys=routing_keys, queue=queue)
        if destination is not None and (refused := replay_guard.header_refusal(destination.exchange, headers)):
            found.setdefault(destination, Counter())[f"refused: {refused}"] += 1
    return found


def _check_bindings(destinations: list[Destination], problems: dict[Destination, str]) -> str:
    """Adds to `problems` the exchanges that route a destination's key to no queue, as the management API tells;
    returns what the plan page says of it ("" when there was nothing to check)."""
    to_check = [destination for destination in destinations if not problems.get(destination)]
    if not to_check:
        return ""
    api = routing.api_from_settings()
    if api is None:
        return "not checked (RABBITMQ_API_URL is off)"
    try:
        found = routing.routing_problems({(d.exchange, d.routing_key) for d in to_check}, api=api)
    except routing.RoutingUnknown as error:
        return f"not checked: {error}"
    for destination in to_check:
        problems[destination] = found.get((destination.exchange, destination.routing_key), "")
    return f"checked on {api}"


def _describe(operation: Operation) -> str:
    parts = [operation.get_kind_display()]
    if operation.target_display:
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
    _check_role(actor, operation.kind)
    if operation.total == 0 and operation.status == OperationStatus.PLANNED:
        # A run of nothing would only read as "Running" and then "Done": say so instead (the CLI says "Nothing to
        # do" before it gets here; the operation page and the admin would start it).
        raise OperationError(EMPTY_PLAN.format(kind=operation.get_kind_display().lower()))
    if stale_confirmed is False and timezone.now() - operation.created_at > STALE_PLAN_AGE:
        raise OperationError(
            f"Nothing was started: this plan was made {_minutes(timezone.now() - operation.created_at)} ago and "
            "dead letters that arrived since are not in it. Tick the box to start it anyway, or plan again."
        )
    if operation.kind == OperationKind.PURGE and typed_count is not None:
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
            target=_target(operation),
            filter=operation.filter,
            count=operation.total,
            detail=_describe(operation),
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
        action="operation.purge.start_refused",
        target=_target(operation),
        filter=operation.filter,
        count=total,
        detail=f"typed {typed!r} instead of {total}" if typed else "no count typed",
    )
    noun = f"{total:,} message{'' if total == 1 else 's'}"
    if not typed:
        raise OperationError(f"Nothing was deleted: type {total} (the number of messages) to purge these {noun}.")
    raise OperationError(
        f"Nothing was deleted: you typed {typed[:40]}, but this purge deletes {noun}. Type {total} to confirm."
    )


def pause_operation(*, operation: Operation, actor: Actor, reason: str = "") -> Operation:
    _check_role(actor, operation.kind)
    name = actor.get_username() if isinstance(actor, AbstractBaseUser) else "the system"
    reason = reason.strip() or f"paused by {name}"
    with transaction.atomic():
        paused = Operation.objects.filter(pk=operation.pk, status__in=ACTIVE_STATUSES).update(
            status=OperationStatus.PAUSED, pause_reason=reason[:2000], paused_automatically=False
        )
        if not paused:
            operation.refresh_from_db()
            raise OperationError(f"operation {operation.pk} is {operation.status}; only a running one can pause")
        record_audit(actor=actor, action="operation.pause", target=_target(operation), detail=reason)
    operation.refresh_from_db()
    return operation


def resume_operation(*, operation: Operation, actor: Actor) -> Operation:
    """Paused → running again; the share of returns that pauses the operation is measured afresh from here.

    A canary not yet judged goes on where it stopped: back to the canary, to publish the rest of it or to watch
    until the end of its wait (judged at once if the pause outlasted the wait). A failed canary is not run a
    second time: a person resuming after it overrides it."""
    _check_role(actor, operation.kind)
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
        )
        if not resumed:
            raise OperationError(f"operation {operation.pk} is {operation.status}; only a paused one can resume")
        detail = _describe(operation)
        if operation.last_error:
            detail = f"{detail}; the error before the resume: {operation.last_error}"[:2000]
        record_audit(actor=actor, action="operation.resume", target=_target(operation), detail=detail)
        enqueue_run(operation)
    operation.refresh_from_db()
    return operation


def cancel_operation(*, operation: Operation, actor: Actor) -> Operation:
    """Stop for good. What was published stays published; the rest is skipped and its dead letters stay as they
    are. A worker in the middle of a chunk finishes recording it first."""
    _check_role(actor, operation.kind)
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
            target=_target(operation),
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
    _check_role(actor, operation.kind)
    if operation.kind not in PUBLISHING_KINDS:
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
            target=_target(operation),
            detail=f"rate {operation.rate or 'unlimited'} -> {rate or 'unlimited'}",
        )
    operation.refresh_from_db()
    return operation


def retry_dead_letter(
    *, dead_letter: DeadLetter, actor: Actor, submission: str, seen_status: str | None = None
) -> Operation:
    """Retry one dead letter from its page: plan a retry of just this message and start it.

    `submission` names the form that asked: sent again (a double click, a reload of the POST), it returns the
    operation of the first send. `seen_status` is the status the page showed: a dead letter whose status changed
    since (replayed by someone else, say) is not retried unseen."""
    _check_role(actor, OperationKind.RETRY)
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
    _check_role(actor, OperationKind.EDIT_RETRY)
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
    copy.save(force_insert=True)
    add_counts([(copy.source_queue, copy.pattern_id, copy.failure_reason, DeadLetterStatus.PARKED, 1)])
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
        .values_list("source_queue", "pattern_id", "failure_reason", "status")
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


# Upkeep (Celery beat) ----------------------------------------------------------------------------------------


def requeue_stale_operations(*, now: dt.datetime | None = None) -> list[int]:
    """Hand every active operation whose worker went quiet (killed, or its task lost) to a live worker."""
    now = now or timezone.now()
    stale = (
        Operation.objects.stale(now=now, stale_after=dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS))
        .exclude(status=OperationStatus.CANARY, canary_until__gt=now)
        .order_by("pk")
    )
    requeued = []
    for operation in stale:
        # Take the claim away from the silent worker and start the clock again, so that one task is queued per
        # stale period (not one per sweep while it waits behind other work) and a worker that only stalled finds
        # on its next heartbeat that the operation is no longer its own.
        handed = stale.filter(pk=operation.pk).update(runner="", heartbeat_at=now)
        if handed:
            logger.info("operation %s has no live worker; requeueing it", operation.pk)
            enqueue_run(operation)
            requeued.append(operation.pk)
    return requeued


def delete_expired_archives(*, now: dt.datetime | None = None, batch_size: int = 1000) -> int:
    """Delete dead letters archived longer than DLQ_ARCHIVE_RETENTION_DAYS, a batch per transaction. Each batch
    writes its audit row (its count and queues) in its own transaction, so a run killed midway leaves a record of
    every deletion it committed, and a batch that rolled back leaves neither."""
    now = now or timezone.now()
    days = settings.DLQ_ARCHIVE_RETENTION_DAYS
    cutoff = now - dt.timedelta(days=days)
    deleted = 0
    while True:
        with transaction.atomic():
            rows = list(
                DeadLetter.objects.select_for_update(skip_locked=True)
                .filter(status=DeadLetterStatus.ARCHIVED, status_changed_at__lt=cutoff)
                .order_by("pk")
                .values_list("pk", "source_queue", "pattern_id", "failure_reason", "status")[:batch_size]
            )
            if not rows:
                break
            delete_dead_letters(ids=[row[0] for row in rows])
            count_status_change([CountedRow(*row[1:]) for row in rows], to_status=None)
            queues = sorted({row[1] for row in rows})
            record_audit(
                actor=None,
                action="archive.retention",
                filter={"status": [DeadLetterStatus.ARCHIVED], "queue": queues, "until": cutoff.isoformat()},
                count=len(rows),
                detail=f"deleted dead letters archived more than {days} days ago (ids {rows[0][0]} to {rows[-1][0]})",
            )
        deleted += len(rows)
    return deleted
