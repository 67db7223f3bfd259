"""Every way RabbitMQ itself dead-letters a message, produced on the real broker and ingested.

The queues are declared through dlqconsole.ingest.topology, as production queues are.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from pika import BasicProperties
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.core import jsonsafe
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.demo import celery_app
from dlqconsole.ingest.demo.service import CeleryWorker
from dlqconsole.ingest.topology import declare_queue_topology
from tests.support import wait_for_depth

# consume_dlq runs in this process and manages its own transactions (commit, then ack), so the tests run
# outside a wrapping transaction.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def ingest_dlq(channel: BlockingChannel, dead_letter_queue: str, expected: int) -> list[DeadLetter]:
    """Wait for `expected` dead letters, drain the DLQ with the console's consume_dlq, return what it stored."""
    assert wait_for_depth(channel, dead_letter_queue, expected) == expected
    call_command("consume_dlq", queues=dead_letter_queue, exit_when_idle=0.5)
    assert channel.queue_declare(queue=dead_letter_queue, passive=True).method.message_count == 0
    return list(DeadLetter.objects.filter(source_queue=dead_letter_queue).order_by("id"))


@pytest.fixture
def shop_exchange(amqp_channel: BlockingChannel) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}.shop"
    amqp_channel.exchange_declare(exchange=name, exchange_type="topic", durable=True)
    yield name
    amqp_channel.exchange_delete(exchange=name)


def publish(channel: BlockingChannel, exchange: str, routing_key: str, body: bytes, **properties: object) -> None:
    channel.basic_publish(
        exchange=exchange, routing_key=routing_key, body=body, properties=BasicProperties(**properties)
    )


@pytest.mark.parametrize("refuse", ["reject", "nack"])
def test_rejected_message_is_ingested_with_its_origin_and_error(
    refuse: str, queue_name: Callable[[str], str], amqp_channel: BlockingChannel, shop_exchange: str
) -> None:
    orders = queue_name("orders")
    declare_queue_topology(name=orders)
    amqp_channel.queue_bind(queue=orders, exchange=shop_exchange, routing_key="orders.#")
    publish(
        amqp_channel,
        shop_exchange,
        "orders.created",
        b'{"order_id": 4711}',
        message_id="m-4711",
        correlation_id="c-1",
        priority=5,
        content_type="application/json",
        headers={
            "x-exception-type": "requests.exceptions.ReadTimeout",
            "x-exception-message": "Read timed out after 3000ms",
            "x-host": "orders-worker-1",
            "x-app-version": "3.14.2",
        },
    )
    wait_for_depth(amqp_channel, orders, 1)
    method, _, _ = amqp_channel.basic_get(orders)
    assert method is not None
    if refuse == "reject":
        amqp_channel.basic_reject(method.delivery_tag, requeue=False)
    else:
        amqp_channel.basic_nack(method.delivery_tag, requeue=False)

    [letter] = ingest_dlq(amqp_channel, f"{orders}.dlq", 1)

    assert letter.original_queue == orders
    assert letter.original_exchange == shop_exchange
    assert letter.original_routing_keys == ["orders.created"]
    assert letter.death_reason == "rejected"
    assert letter.failure_reason == "TIMEOUT"
    assert letter.error_type == "requests.exceptions.ReadTimeout"
    assert letter.attempt_count == 1
    assert (letter.message_id, letter.correlation_id, letter.priority) == ("m-4711", "c-1", 5)
    assert (letter.host, letter.app_version) == ("orders-worker-1", "3.14.2")
    assert bytes(letter.body) == b'{"order_id": 4711}'
    assert letter.parse_errors == []


def test_rejected_message_without_error_headers_falls_back_to_the_broker_reason(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel
) -> None:
    orders = queue_name("orders")
    declare_queue_topology(name=orders)
    publish(amqp_channel, "", orders, b"plain")
    wait_for_depth(amqp_channel, orders, 1)
    method, _, _ = amqp_channel.basic_get(orders)
    assert method is not None
    amqp_channel.basic_reject(method.delivery_tag, requeue=False)

    [letter] = ingest_dlq(amqp_channel, f"{orders}.dlq", 1)

    assert (letter.death_reason, letter.failure_reason) == ("rejected", "REJECTED")
    assert (letter.original_exchange, letter.original_routing_keys) == ("", [orders])


