from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command
from pika.adapters.blocking_connection import BlockingChannel as Channel
from pika.exceptions import ChannelClosedByBroker

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.ingest.models import WatchedQueue
from dlqconsole.ingest.topology import TopologyError, declare_queue_topology, queue_arguments
from tests.support import wait_for_depth

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_declare_topology_dead_letters_rejected_messages_into_the_dlq(
    queue_name: Callable[[str], str], amqp_channel: Channel
) -> None:
    orders = queue_name("orders")

    call_command("declare_topology", orders)

    amqp_channel.basic_publish(exchange="", routing_key=orders, body=b'{"order_id": 1}')
    method, _, _ = amqp_channel.basic_get(orders)
    assert method is not None
    amqp_channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_for_depth(amqp_channel, f"{orders}.dlq", 1) == 1
    _, properties, body = amqp_channel.basic_get(f"{orders}.dlq", auto_ack=True)
    assert body == b'{"order_id": 1}'
    assert properties.headers["x-death"][0]["queue"] == orders
    watched = WatchedQueue.objects.get(name=orders)
    assert (watched.dead_letter_queue, watched.dead_letter_exchange, watched.kind) == (
        f"{orders}.dlq",
        f"{orders}.dlx",
        "classic",
    )
    assert watched.arguments == {"x-dead-letter-exchange": f"{orders}.dlx"}


def test_dead_letter_exchange_is_a_fanout_so_any_routing_key_reaches_the_dlq(
    queue_name: Callable[[str], str], amqp_channel: Channel
) -> None:
    orders = queue_name("orders")
    declare_queue_topology(name=orders)

    # Dead letters keep their original routing key; a key nobody bound must still reach the DLQ.
    amqp_channel.basic_publish(exchange=f"{orders}.dlx", routing_key="orders.eu.refund.v2", body=b"x")

    assert wait_for_depth(amqp_channel, f"{orders}.dlq", 1) == 1


def test_declare_topology_twice_is_a_no_op(queue_name: Callable[[str], str], amqp_channel: Channel) -> None:
    orders = queue_name("orders")
    call_command("declare_topology", orders, "--message-ttl", "60000", "--max-length", "100")
    amqp_channel.basic_publish(exchange="", routing_key=orders, body=b"kept")

    call_command("declare_topology", orders, "--message-ttl", "60000", "--max-length", "100")

    assert wait_for_depth(amqp_channel, orders, 1) == 1
    assert WatchedQueue.objects.filter(name=orders).count() == 1
    assert WatchedQueue.objects.get(name=orders).arguments == {
        "x-dead-letter-exchange": f"{orders}.dlx",
        "x-message-ttl": 60000,
        "x-max-length": 100,
        "x-overflow": "drop-head",
    }
    assert AuditEntry.objects.filter(action="declare_topology", target=orders).count() == 2


def test_declaring_again_with_other_arguments_explains_precondition_failed(
    queue_name: Callable[[str], str], amqp_channel: Channel
) -> None:
    orders = queue_name("orders")
    call_command("declare_topology", orders, "--message-ttl", "1000")

    with pytest.raises(CommandError) as raised:
        call_command("declare_topology", orders, "--message-ttl", "2000")

    message = str(raised.value)
    assert f"queue '{orders}' already exists with different settings" in message
    assert "inequivalent arg 'x-message-ttl'" in message
    assert "policy" in message
    assert WatchedQueue.objects.get(name=orders).arguments["x-message-ttl"] == 1000


def test_switching_an_existing_queue_to_quorum_is_refused_with_an_explanation(
    queue_name: Callable[[str], str],
) -> None:
    orders = queue_name("orders")
    declare_queue_topology(name=orders)

    with pytest.raises(TopologyError, match="x-queue-type"):
        declare_queue_topology(name=orders, quorum=True)


def test_delivery_limit_needs_a_quorum_queue(queue_name: Callable[[str], str], amqp_channel: Channel) -> None:
    orders = queue_name("orders")

    with pytest.raises(CommandError, match="--delivery-limit needs --quorum"):
        call_command("declare_topology", orders, "--delivery-limit", "5")

    with pytest.raises(ChannelClosedByBroker):
        amqp_channel.queue_declare(queue=orders, passive=True)
    assert not WatchedQueue.objects.filter(name=orders).exists()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"name": "amq.orders"}, "reserved"),
        ({"name": "x" * 252}, "too long"),
        ({"name": " orders"}, "surrounding spaces"),
        ({"name": "orders", "message_ttl": -1}, "--message-ttl must be"),
        ({"name": "orders", "max_length": 0}, "--max-length must be"),
        ({"name": "orders", "quorum": True, "delivery_limit": -1}, "--delivery-limit must be"),
    ],
)
def test_invalid_topology_options_are_refused_before_touching_the_broker(
    options: dict[str, object], error: str
) -> None:
    with pytest.raises(TopologyError, match=error):
        queue_arguments(**options)  # type: ignore[arg-type]


def test_quorum_topology_has_a_quorum_dlq_with_at_least_once_dead_lettering(
    queue_name: Callable[[str], str], amqp_channel: Channel
) -> None:
    notifications = queue_name("notifications")

    call_command("declare_topology", notifications, "--quorum", "--delivery-limit", "3")

    watched = WatchedQueue.objects.get(name=notifications)
    assert watched.kind == "quorum"
    assert watched.arguments == {
        "x-dead-letter-exchange": f"{notifications}.dlx",
        "x-queue-type": "quorum",
        "x-delivery-limit": 3,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    # Only quorum queues count deliveries: a message returned to the DLQ comes back with x-delivery-count.
    amqp_channel.basic_publish(exchange=f"{notifications}.dlx", routing_key="", body=b"x")
    wait_for_depth(amqp_channel, f"{notifications}.dlq", 1)
    method, _, _ = amqp_channel.basic_get(f"{notifications}.dlq")
    assert method is not None
    amqp_channel.basic_nack(method.delivery_tag, requeue=True)
    wait_for_depth(amqp_channel, f"{notifications}.dlq", 1)
    _, properties, _ = amqp_channel.basic_get(f"{notifications}.dlq", auto_ack=True)
    assert properties.headers["x-delivery-count"] == 1


def test_quorum_queue_with_max_length_overflows_into_the_dlq(
    queue_name: Callable[[str], str], amqp_channel: Channel
) -> None:
    inventory = queue_name("inventory")
    topology = declare_queue_topology(name=inventory, quorum=True, max_length=1)

    assert topology.arguments["x-overflow"] == "drop-head"
    assert "x-dead-letter-strategy" not in topology.arguments
    for n in range(3):
        amqp_channel.basic_publish(exchange="", routing_key=inventory, body=str(n).encode())
    assert wait_for_depth(amqp_channel, f"{inventory}.dlq", 2) == 2
