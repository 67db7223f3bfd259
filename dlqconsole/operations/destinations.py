"""Where a dead letter goes when it is replayed or moved (a broker, and an exchange and routing key on it), what it
carries, and whether the broker can take it."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pika
from django.conf import settings
from pika.exceptions import ChannelClosedByBroker

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.core import jsonsafe, replay_guard
from dlqconsole.core.amqp import PROPERTY_NAMES, connect, is_death_header
from dlqconsole.core.ratelimit import exchange_key, scoped_key


def on_broker(name: str, text: str) -> str:
    """`text` (a queue, a destination) as pages show it: "staging · orders.dlq" on a broker other than default,
    unchanged on default, so a console with one broker reads as it always did."""
    return text if name == DEFAULT else f"{name} · {text}"


@dataclass(frozen=True)
class Destination:
    exchange: str
    routing_key: str
    # The queue expected to receive the message ("" when only the exchange knows): checked before publishing,
    # and the key of the shared rate limit.
    queue: str = ""
    # The name of the broker it is published to.
    broker: str = DEFAULT

    def __str__(self) -> str:
        if not self.exchange:
            return on_broker(self.broker, f"queue {self.routing_key}")
        return on_broker(self.broker, f"exchange {self.exchange} / {self.routing_key}")

    @property
    def limit_key(self) -> str:
        """The shared rate limit's bucket: the destination queue (else the exchange and key) on its broker."""
        key = f"queue:{self.queue}" if self.queue else exchange_key(self.exchange, self.routing_key)
        return scoped_key(key, broker="" if self.broker == DEFAULT else self.broker)

    @property
    def on_exchange(self) -> Destination:
        """The exchange and key alone (for the checks that only the exchange can fail)."""
        return Destination(exchange=self.exchange, routing_key=self.routing_key, broker=self.broker)


def retry_destination(
    *, exchange: str, routing_keys: list[Any], queue: str, broker: str = DEFAULT
) -> Destination | None:
    """The exchange and routing key of the newest x-death entry, else the original queue through the default
    exchange, on the broker the dead letter came from; None when the dead letter names neither."""
    keys = [str(key) for key in routing_keys or [] if key is not None]
    if keys:
        return Destination(
            exchange=exchange, routing_key=keys[0], queue=queue or (keys[0] if not exchange else ""), broker=broker
        )
    if queue:
        return Destination(exchange="", routing_key=queue, queue=queue, broker=broker)
    return None


def refused_destination(destination: Destination, *, shared_vhost: bool) -> str:
    """Why no replay or move may go to `destination` ("" when it may): the console's own Celery queues, and on a
    broker that is the console's Celery vhost (`shared_vhost`) Celery's control channels."""
    refused = replay_guard.refusal(
        destination.exchange, destination.routing_key, queue=destination.queue, shared_vhost=shared_vhost
    )
    return f"refused: {refused}" if refused else ""


def move_destination(
    *, target_queue: str, target_exchange: str, target_routing_key: str, broker: str = DEFAULT
) -> Destination:
    if target_queue:
        return Destination(exchange="", routing_key=target_queue, queue=target_queue, broker=broker)
    return Destination(exchange=target_exchange, routing_key=target_routing_key, broker=broker)


class KnownBrokers:
    """The brokers a plan or a run meets, read from the table once and again only for one it does not know yet
    (added meanwhile). Safe to share between a run's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, Broker] = {}
        self._shared: dict[int, bool] = {}

    def _load(self) -> None:
        self._by_id = {broker.pk: broker for broker in registry.brokers(enabled=False)}

    def load(self) -> None:
        """Read the brokers now (a run does, on its main thread, before its database lanes ask)."""
        with self._lock:
            self._load()

    def get(self, broker_id: int) -> Broker:
        with self._lock:
            if broker_id not in self._by_id:
                self._load()
            return self._by_id[broker_id]

    def named(self, name: str) -> Broker:
        with self._lock:
            found = next((broker for broker in self._by_id.values() if broker.name == name), None)
            if found is None:
                self._load()
                found = next((broker for broker in self._by_id.values() if broker.name == name), None)
        if found is None:
            raise registry.UnknownBroker(f"no broker named {name[:64]!r}")
        return found

    def name(self, broker_id: int) -> str:
        return self.get(broker_id).name

    def shares_celery_vhost(self, broker: Broker) -> bool:
        """Whether the broker's vhost is the console's Celery vhost (replay_guard), judged by its own URL."""
        with self._lock:
            if broker.pk not in self._shared:
                self._shared[broker.pk] = registry.shares_celery_vhost(broker)
            return self._shared[broker.pk]

    def problem(self, name: str) -> str:
        """Why nothing may be published to the broker named `name` ("" when it may): it is disabled or gone."""
        try:
            broker = self.named(name)
        except registry.UnknownBroker:
            return f"broker {name!r} no longer exists"
        return "" if broker.enabled else f"broker {name!r} is disabled: nothing is replayed to it"

    def refusal(self, destination: Destination) -> str:
        """refused_destination, judged for the destination's own broker."""
        return refused_destination(destination, shared_vhost=self.shares_celery_vhost(self.named(destination.broker)))

    def unpublishable(self, destination: Destination) -> str:
        """Why nothing may be published to `destination` whatever the broker says ("" when it may): its broker
        is disabled or gone, or the destination is refused there."""
        return self.problem(destination.broker) or self.refusal(destination)

    def header_refusal(self, destination: Destination, headers: Any) -> str:
        """Why a message's CC or BCC header keeps it from `destination` on its broker ("" when it does not)."""
        try:
            shared = self.shares_celery_vhost(self.named(destination.broker))
        except registry.UnknownBroker:
            return ""
        refused = replay_guard.header_refusal(destination.exchange, headers, shared_vhost=shared)
        return f"refused: {refused}" if refused else ""


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
    broker: Broker | None = None,
    url: str | None = None,
    queue_state: dict[str, tuple[int, int]] | None = None,
) -> dict[Destination, str]:
    """Why each destination cannot take messages ("" when it can), by passive declares of its exchange and queue on
    `broker` (else on `url`, else AMQP_URL): the destinations of one broker at a time. When `queue_state` is given,
    it receives each existing destination queue's (ready messages, consumers).

    A binding cannot be checked over AMQP; an unroutable message is caught at publish time (mandatory=True).
    """
    problems: dict[Destination, str] = {}
    exchanges: dict[str, str] = {}
    queues: dict[str, str] = {}
    connection = registry.connect(broker) if broker is not None else connect(url)
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