def test_message_expired_by_queue_ttl_is_ingested_as_expired(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel, shop_exchange: str
) -> None:
    emails = queue_name("emails")
    declare_queue_topology(name=emails, message_ttl=50)
    amqp_channel.queue_bind(queue=emails, exchange=shop_exchange, routing_key="emails.send")
    publish(amqp_channel, shop_exchange, "emails.send", b'{"to": "a@example.com"}', message_id="mail-1")

    [letter] = ingest_dlq(amqp_channel, f"{emails}.dlq", 1)

    assert (letter.original_queue, letter.original_exchange, letter.original_routing_keys) == (
        emails,
        shop_exchange,
        ["emails.send"],
    )
    assert (letter.death_reason, letter.failure_reason, letter.attempt_count) == ("expired", "EXPIRED", 1)
    assert letter.message_id == "mail-1"


def test_message_expired_by_its_own_expiration_keeps_the_original_expiration(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel
) -> None:
    emails = queue_name("emails")
    declare_queue_topology(name=emails)
    publish(amqp_channel, "", emails, b"login code 123456", expiration="30")

    [letter] = ingest_dlq(amqp_channel, f"{emails}.dlq", 1)

    assert (letter.death_reason, letter.failure_reason) == ("expired", "EXPIRED")
    assert letter.original_queue == emails
    assert jsonsafe.decode(letter.x_death)[0]["original-expiration"] == "30"
    # RabbitMQ removes the expiration property from a dead-lettered message, so it cannot expire again.
    assert "expiration" not in letter.properties


def test_max_length_overflow_dead_letters_the_oldest_messages(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel, shop_exchange: str
) -> None:
    inventory = queue_name("inventory")
    declare_queue_topology(name=inventory, max_length=2)
    amqp_channel.queue_bind(queue=inventory, exchange=shop_exchange, routing_key="inventory.#")
    amqp_channel.confirm_delivery()
    for n in range(5):
        publish(amqp_channel, shop_exchange, "inventory.adjust", f"adjust-{n}".encode(), message_id=f"adjust-{n}")

    letters = ingest_dlq(amqp_channel, f"{inventory}.dlq", 3)

    assert {letter.message_id for letter in letters} == {"adjust-0", "adjust-1", "adjust-2"}
    assert {(letter.death_reason, letter.failure_reason) for letter in letters} == {("maxlen", "MAXLEN")}
    assert {letter.original_exchange for letter in letters} == {shop_exchange}
    assert wait_for_depth(amqp_channel, inventory, 2) == 2


def deliver_and_return(channel: BlockingChannel, queue: str, times: int) -> list[object]:
    """Take the message and hand it back with requeue, as a crashing consumer does; returns x-delivery-count."""
    counts = []
    for _ in range(times):
        wait_for_depth(channel, queue, 1)
        method, properties, _ = channel.basic_get(queue)
        assert method is not None
        counts.append((properties.headers or {}).get("x-delivery-count"))
        channel.basic_nack(method.delivery_tag, requeue=True)
    return counts


def test_quorum_delivery_limit_dead_letters_with_reason_delivery_limit(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel, shop_exchange: str
) -> None:
    notifications = queue_name("notifications")
    declare_queue_topology(name=notifications, quorum=True, delivery_limit=2)
    amqp_channel.queue_bind(queue=notifications, exchange=shop_exchange, routing_key="notifications.#")
    publish(amqp_channel, shop_exchange, "notifications.push", b'{"user_id": 7}', message_id="push-7")

    # A limit of 2 allows two returns: the message is delivered three times, then dead-lettered.
    assert deliver_and_return(amqp_channel, notifications, 3) == [0, 1, 2]
    [letter] = ingest_dlq(amqp_channel, f"{notifications}.dlq", 1)

    assert (letter.death_reason, letter.failure_reason) == ("delivery_limit", "DELIVERY_LIMIT")
    assert (letter.original_queue, letter.original_exchange, letter.original_routing_keys) == (
        notifications,
        shop_exchange,
        ["notifications.push"],
    )
    assert letter.message_id == "push-7"
    assert wait_for_depth(amqp_channel, notifications, 0, timeout=0) == 0


def test_quorum_delivery_limit_attempt_count_is_the_number_of_deliveries(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel
) -> None:
    notifications = queue_name("notifications")
    declare_queue_topology(name=notifications, quorum=True, delivery_limit=2)
    publish(amqp_channel, "", notifications, b"x")
    deliver_and_return(amqp_channel, notifications, 3)

    [letter] = ingest_dlq(amqp_channel, f"{notifications}.dlq", 1)

    assert letter.attempt_count == 3


