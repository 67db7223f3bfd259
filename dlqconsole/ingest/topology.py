"""Declare a work queue with its dead-letter exchange and dead-letter queue, and watch the DLQ.

For a queue `Q` this declares, in order (so that nothing can die before its DLQ exists):

- `Q.dlx`, a durable **fanout** exchange. A message that dies is republished to its DLX with its original
  routing keys (we set no `x-dead-letter-routing-key`, so x-death and the replay target stay truthful). Those
  keys are whatever the publisher used (`orders.created`, `orders.eu.refund`, ...), so a direct exchange would
  need a binding per key and would silently drop dead letters with a key nobody foresaw. A fanout exchange
  ignores the key, and since each queue has its own DLX there is exactly one queue behind it: `Q.dlq`.
- `Q.dlq`, a durable queue of the same kind as `Q`. A quorum work queue was chosen for replication, and its dead
  letters are the only copy of the failed work until the console ingests them, so they deserve the same
  replication. The console never peeks a quorum DLQ with reject+requeue (that would count toward a delivery
  limit): `consume_dlq` acks after the commit, and pages read the database. A quorum DLQ has no delivery limit
  of its own (nothing would catch what it drops): RabbitMQ 3.x has none by default, and on 4.x, whose default
  is 20, we set `x-delivery-limit: -1` (unlimited there; on 3.x -1 would dead-letter on the first return).
- `Q` with `x-dead-letter-exchange: Q.dlx` and the optional limits:
  - `--delivery-limit N` (quorum only; classic queues have no delivery limit and RabbitMQ refuses the
    argument): a message returned more than N times (nack/reject with requeue, or a consumer that dies before
    acking) is dead-lettered with reason `delivery_limit`, so it is delivered at most N + 1 times.
  - `--message-ttl MS`: messages not consumed within MS milliseconds die with reason `expired`.
  - `--max-length N` with `x-overflow: drop-head`: when the queue is full the oldest message is dead-lettered
    (reason `maxlen`) and the publisher carries on. We do not use `reject-publish-dlx`: it nacks the publisher
    as well, so a publisher that retries on nack creates a second copy of a message that already sits in the
    DLQ; it is also a classic-queue feature (a quorum queue behaves as drop-head). `reject-publish` does not
    dead-letter at all.
  - Quorum queues without a max length get `x-dead-letter-strategy: at-least-once`: RabbitMQ keeps each dead
    message in `Q` until `Q.dlq` has confirmed it, instead of the default at-most-once that loses it when the DLQ
    is briefly unavailable. RabbitMQ only honours it with `x-overflow: reject-publish`, which never triggers
    while no length limit is set. With a max length the overflow must be drop-head (to dead-letter) and
    at-least-once is not available, so those queues keep at-most-once.

Declaring is idempotent: the same arguments again are a no-op. RabbitMQ never changes a queue's arguments in
place; different ones fail with PRECONDITION_FAILED, which we turn into a TopologyError that says what
differs and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pika
from django.db import transaction
from django.utils import timezone
from pika.exceptions import AMQPChannelError, AMQPConnectionError, ChannelClosedByBroker

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.secrets import CredentialsError
from dlqconsole.ingest.models import WatchedQueue

DEAD_LETTER_EXCHANGE_SUFFIX = ".dlx"
DEAD_LETTER_QUEUE_SUFFIX = ".dlq"
# AMQP short strings: queue and exchange names are at most 255 bytes, and we add a 4-byte suffix.
MAX_NAME_BYTES = 255 - len(DEAD_LETTER_QUEUE_SUFFIX)


class TopologyError(Exception):
    """A queue topology that cannot be declared as asked; the message says why and what to do."""


@dataclass(frozen=True)
class QueueTopology:
    name: str
    dead_letter_exchange: str
    dead_letter_queue: str
    kind: str
    arguments: dict[str, Any]
    dead_letter_queue_arguments: dict[str, Any]


def dead_letter_names(name: str) -> tuple[str, str]:
    """(dead-letter exchange, dead-letter queue) of a work queue."""
    return name + DEAD_LETTER_EXCHANGE_SUFFIX, name + DEAD_LETTER_QUEUE_SUFFIX


def queue_arguments(
    *,
    name: str,
    quorum: bool = False,
    delivery_limit: int | None = None,
    message_ttl: int | None = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """The `x-` arguments of the work queue. Raises TopologyError for a combination RabbitMQ would refuse.

    Anything else that declares the same queue (a Celery worker, the demo) must pass exactly these, or RabbitMQ
    refuses the second declaration.
    """
    _check_name(name)
    if delivery_limit is not None and not quorum:
        raise TopologyError(
            f"--delivery-limit needs --quorum: {name!r} would be a classic queue, and classic queues have no "
            "delivery limit (RabbitMQ refuses x-delivery-limit on them)."
        )
    for option, value, minimum in (
        ("--delivery-limit", delivery_limit, 0),
        ("--message-ttl", message_ttl, 0),
        ("--max-length", max_length, 1),
    ):
        if value is not None and not minimum <= value < 2**31:
            raise TopologyError(f"{option} must be an integer from {minimum} to {2**31 - 1}, not {value}.")
    exchange, _ = dead_letter_names(name)
    arguments: dict[str, Any] = {"x-dead-letter-exchange": exchange}
    if quorum:
        arguments["x-queue-type"] = "quorum"
    if delivery_limit is not None:
        arguments["x-delivery-limit"] = delivery_limit
    if message_ttl is not None:
        arguments["x-message-ttl"] = message_ttl
    if max_length is not None:
        arguments["x-max-length"] = max_length
        arguments["x-overflow"] = "drop-head"
    elif quorum:
        arguments["x-dead-letter-strategy"] = "at-least-once"
        arguments["x-overflow"] = "reject-publish"
    return arguments


def dead_letter_queue_arguments(*, quorum: bool, server_version: tuple[int, ...]) -> dict[str, Any]:
    if not quorum:
        return {}
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if server_version >= (4,):
        arguments["x-delivery-limit"] = -1
    return arguments


def declare_queue_topology(
    *,
    name: str,
    quorum: bool = False,
    delivery_limit: int | None = None,
    message_ttl: int | None = None,
    max_length: int | None = None,
    connection: pika.BlockingConnection | None = None,
    broker: Broker | None = None,
    actor: Any = None,
) -> QueueTopology:
    """Declare `name`, `name.dlx` and `name.dlq` on `broker` (default unless given) and record them as its
    WatchedQueue.

    Uses (and leaves open) `connection` when given (it must be to that broker), otherwise connects to the broker.
    Raises TopologyError with an explanation when RabbitMQ refuses, never a bare broker exception.
    """
    broker = broker or registry.default_broker()
    arguments = queue_arguments(
        name=name, quorum=quorum, delivery_limit=delivery_limit, message_ttl=message_ttl, max_length=max_length
    )
    own_connection = connection is None
    try:
        if connection is None:
            connection = registry.connect(broker)
        topology = _declare(connection, name=name, quorum=quorum, arguments=arguments)
    except AMQPConnectionError as error:
        raise TopologyError(
            f"Cannot reach broker {broker.name} ({broker.url}) to declare {name!r}: {error!r}"
        ) from error
    except CredentialsError as error:
        raise TopologyError(f"Cannot connect to broker {broker.name}: {error}") from error
    finally:
        if own_connection and connection is not None and connection.is_open:
            connection.close()
    _record(topology, broker=broker, actor=actor)
    return topology


def _declare(
    connection: pika.BlockingConnection, *, name: str, quorum: bool, arguments: dict[str, Any]
) -> QueueTopology:
    exchange, dead_letter_queue = dead_letter_names(name)
    dlq_arguments = dead_letter_queue_arguments(quorum=quorum, server_version=server_version(connection))
    channel = connection.channel()
    step = f"exchange {exchange!r}"
    try:
        channel.exchange_declare(exchange=exchange, exchange_type="fanout", durable=True)
        step = f"dead-letter queue {dead_letter_queue!r}"
        channel.queue_declare(queue=dead_letter_queue, durable=True, arguments=dlq_arguments or None)
        channel.queue_bind(queue=dead_letter_queue, exchange=exchange)
        step = f"queue {name!r}"
        channel.queue_declare(queue=name, durable=True, arguments=arguments)
    except ChannelClosedByBroker as error:
        raise TopologyError(_explain(step, error)) from error
    except AMQPChannelError as error:
        raise TopologyError(f"RabbitMQ closed the channel while declaring {step}: {error!r}") from error
    if channel.is_open:
        channel.close()
    return QueueTopology(
        name=name,
        dead_letter_exchange=exchange,
        dead_letter_queue=dead_letter_queue,
        kind=WatchedQueue.Kind.QUORUM if quorum else WatchedQueue.Kind.CLASSIC,
        arguments=arguments,
        dead_letter_queue_arguments=dlq_arguments,
    )


def server_version(connection: pika.BlockingConnection) -> tuple[int, ...]:
    """RabbitMQ's version from the connection handshake, e.g. (3, 10, 8); (0,) when it does not say."""
    # pika keeps the server properties on the underlying (non-blocking) connection object only.
    properties = getattr(getattr(connection, "_impl", None), "server_properties", None) or {}
    raw = properties.get("version", b"")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(character for character in piece if character.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or (0,)


def _explain(step: str, error: ChannelClosedByBroker) -> str:
    text = str(error.reply_text)
    if error.reply_code == 406 and "inequivalent arg" in text:
        return (
            f"The {step} already exists with different settings ({text}). RabbitMQ cannot change the arguments "
            "of an existing queue or exchange: run declare_topology with the arguments it was declared with, "
            "change limits through a RabbitMQ policy instead, or delete it (its messages are lost) and declare "
            "it again."
        )
    if error.reply_code == 406:
        return f"RabbitMQ refused the {step} ({text}). Check the options against the queue type and version."
    if error.reply_code == 403:
        return f"RabbitMQ refused the {step}: access refused ({text}). Check the user's configure permission."
    return f"RabbitMQ refused the {step}: {error.reply_code} {text}"


def _check_name(name: str) -> None:
    if not name or not name.strip() or name != name.strip():
        raise TopologyError(f"Queue name {name!r} must be non-empty and have no surrounding spaces.")
    if name.startswith("amq."):
        raise TopologyError(f"Queue name {name!r} is reserved: RabbitMQ keeps names starting with 'amq.'.")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise TopologyError(
            f"Queue name {name[:40]!r}... is too long: at most {MAX_NAME_BYTES} bytes, so that {name!r}.dlq fits."
        )


def _record(topology: QueueTopology, *, broker: Broker, actor: Any) -> None:
    with transaction.atomic():
        watched, created = WatchedQueue.objects.update_or_create(
            broker=broker,
            name=topology.name,
            defaults={
                "dead_letter_queue": topology.dead_letter_queue,
                "dead_letter_exchange": topology.dead_letter_exchange,
                "kind": topology.kind,
                "arguments": topology.arguments,
                "declared_at": timezone.now(),
            },
        )
        record_audit(
            actor=actor,
            action="declare_topology",
            target=watched.name if broker.is_default else f"{broker.name}/{watched.name}",
            detail=f"{'created' if created else 'declared again'}: {topology.kind}, {topology.arguments}",
        )
