"""Planning an operation: freeze exactly the dead letters a filter matches now, and describe them (how many, by
broker, queue, pattern and destination, and which cannot be replayed and why). Nothing runs until the plan is
started.

Each destination is checked on its own broker: a retry's on the broker each dead letter came from, a move's on its
target broker (or, without one, on each dead letter's own)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.brokers.secrets import CredentialsError
from dlqconsole.core import replay_guard
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations import routing
from dlqconsole.operations.destinations import (
    Destination,
    KnownBrokers,
    check_destinations,
    move_destination,
    on_broker,
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
    target_broker: str = "",
    rate: str = "",
    canary_size: int = 0,
    canary_wait_seconds: int | None = None,
    max_return_share: float | None = None,
    limit: int | None = None,
) -> Operation:
    """Freeze exactly the dead letters matching `filter` now (later arrivals are not swept in) and describe them:
    count, breakdown by broker, queue, pattern and destination, and the ones that cannot be replayed and why.

    `target_broker` names the broker a move goes to; empty, each dead letter goes to its own broker (a retry
    always does)."""
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
    broker = find_target_broker(kind, target_broker)
    if kind == OperationKind.MOVE:
        target = move_destination(
            target_queue=target_queue,
            target_exchange=target_exchange,
            target_routing_key=target_routing_key,
            broker=broker.name if broker else DEFAULT,
        )
        # The console's own queues, refused on every broker; Celery's control channels are refused on the target
        # broker when it is the console's vhost (each dead letter's own broker is judged once the set is frozen).
        shared = broker is not None and registry.shares_celery_vhost(broker)
        if refused := refused_destination(target, shared_vhost=shared):
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
            target_broker=broker,
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
        brokers = KnownBrokers()
        operation.breakdown = _breakdown(operation, brokers)
        if kind == OperationKind.MOVE and broker is None:
            _check_move_on_each_broker(operation, brokers)
        operation.save(update_fields=["total", "breakdown"])
    if kind in PUBLISHING_KINDS and total:
        _find_unreplayable(operation, brokers)
    record_audit(
        actor=actor,
        action=f"operation.{kind}.plan",
        target=audit_target(operation),
        filter=operation.filter,
        count=total,
        detail=describe_operation(operation),
    )
    return operation


def find_target_broker(kind: str, name: str) -> Broker | None:
    """The broker a move names (None: each dead letter's own); OperationError for an unknown or disabled one, or
    for a target broker on anything but a move."""
    name = name.strip()
    if not name:
        return None
    if kind != OperationKind.MOVE:
        raise OperationError(f"only a move takes a target broker; a {kind} goes back to each dead letter's own broker")
    try:
        broker = registry.get(name)
    except registry.UnknownBroker as error:
        raise OperationError(f"cannot move there: {error}") from None
    if not broker.enabled:
        raise OperationError(f"cannot move there: broker {broker.name!r} is disabled")
    return broker


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


def _breakdown(operation: Operation, brokers: KnownBrokers) -> dict[str, Any]:
    frozen = _frozen(operation)
    queues: Counter[str] = Counter()
    by_broker: Counter[str] = Counter()
    for row in frozen.values("broker_id", "source_queue").annotate(n=Count("pk")):
        name = brokers.name(row["broker_id"])
        by_broker[name] += row["n"]
        queues[on_broker(name, row["source_queue"])] += row["n"]
    patterns = [
        {"id": row["pattern_id"], "template": row["pattern__template"][:200], "count": row["n"]}
        for row in frozen.values("pattern_id", "pattern__template")
        .annotate(n=Count("pk"))
        .order_by("-n")[:BREAKDOWN_ROWS]
    ]
    destinations: Counter[str] = Counter()
    for destination, n in _destination_groups(operation, brokers).items():
        destinations[str(destination) if destination else "none"] += n
    return {
        "queue": _top(queues),
        "pattern": patterns,
        "destination": _top(destinations),
        # Every broker the set spans, biggest first: a plan that spans several says so before it starts.
        "brokers": dict(by_broker.most_common()),
    }


def _move_target(operation: Operation, broker: str) -> Destination:
    return move_destination(
        target_queue=operation.target_queue,
        target_exchange=operation.target_exchange,
        target_routing_key=operation.target_routing_key,
        broker=broker,
    )


def _destination_groups(operation: Operation, brokers: KnownBrokers) -> Counter[Destination | None]:
    """How many of the plan's dead letters go to each destination, on its broker (None: nowhere known). Dead
    letters whose body was cut at ingest are left out: they go nowhere (see _find_unreplayable)."""
    groups: Counter[Destination | None] = Counter()
    replayable = _frozen(operation).filter(body_truncated=False)
    if operation.kind == OperationKind.MOVE:
        if operation.target_broker_id is not None:
            groups[_move_target(operation, brokers.name(operation.target_broker_id))] = replayable.count()
        else:
            for row in replayable.values("broker_id").annotate(n=Count("pk")):
                groups[_move_target(operation, brokers.name(row["broker_id"]))] += row["n"]
    elif operation.kind in PUBLISHING_KINDS:
        rows = replayable.values("broker_id", "original_exchange", "original_routing_keys", "original_queue").annotate(
            n=Count("pk")
        )
        for row in rows:
            destination = retry_destination(
                exchange=row["original_exchange"],
                routing_keys=row["original_routing_keys"],
                queue=row["original_queue"],
                broker=brokers.name(row["broker_id"]),
            )
            groups[destination] += row["n"]
    return groups


def _check_move_on_each_broker(operation: Operation, brokers: KnownBrokers) -> None:
    """A move without a target broker goes to each dead letter's own: its target is refused on any of them that
    is the console's Celery vhost (OperationError rolls the plan back)."""
    for destination in _destination_groups(operation, brokers):
        if destination is None or brokers.problem(destination.broker):
            continue  # listed as not replayable (a disabled broker)
        if refused := brokers.refusal(destination):
            why = refused.removeprefix("refused: ")
            raise OperationError(f"cannot move there on broker {destination.broker}: {why}")


def _on_its_broker(destination: Destination, problem: str) -> str:
    """A destination's problem as the plan lists it: naming the broker unless it is default (or the text does)."""
    return problem if problem.startswith("broker ") else on_broker(destination.broker, problem)


def _find_unreplayable(operation: Operation, brokers: KnownBrokers) -> None:
    """Passive declares of every destination on its broker: missing exchanges and queues, and dead letters with
    nowhere to go."""
    groups = _destination_groups(operation, brokers)
    reasons: Counter[str] = Counter()
    reasons[NO_DESTINATION] = groups.pop(None, 0)
    reasons[CUT_BODY] = _frozen(operation).filter(body_truncated=True).count()
    refused = {
        destination: reason
        for destination in groups
        if destination is not None and (reason := brokers.unpublishable(destination))
    }
    by_broker: dict[str, set[Destination]] = {}
    for destination in groups:
        if destination is not None and destination not in refused:
            by_broker.setdefault(destination.broker, set()).add(destination)
    problems: dict[Destination, str] = {}
    state: dict[str, tuple[int, int]] = {}
    unchecked: list[str] = []
    for name, destinations in sorted(by_broker.items()):
        found: dict[str, tuple[int, int]] = {}
        try:
            problems.update(check_destinations(destinations, broker=brokers.named(name), queue_state=found))
        except Exception as error:  # noqa: BLE001  (a plan is still useful without the broker's view)
            where = "RabbitMQ" if name == DEFAULT else f"broker {name}"
            unchecked.append(f"could not check the destinations on {where}: {error}")
        state.update({on_broker(name, queue): depth for queue, depth in found.items()})
    if unchecked:
        operation.last_error = "; ".join(unchecked)[:2000]
    problems.update(refused)
    operation.breakdown["bindings"] = _check_bindings(
        [destination for destination in groups if destination is not None and destination.exchange], problems, brokers
    )
    # What the destination queues looked like when the plan was made: a queue nobody consumes, or one already
    # deep, is worth a second look (and a lower rate) before replaying into it.
    operation.breakdown["destination_queues"] = {
        name: {"messages": messages, "consumers": consumers}
        for name, (messages, consumers) in sorted(state.items())[:BREAKDOWN_ROWS]
    }
    for destination, n in groups.items():
        if destination is not None and problems.get(destination):
            reasons[_on_its_broker(destination, problems[destination])] += n
    # A CC or BCC header routes a message further, on the same exchange: each of its keys is a destination too.
    for destination, by_reason in _routing_header_refusals(operation, brokers).items():
        if destination is not None and not problems.get(destination):
            reasons.update(by_reason)
    operation.unreplayable_reasons = {reason: n for reason, n in reasons.most_common() if n}
    operation.unreplayable = sum(operation.unreplayable_reasons.values())
    operation.save(update_fields=["unreplayable", "unreplayable_reasons", "last_error", "breakdown"])


def _routing_header_refusals(operation: Operation, brokers: KnownBrokers) -> dict[Destination | None, Counter[str]]:
    """Per destination, how many of the plan's dead letters their CC or BCC header keeps from being replayed, by
    reason. Few dead letters carry those headers: they are read one by one."""
    found: dict[Destination | None, Counter[str]] = {}
    rows = (
        _frozen(operation)
        .filter(body_truncated=False, headers__has_any_keys=list(replay_guard.ROUTING_HEADERS))
        .values_list("broker_id", "original_exchange", "original_routing_keys", "original_queue", "headers")
    )
    for broker_id, exchange, routing_keys, queue, headers in rows.iterator(chunk_size=500):
        name = brokers.name(operation.target_broker_id or broker_id)
        if operation.kind == OperationKind.MOVE:
            destination: Destination | None = _move_target(operation, name)
        else:
            destination = retry_destination(exchange=exchange, routing_keys=routing_keys, queue=queue, broker=name)
        if destination is not None and (refused := brokers.header_refusal(destination, headers)):
            found.setdefault(destination, Counter())[refused] += 1
    return found


def _check_bindings(destinations: list[Destination], problems: dict[Destination, str], brokers: KnownBrokers) -> str:
    """Adds to `problems` the exchanges that route a destination's key to no queue, as each broker's management API
    tells; returns what the plan page says of it ("" when there was nothing to check)."""
    to_check: dict[str, list[Destination]] = {}
    for destination in destinations:
        if not problems.get(destination):
            to_check.setdefault(destination.broker, []).append(destination)
    notes = []
    for name, on_this in sorted(to_check.items()):
        note = _check_bindings_on(brokers.named(name), on_this, problems)
        notes.append(note if name == DEFAULT else f"{name}: {note}")
    return "; ".join(notes)


def _check_bindings_on(broker: Broker, destinations: list[Destination], problems: dict[Destination, str]) -> str:
    try:
        api = registry.api(broker)
    except CredentialsError as error:
        return f"not checked: {error}"
    if api is None:
        return "not checked (RABBITMQ_API_URL is off)" if broker.is_default else "not checked (its API is off)"
    try:
        found = routing.routing_problems({(d.exchange, d.routing_key) for d in destinations}, api=api)
    except routing.RoutingUnknown as error:
        return f"not checked: {error}"
    for destination in destinations:
        problems[destination] = found.get((destination.exchange, destination.routing_key), "")
    return f"checked on {api}"
