"""A consumer process holds at most DLQ_CONSUMER_MAX_BYTES of message bodies, whatever the messages' size.

Each DLQ's channel may have a thousand deliveries in flight, and a DLQ can hold messages of any size. Past the
budget the consumer stops reading until a batch is written; a batch is written at DLQ_CONSUMER_BATCH_BYTES. Here a
database that is slow to take the writes (its table locked for a while by another session) makes the deliveries
pile up, as a slow database does in production.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pika
import psycopg
import pytest
import requests
from django.db import connection

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.consumer import DeadLetterConsumer
from tests.support import DeadLetterQueue, subprocess_database_url, wait_for_depth

MB = 1024 * 1024


def record_peak(consumer: DeadLetterConsumer) -> list[int]:
    """The bytes held after each delivery the consumer takes."""
    held: list[int] = []
    take = consumer.on_message

    def on_message(*arguments: Any) -> None:
        take(*arguments)
        held.append(consumer.held_bytes)

    consumer.on_message = on_message  # type: ignore[method-assign,assignment]
    return held


@pytest.mark.django_db(transaction=True)
def test_a_consumer_stops_reading_at_its_byte_budget_and_loses_nothing(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, make_consumer: Any, caplog: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the table lock stands for a slow PostgreSQL")
    for index in range(40):
        amqp_channel.basic_publish(
            exchange="",
            routing_key=dead_letter_queue.dlq,
            body=bytes([index]) * MB,
            properties=pika.BasicProperties(message_id=f"big-{index}"),
        )
    assert wait_for_depth(amqp_channel, dead_letter_queue.dlq, 40) == 40
    consumer = make_consumer(
        queues=[dead_letter_queue.dlq], max_bytes=6 * MB, batch_bytes=2 * MB, prefetch=1000, exit_when_idle=2.0
    )
    held = record_peak(consumer)

    # Another session holds the table for three seconds: the first batch waits, the deliveries pile up.
    blocker = psycopg.connect(subprocess_database_url())
    blocker.execute("LOCK TABLE deadletters_deadletter IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(3.0, blocker.commit)
    release.start()
    try:
        with caplog.at_level("INFO", logger="dlqconsole.ingest.consumer"):
            deadline = time.monotonic() + 120
            while DeadLetter.objects.count() < 40 and time.monotonic() < deadline:
                consumer.step()
    finally:
        release.join()
        blocker.close()

    # One delivery past the budget at most (the one that crossed it), plus what one read of the socket completes.
    assert max(held) <= 6 * MB + MB + 100 * 1024, max(held)
    assert max(held) >= 6 * MB  # the budget was reached: reading really paused
    assert "over DLQ_CONSUMER_MAX_BYTES" in caplog.text
    assert DeadLetter.objects.count() == 40
    assert {bytes(body)[:1] for body in DeadLetter.objects.values_list("body", flat=True)} == {
        bytes([index]) for index in range(40)
    }
    consumer.shutdown()
    assert wait_for_depth(amqp_channel, dead_letter_queue.dlq, 0, timeout=0) == 0


def test_a_batch_is_cut_at_its_byte_size(make_consumer: Any, settings: Any) -> None:
    consumer = make_consumer(queues=["unused"], batch_size=500, batch_bytes=3 * MB, pipeline=False)
    for size in (MB, MB, MB, MB, 10 * MB, 1):
        consumer.on_message("q", None, pika.spec.Basic.Deliver(delivery_tag=1), pika.BasicProperties(), b"x" * size)

    batches = []
    while consumer.buffer:
        batches.append([len(delivery.body) for delivery in consumer.take_batch()])

    # At most the byte size, but never empty: a message larger than it goes alone.
    assert batches == [[MB, MB, MB], [MB], [10 * MB], [1]]
    assert consumer.buffer_bytes == 0


def broker_prefetch(consumer: DeadLetterConsumer, queue: str, expected: int) -> list[int]:
    """The prefetch of every consumer of `queue`, as RabbitMQ's management API reports it. Its figures are
    refreshed every few seconds: asked until they show `expected` (the consumer's connection kept alive meanwhile)
    or 20 s have passed."""
    deadline = time.monotonic() + 20
    while True:
        consumers = requests.get("http://127.0.0.1:15672/api/consumers/%2F", auth=("guest", "guest"), timeout=10)
        found = [entry["prefetch_count"] for entry in consumers.json() if entry["queue"]["name"] == queue]
        if found == [expected] or time.monotonic() > deadline:
            return found
        consumer.sleep(0.5)


@pytest.mark.django_db(transaction=True)
def test_a_queues_prefetch_follows_the_size_of_its_bodies(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, make_consumer: Any, settings: Any
) -> None:
    """Large bodies shrink the queue's prefetch to its share of the budget, so that the broker holds back what a
    paused consumer cannot take (and other consumers can have it); small ones let it grow back."""
    consumer = make_consumer(
        queues=[dead_letter_queue.dlq], max_bytes=8 * MB, batch_bytes=2 * MB, prefetch=1000, exit_when_idle=2.0
    )

    def publish(count: int, size: int, tag: str) -> None:
        for index in range(count):
            amqp_channel.basic_publish(
                exchange="",
                routing_key=dead_letter_queue.dlq,
                body=b"x" * size,
                properties=pika.BasicProperties(message_id=f"{tag}-{index}"),
            )

    def drain(total: int) -> None:
        deadline = time.monotonic() + 120
        while DeadLetter.objects.count() < total and time.monotonic() < deadline:
            consumer.step()
        assert DeadLetter.objects.count() == total

    consumer.step()
    # Before any delivery it assumes 1 MB bodies: 8 of them.
    assert consumer.prefetch_of[dead_letter_queue.dlq] == 8
    publish(20, 2 * MB, "large")
    drain(20)
    assert consumer.prefetch_of[dead_letter_queue.dlq] == 4
    assert broker_prefetch(consumer, dead_letter_queue.dlq, 4) == [4]

    # Small bodies since: the largest seen fades batch by batch, and the prefetch grows (once per 5 s at most).
    published = 20
    deadline = time.monotonic() + 90
    while consumer.prefetch_of[dead_letter_queue.dlq] < 1000 and time.monotonic() < deadline:
        publish(50, 1024, f"small-{published}")
        published += 50
        drain(published)
        time.sleep(0.5)
    assert consumer.prefetch_of[dead_letter_queue.dlq] == 1000
    assert broker_prefetch(consumer, dead_letter_queue.dlq, 1000) == [1000]
