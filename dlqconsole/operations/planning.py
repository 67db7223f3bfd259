"""Planning an operation: freeze exactly the dead letters a filter matches now, and describe them (how many, by
queue, pattern and destination, and which cannot be replayed and why). Nothing runs until the plan is started."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count

from dlqconsole.accounts.services import record_audit
from dlqconsole.core import replay_guard
from dlqconsole.core.ratelimit import parse_rate
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
from dlqconsole.operations.models import (
    PUBLISHING_KINDS,
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    eligible_statuses,
)
from dlqconsole.operations.services import Actor, OperationError, audit_target, check_role, describe_operation
from dlqconsole.operations.taking import CUT_BODY

# Breakdown tables keep the biggest entries; the rest are summed under "other".
BREAKDOWN_ROWS = 50
# Bounds on numbers typed into a plan: far beyond any real DLQ, and within the columns and SQL that hold them.
MAX_LIMIT = 1_000_000_000
MAX_CANARY = 1_000_000
NO_DESTINATION = "no known destination (no queue, exchange or routing key in its x-death)"


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
    check_role(actor, kind)
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
        check_amqp_name(label, name)
    check_amqp_name("routing key", target_routing_key)
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
    check_canary_size(canary_size)
    if canary_size and kind not in PUBLISHING_KINDS:
        raise OperationError(f"a {kind} publishes nothing, so it has no canary")
    check_limit(limit)
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
        target=audit_target(operation),
        filter=operation.filter,
        count=total,
        detail=describe_operation(operation),
    )
    return operation


def check_amqp_name(label: str, name: str) -> None:
    """AMQP names are at most 255 bytes (so are the columns that keep them); PostgreSQL text holds no NUL.

    The checks of a plan's single values are functions of their own so that the plan form (forms.PlanForm) answers
    in the same words as a plan made by the admin or the `dlq` command."""
    if "\x00" in name:
        raise OperationError(f"the {label} cannot hold a NUL character")
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise OperationError(f"the {label} is longer than 255 bytes, the most AMQP allows")


def check_canary_size(canary_size: int) -> None:
    """A canary is some messages, and fewer than MAX_CANARY."""
    if canary_size < 0:
        raise OperationError("the canary size cannot be negative")
    if canary_size > MAX_CANARY:
        raise OperationError(f"the canary size must be at most {MAX_CANARY:,}")


def check_limit(limit: int | None) -> None:
    """No limit, or one between 1 and MAX_LIMIT."""
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise OperationError(f"the limit must be between 1 and {MAX_LIMIT:,}")


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