def test_message_that_dies_several_times_keeps_its_full_x_death_history(
    queue_name: Callable[[str], str], amqp_channel: BlockingChannel
) -> None:
    orders = queue_name("orders")
    delay = queue_name("delay")
    declare_queue_topology(name=orders)
    # A delay queue whose expired messages go on to `orders`, as retry-with-delay set-ups do.
    amqp_channel.queue_declare(
        queue=delay,
        durable=True,
        arguments={"x-message-ttl": 20, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": orders},
    )
    publish(amqp_channel, "", delay, b'{"order_id": 9}', message_id="order-9")

    def reject_next() -> None:
        wait_for_depth(amqp_channel, orders, 1)
        method, _, _ = amqp_channel.basic_get(orders)
        assert method is not None
        amqp_channel.basic_reject(method.delivery_tag, requeue=False)

    reject_next()
    [first] = ingest_dlq(amqp_channel, f"{orders}.dlq", 1)
    # Replayed as a shovel or the management UI's "move messages" would: headers kept, x-death included.
    publish(
        amqp_channel,
        "",
        orders,
        bytes(first.body),
        message_id=first.message_id,
        headers=jsonsafe.decode(first.headers),
    )
    reject_next()
    letters = ingest_dlq(amqp_channel, f"{orders}.dlq", 1)

    assert len(letters) == 2, "the second death is a new dead letter, not a duplicate of the first"
    second = letters[1]
    history = jsonsafe.decode(second.x_death)
    assert [(entry["queue"], entry["reason"], entry["count"]) for entry in history] == [
        (orders, "rejected", 2),
        (delay, "expired", 1),
    ]
    assert second.attempt_count == 3
    assert (second.original_queue, second.death_reason) == (orders, "rejected")
    assert second.first_failed_at is not None and second.last_failed_at is not None
    assert second.first_failed_at <= second.last_failed_at
    assert [(entry["queue"], entry["reason"]) for entry in jsonsafe.decode(first.x_death)] == [
        (orders, "rejected"),
        (delay, "expired"),
    ]
    assert first.attempt_count == 2
    # The broker's times, in order and close together (compared with each other, never with this process's clock).
    assert first.first_failed_at is not None
    assert dt.timedelta(0) <= second.last_failed_at - first.first_failed_at < dt.timedelta(minutes=5)


@pytest.fixture
def celery_tasks_queue(queue_name: Callable[[str], str], amqp_channel: BlockingChannel) -> Iterator[str]:
    name = queue_name("tasks")
    declare_queue_topology(name=name)
    celery_app.use_queue(name)
    yield name
    celery_app.app.close()
    # Celery's per-queue direct exchange; the queue_name fixture removes the queues and the DLX.
    amqp_channel.exchange_delete(exchange=name)


def test_celery_task_failing_with_late_acks_is_dead_lettered_and_ingested_with_its_task(
    celery_tasks_queue: str, amqp_channel: BlockingChannel, tmp_path: Path
) -> None:
    def send(task_name: str, **kwargs: object) -> str:
        return str(celery_app.send(task_name, queue=celery_tasks_queue, kwargs=kwargs).id)

    succeeded = send("shop.invoices.generate_invoice", order_id=1, amount="10.00", currency="EUR")
    raised = send("shop.invoices.generate_invoice", order_id=2, amount="10.00", currency="XTS")
    retried = send("shop.crm.sync_contact", contact_id=3, email="a@example.com", region="ap-south-1")
    rejected = send("shop.mail.send_receipt", order_id=4, email="nobody")
    worker = CeleryWorker(queue=celery_tasks_queue, log_file=tmp_path / "worker.log")
    worker.start()
    try:
        letters = ingest_dlq(amqp_channel, f"{celery_tasks_queue}.dlq", 3)
    finally:
        worker.stop()

    by_task_id = {letter.task_id: letter for letter in letters}
    assert set(by_task_id) == {raised, retried, rejected}
    assert succeeded not in by_task_id
    # acks_late + task_acks_on_failure=False: the worker rejects a task that raised, without requeue.
    assert by_task_id[raised].task_name == "shop.invoices.generate_invoice"
    # A task that retried twice (each retry is a new message) dies with retries=2: three attempts in all.
    assert (by_task_id[retried].task_name, by_task_id[retried].task_retries) == ("shop.crm.sync_contact", 2)
    assert by_task_id[retried].attempt_count == 3
    # celery.exceptions.Reject(requeue=False) dead-letters as well.
    assert by_task_id[rejected].task_name == "shop.mail.send_receipt"
    for letter in letters:
        assert (letter.original_queue, letter.death_reason) == (celery_tasks_queue, "rejected")
        assert letter.original_routing_keys == [celery_tasks_queue]
        assert letter.content_type == "application/json"
    assert wait_for_depth(amqp_channel, celery_tasks_queue, 0, timeout=0) == 0
