"""Planning a shed: take the low-priority messages out of a flooded work queue, keeping each as an archived dead
letter (reason SHED) that a restore and a retry put back. How a shed runs is in shedding.py; why it runs so is in
docs/operations.md ("Shedding a flooded queue").

A plan reads the queue as it is now: its depth and consumers (a passive declare), its type and x-max-priority (the
management API, else the watched queue's row). It refuses what a shed must not touch: a queue that does not exist,
the console's own queues, the dead-letter queues the console drains, quorum queues and streams.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import requests
from django.contrib.auth.models import User
from django.db import transaction
from pika.exceptions import AMQPError, ChannelClosedByBroker

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, NAME_HELP, NAME_PATTERN, Broker
from dlqconsole.brokers.secrets import CredentialsError
from dlqconsole.core import replay_guard
from dlqconsole.core.amqp import queue_depth
from dlqconsole.core.durations import format_duration
from dlqconsole.core.http import DeniedAddressError, HttpError, check_target, guarded_session
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.deadletters.models import FailureReason
from dlqconsole.operations.models import Operation, OperationKind
from dlqconsole.operations.planning import check_amqp_name, check_limit
from dlqconsole.operations.services import Actor, OperationError, audit_target, check_role
from dlqconsole.operations.shedding import storage

# AMQP priorities are an octet; a classic queue honours up to 255 levels.
MAX_PRIORITY = 255
# The oldest a message may be asked to be: ten years, far beyond any queue's messages.
MAX_OLDER_THAN = 10 * 365 * 86400
API_TIMEOUT = (2.0, 5.0)
# A priority or a limit typed in: far beyond any queue's depth, short enough for int().
MAX_NUMBER_DIGITS = 18
QUORUM_REFUSAL = (
    "it is a quorum queue. A shed gives back the messages it keeps with basic.nack(requeue=true), and before "
    "RabbitMQ 4.3 every such return counts toward a quorum queue's delivery limit (x-delivery-limit, 20 by "
    "default from 4.0): messages would be dead-lettered or dropped for it. Its priorities are not what "
    "--priority-below assumes either (a quorum queue has two, normal and high, not 0 to x-max-priority)."
)
STREAM_REFUSAL = "it is a stream: consuming a stream removes nothing from it, so there is nothing a shed could take"


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
    facts = inspect_queue(found, queue)
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
    parts.append(
        f"({shed.get('type', '?')} queue, x-max-priority {shed.get('max_priority') or 'none'}, "
        f"{int(shed.get('depth') or 0):,} ready, {int(shed.get('consumers') or 0):,} consumers when planned)"
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


def refusal(broker: Broker, queue: str) -> str:
    """Why a shed must leave `queue` alone whatever it holds ("" when it may shed it): the console's own queues and
    the dead-letter queues it drains."""
    if refused := replay_guard.refusal("", queue, queue=queue, shared_vhost=registry.shares_celery_vhost(broker)):
        return refused
    if queue in storage().drained_queues(broker):
        return f"queue {queue!r} is a dead-letter queue the console drains: its messages are dead letters already"
    return ""


def inspect_queue(broker: Broker, queue: str) -> dict[str, Any]:
    """The queue's depth, consumers, type and x-max-priority now; OperationError when a shed must not touch it."""
    where = "" if broker.is_default else f" on broker {broker.name}"
    if refused := refusal(broker, queue):
        raise OperationError(f"cannot shed {queue!r}{where}: {refused}")
    try:
        connection = registry.connect(broker)
    except (AMQPError, OSError, CredentialsError) as error:
        raise OperationError(f"cannot reach broker {broker.name}: {error or type(error).__name__}") from None
    try:
        depth, consumers = queue_depth(connection.channel(), queue)
    except ChannelClosedByBroker as error:
        if error.reply_code == 404:
            raise OperationError(f"queue {queue!r} does not exist{where}") from None
        raise OperationError(f"queue {queue!r}{where}: {error.reply_text}") from None
    finally:
        if connection.is_open:
            connection.close()
    kind, arguments, source = _queue_type(broker, queue)
    if kind == "quorum":
        raise OperationError(f"cannot shed {queue!r}{where}: {QUORUM_REFUSAL}")
    if kind == "stream":
        raise OperationError(f"cannot shed {queue!r}{where}: {STREAM_REFUSAL}")
    if kind != "classic":
        raise OperationError(f"cannot shed {queue!r}{where}: a shed runs on classic queues only, and it is {kind!r}")
    if depth == 0:
        raise OperationError(f"queue {queue!r}{where} holds no ready message: there is nothing to shed")
    max_priority = arguments.get("x-max-priority")
    if not isinstance(max_priority, int) or isinstance(max_priority, bool):
        max_priority = None
    return {"depth": depth, "consumers": consumers, "type": kind, "max_priority": max_priority, "type_from": source}


def _queue_type(broker: Broker, queue: str) -> tuple[str, dict[str, Any], str]:
    """(type, arguments, where that was read): the management API says; without it, the watched queue's row."""
    problem = ""
    try:
        api = registry.api(broker)
    except CredentialsError as error:
        api, problem = None, str(error)
    if api is not None:
        try:
            check_target(api.base)
            response = guarded_session().get(
                f"{api.base}api/queues/{quote(api.vhost, safe='')}/{quote(queue, safe='')}",
                auth=api.auth,
                timeout=API_TIMEOUT,
                allow_redirects=False,
            )
            info = response.json() if response.status_code == 200 else None
        except (HttpError, DeniedAddressError, requests.RequestException, ValueError) as error:
            info, problem = None, f"the management API at {api} did not answer ({type(error).__name__})"
        if isinstance(info, dict):
            found = info.get("arguments")
            arguments: dict[str, Any] = found if isinstance(found, dict) else {}
            return str(info.get("type") or "classic"), arguments, "management API"
        problem = problem or f"the management API at {api} did not describe it"
    watched = storage().watched_kind(broker, queue)
    if watched is not None:
        return watched[0], watched[1], "watched queue"
    raise OperationError(
        f"cannot tell whether {queue!r} is a classic queue ({problem or 'the management API is off'}, and it is not a "
        "watched queue): a shed runs on classic queues only"
    )
