"""The confirmed publisher the operations use (dlqconsole/core/publish.py), on the real broker."""

from __future__ import annotations

import time

import pika

from dlqconsole.core.amqp import connection_parameters
from dlqconsole.core.publish import (
    CONFIRMED,
    NOT_SENT,
    RETURNED,
    UNCONFIRMED,
    UNSENDABLE,
    ConfirmedPublisher,
    Message,
)
from tests.support import wait_for_depth


def messages(queue: str, count: int, *, start: int = 0) -> list[Message]:
    return [
        Message(
            key=n,
            exchange="",
            routing_key=queue,
            body=f"m{n}".encode(),
            properties=pika.BasicProperties(headers={"key": n}),
        )
        for n in range(start, start + count)
    ]


def test_every_message_gets_one_outcome_confirmed_or_returned(channel, queue_name):
    queue = queue_name("out")
    channel.queue_declare(queue=queue)
    batch = messages(queue, 50) + messages(queue_name("missing"), 5, start=50)

    with ConfirmedPublisher(connection_parameters(), key_header="key", window=8) as publisher:
        outcomes = publisher.publish(batch)

    assert sorted(int(str(outcome.key)) for outcome in outcomes) == list(range(55))
    statuses = {outcome.key: outcome.status for outcome in outcomes}
    assert [statuses[n] for n in range(50)] == [CONFIRMED] * 50
    assert [statuses[n] for n in range(50, 55)] == [RETURNED] * 5
    assert all("NO_ROUTE" in outcome.error for outcome in outcomes if outcome.status == RETURNED)
    assert wait_for_depth(channel, queue, 50) == 50


def test_a_lost_connection_leaves_every_message_accounted_for(channel, queue_name):
    queue = queue_name("out")
    channel.queue_declare(queue=queue)
    publisher = ConfirmedPublisher(connection_parameters(), key_header="key", window=10)
    publisher.open()
    sent = 0

    def delay_for(message: Message) -> float:
        nonlocal sent
        sent += 1
        if sent == 25:
            publisher._connection.close()  # type: ignore[union-attr]  # the broker going away mid-batch
        return 0.0

    connection = publisher._connection
    assert connection is not None
    outcomes = publisher.publish(messages(queue, 100), delay_for=delay_for)
    # The close begun mid-batch completes: its Close frame was not left among the frames held for one write.
    deadline = time.monotonic() + 5
    while not connection.is_closed and time.monotonic() < deadline:
        connection.ioloop.call_later(0.1, connection.ioloop.stop)
        connection.ioloop.start()
    assert connection.is_closed

    assert sorted(int(str(outcome.key)) for outcome in outcomes) == list(range(100))
    by_status: dict[str, int] = {}
    for outcome in outcomes:
        by_status[outcome.status] = by_status.get(outcome.status, 0) + 1
    assert set(by_status) <= {CONFIRMED, UNCONFIRMED, NOT_SENT}
    assert by_status.get(NOT_SENT, 0) >= 75  # nothing went out after the connection closed
    assert not publisher.is_open
    # What the broker took is at least what was confirmed: unconfirmed ones may or may not have arrived.
    assert wait_for_depth(channel, queue, by_status.get(CONFIRMED, 0)) >= by_status.get(CONFIRMED, 0)


def test_halting_from_the_tick_stops_sending_and_keeps_the_rest(channel, queue_name):
    queue = queue_name("out")
    channel.queue_declare(queue=queue)

    with ConfirmedPublisher(connection_parameters(), key_header="key") as publisher:
        outcomes = publisher.publish(
            messages(queue, 20), delay_for=lambda message: 0.05, on_tick=lambda: False, tick_seconds=0.01
        )

    assert len(outcomes) == 20
    assert {outcome.status for outcome in outcomes} == {NOT_SENT}
    assert wait_for_depth(channel, queue, 1, timeout=0.3) == 0


def test_a_batch_goes_to_the_socket_in_few_writes_and_arrives_intact(channel, queue_name):
    queue = queue_name("out")
    channel.queue_declare(queue=queue)
    batch = messages(queue, 400)
    with ConfirmedPublisher(connection_parameters(), key_header="key", window=1000) as publisher:
        connection = publisher._connection
        assert connection is not None
        transport = connection._transport  # type: ignore[attr-defined]
        writes: list[int] = []
        write = transport.write

        def counting_write(data: bytes) -> None:
            writes.append(len(data))
            write(data)

        transport.write = counting_write
        outcomes = publisher.publish(batch)

    assert [outcome.status for outcome in outcomes] == [CONFIRMED] * 400
    # Three frames a message (method, header, body), joined a hundred messages at a time, not one write each.
    assert len(writes) <= 10, writes
    received = []
    for _ in range(400):
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        received.append((body, properties.headers))
    assert received == [(f"m{n}".encode(), {"key": n}) for n in range(400)]


def test_a_message_amqp_cannot_encode_is_unsendable_and_the_rest_go_out(channel, queue_name):
    """pika encodes every frame before writing any: a header it cannot encode costs that message, not the channel."""
    queue = queue_name("out")
    channel.queue_declare(queue=queue)
    batch = messages(queue, 10)
    batch[3].properties = pika.BasicProperties(headers={"key": 3, "n": 2**70})
    batch[6].properties = pika.BasicProperties(headers={"key": 6, "n": float("inf")})
    batch[8].routing_key = "r" * 300

    with ConfirmedPublisher(connection_parameters(), key_header="key", window=4) as publisher:
        outcomes = {outcome.key: outcome for outcome in publisher.publish(batch)}
        assert publisher.is_open
        (after,) = publisher.publish(messages(queue, 1, start=10))

    assert {key for key, outcome in outcomes.items() if outcome.status == UNSENDABLE} == {3, 6, 8}
    assert outcomes[3].error == "cannot be sent over AMQP: a number does not fit its AMQP field " + (
        "('q' format requires -9223372036854775808 <= number <= 9223372036854775807)"
    )
    assert outcomes[6].error == "cannot be sent over AMQP: a header value of type float (inf) has no AMQP encoding"
    assert outcomes[8].error == "cannot be sent over AMQP: a header name or routing key is longer than 255 bytes"
    assert [outcomes[n].status for n in (0, 1, 2, 4, 5, 7, 9)] == [CONFIRMED] * 7
    assert after.status == CONFIRMED
    assert wait_for_depth(channel, queue, 8) == 8
