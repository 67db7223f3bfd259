"""Planning a shed: take the low-priority messages out of a flooded work queue, keeping each as an archived dead
letter (reason SHED) that a restore and a retry put back. How a shed runs is in shedding.py; why it runs so is in
docs/operations.md ("Shedding a flooded queue").

A plan reads the queue as it is now: its depth and consumers (a passive declare), its type and x-max-priority (the
management API, else the watched queue's row). It refuses what a shed must not touch (shed_queue.py, checked
again by every run): a queue that does not exist, the console's own queues, the dead-letter queues the console
drains, quorum queues and streams.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.template.defaultfilters import pluralize

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, NAME_HELP, NAME_PATTERN, Broker
from dlqconsole.core.durations import format_duration
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.deadletters.models import FailureReason
from dlqconsole.operations.models import Operation, OperationKind
from dlqconsole.operations.planning import check_amqp_name, check_limit
from dlqconsole.operations.services import Actor, OperationError, audit_target, check_role
from dlqconsole.operations.shed_queue import ShedRefused, inspect_queue

# AMQP priorities are an octet; a classic queue honours up to 255 levels.
MAX_PRIORITY = 255
# The oldest a message may be asked to be: ten years, far beyond any queue's messages.
MAX_OLDER_THAN = 10 * 365 * 86400
# A priority or a limit typed in: far beyond any queue's depth, short enough for int().
MAX_NUMBER_DIGITS = 18


def plan_shed(
    *,
    queue: str,
    priority_below: int,
    actor: Actor,
    older_than: int | None = None,
    limit: int | None = None,
    rate: str = "",
    broker: str = "",
) -> Operation:
    """Plan a shed of `queue` on `broker` (default when empty): the messages whose priority is below
    `priority_below` and, with `older_than` (seconds), whose `timestamp` property is at least that old. Nothing is
    taken until the plan is started (start_operation, which asks for the depth typed in, as a purge does)."""
    check_role(actor, OperationKind.SHED)
    queue = queue.strip()
    if not queue:
        raise OperationError("name the queue to shed")
    check_amqp_name("queue", queue)
    if not 1 <= priority_below <= MAX_PRIORITY:
        raise OperationError(f"--priority-below must be between 1 and {MAX_PRIORITY}: no priority is below 0")
    if older_than is not None and not 1 <= older_than <= MAX_OLDER_THAN:
        raise OperationError("--older-than must be at least one second, and at most ten years")
    check_limit(limit)
    rate = rate.strip()
    if rate:
        try:
            rate = str(parse_rate(rate))
        except ValueError as error:
            raise OperationError(str(error)) from None
    found = _broker(broker)
    try:
        facts = inspect_queue(found, queue)
    except ShedRefused as error:
        raise OperationError(str(error)) from None
    name = found.name
    shed = {
        "queue": queue,
        "broker": name,
        "priority_below": priority_below,
        "older_than": older_than,
        "older_than_text": format_duration(older_than) if older_than else "",
        "limit": limit,
        **facts,
    }
    with transaction.atomic():
        operation = Operation.objects.create(
            kind=OperationKind.SHED,
            filter={
                "queue": [queue],
                "reason": [FailureReason.SHED.value],
                **({} if found.is_default else {"broker": [name]}),
            },
            rate=rate,
            total=facts["depth"],
            breakdown={"shed": shed, "brokers": {name: facts["depth"]}},
            created_by=actor if isinstance(actor, User) else None,
        )
        record_audit(
            actor=actor,
            action="operation.shed.plan",
            target=audit_target(operation),
            filter=operation.filter,
            count=operation.total,
            detail=describe_shed(shed, rate=rate),
        )
    return operation


def describe_shed(shed: dict[str, Any], *, rate: str = "") -> str:
    """A shed's plan in words, for its audit rows and pages."""
    parts = [f"shed queue {shed.get('queue')}"]
    if shed.get("broker", DEFAULT) != DEFAULT:
        parts.append(f"on broker {shed.get('broker')}")
    parts.append(f"priority below {shed.get('priority_below')}")
    if shed.get("older_than"):
        parts.append(f"older than {format_duration(int(shed['older_than']))}")
    if shed.get("limit"):
        parts.append(f"at most {int(shed['limit']):,}")
    if rate:
        parts.append(f"at {rate}")
    consumers = int(shed.get("consumers") or 0)
    parts.append(
        f"({shed.get('type', '?')} queue, x-max-priority {shed.get('max_priority') or 'none'}, "
        f"{int(shed.get('depth') or 0):,} ready, {consumers:,} consumer{pluralize(consumers)} when planned)"
    )
    return " ".join(parts)


def whole_number(text: str) -> int:
    """A whole number typed into the shed form or the CLI: ASCII digits only ('٥' is a digit to int(), and should
    not name 5), at most MAX_NUMBER_DIGITS of them. ValueError otherwise."""
    text = text.strip()
    if not text or not (text.isascii() and text.isdigit()) or len(text) > MAX_NUMBER_DIGITS:
        raise ValueError(f"{text[:20]!r} is not a whole number")
    return int(text)


def _broker(name: str) -> Broker:
    name = name.strip() or DEFAULT
    if not re.fullmatch(NAME_PATTERN, name):
        # Checked before the registry is asked: a name PostgreSQL cannot hold (a NUL) would fail the query.
        raise OperationError(f"{name[:64]!r} is not a broker name ({NAME_HELP})")
    try:
        found = registry.get(name)
    except registry.UnknownBroker as error:
        raise OperationError(str(error)) from None
    if not found.enabled:
        raise OperationError(f"broker {found.name!r} is disabled")
    return found
