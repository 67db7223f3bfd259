"""Where a dead letter goes when it is replayed or moved, what it carries, and whether the broker can take it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pika
from django.conf import settings
from pika.exceptions import ChannelClosedByBroker

from dlqconsole.core import jsonsafe, replay_guard
from dlqconsole.core.amqp import PROPERTY_NAMES, connect, is_death_header


@dataclass(frozen=True)
class Destination:
    exchange: str
    routing_key: str
    # The queue expected to receive the message ("" when only the exchange knows): checked before publishing,
    # and the key of the shared rate limit.
    queue: str = ""

    def __str__(self) -> str:
        if not self.exchange:
            return f"queue {self.routing_key}"
        return f"exchange {self.exchange} / {self.routing_key}"

    @property
    def limit_key(self) -> str:
        return f"queue:{self.queue}" if self.queue else f"exchange:{self.exchange}/{self.routing_key}"


def retry_destination(*, exchange: str, routing_keys: list[Any], queue: str) -> Destination | None:
    """The exchange and routing key of the newest x-death entry, else the original queue through the default
    exchange; None when the dead letter names neither."""
    keys = [str(key) for key in routing_keys or [] if key is not None]
    if keys:
        return Destination(exchange=exchange, routing_key=keys[0], queue=queue or (keys[0] if not exchange else ""))
    if queue:
        return Destination(exchange="", routing_key=queue, queue=queue)
    return None


def refused_destination(destination: Destination) -> str:
    """Why no replay or move may go to `destination` ("" when it may): the console's own Celery queues."""
    refused = replay_guard.refusal(destination.exchange, destination.routing_key, queue=destination.queue)
    return f"refused: {refused}" if refused else ""


def move_destination(*, target_queue: str, target_exchange: str, target_routing_key: str) -> Destination:
    if target_queue:
        return Destination(exchange="", routing_key=target_queue, queue=target_queue)
    return Destination(exchange=target_exchange, routing_key=target_routing_key)


def replay_properties(
    *, stored_properties: dict[str, Any], stored_headers: Any, dead_letter_id: int, replay_count: int
) -> pika.BasicProperties:
    """The message's own properties and headers, unchanged, minus the death headers, plus our replay headers."""
    properties = jsonsafe.decode(stored_properties or {})
    values = {name: properties[name] for name in PROPERTY_NAMES if properties.get(name) is not None}
    # Death headers go before decoding: x-death is most of a dead letter's headers and all of it is dropped.
    stored = stored_headers if isinstance(stored_headers, dict) else {}
    if len(stored) == 1 and next(iter(stored)) in jsonsafe.TAGS:
        stored = jsonsafe.decode(stored)  # a tagged table ($map): decode it whole
        stored = stored if isinstance(stored, dict) else {}
    headers = {
        key: jsonsafe.decode(value) if isinstance(value, dict | list) else value
        for key, value in stored.items()
        if not is_death_header(str(key))
    }

    headers[settings.DLQ_REPLAY_COUNT_HEADER] = replay_count
    headers[settings.DLQ_REPLAYED_FROM_HEADER] = dead_letter_id
    return pika.BasicProperties(headers=headers, **values)


def check_destinations(
    destinations: Iterable[Destination],
    *,
    url: str | None = None,
    queue_state: dict[str, tuple[int, int]] | None = None,
) -> dict[Destination, str]:
    """Why each destination cannot take messages ("" when it can), by passive declares of its exchange and queue.
    When `queue_state` is given, it receives each existing destination queue's (ready messages, consumers).

    A binding cannot be checked over AMQP; an unroutable message is caught at publish time (mandatory=True).
    """
    problems: dict[Destination, str] = {}
    exchanges: dict[str, str] = {}
    queues: dict[str, str] = {}
    connection = connect(url)
    try:
        channel = connection.channel()
        for destination in destinations:
            problem = ""
            if destination.exchange:
                if destination.exchange not in exchanges:
                    exchanges[destination.exchange], channel = _passive(
                        connection, channel, exchange=destination.exchange
                    )
                problem = exchanges[destination.exchange]
            if not problem and destination.queue:
                if destination.queue not in queues:
                    queues[destination.queue], channel = _passive(
                        connection, channel, queue=destination.queue, state=queue_state
                    )
                problem = queues[destination.queue]
            problems[destination] = problem
    finally:
        if connection.is_open:
            connection.close()
    return problems


def _passive(
    connection: pika.BlockingConnection,
    channel: Any,
    *,
    exchange: str = "",
    queue: str = "",
    state: dict[str, tuple[int, int]] | None = None,
) -> tuple[str, Any]:
    try:
        if exchange:
            channel.exchange_declare(exchange=exchange, passive=True)
        else:
            declared = channel.queue_declare(queue=queue, passive=True)
            if state is not None:
                state[queue] = (declared.method.message_count, declared.method.consumer_count)
    except ChannelClosedByBroker as error:
        # A failed passive declare closes the channel; open a fresh one for the next check.
        what = f"exchange {exchange!r}" if exchange else f"queue {queue!r}"
        reason = f"{what} does not exist" if error.reply_code == 404 else f"{what}: {error.reply_text}"
        return reason, connection.channel()
    return "", channel
