"""Nothing is lost: rejected and expired dead letters, every hostile body, and two messages identical in every byte,
all in one DLQ, are all stored by a real consume_dlq process, and nothing is left in the queue."""

from __future__ import annotations

from typing import Any

import pika
import psycopg
import pytest

from tests.hostile import HOSTILE_BODIES
from tests.support import DeadLetterQueue, subprocess_database_url, wait_for_depth

REJECTED = 300
EXPIRED = 50


@pytest.mark.django_db(transaction=True)
def test_rejected_expired_hostile_and_identical_dead_letters_are_all_stored(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, consume_dlq: Any
) -> None:
    channel = amqp_channel
    for index in range(REJECTED):
        channel.basic_publish(
            exchange="",
            routing_key=dead_letter_queue.work,
            body=f'{{"order": {index}}}'.encode(),
            properties=pika.BasicProperties(message_id=f"rejected-{index}", content_type="application/json"),
        )
    for _ in range(REJECTED):
        method, _, _ = channel.basic_get(queue=dead_letter_queue.work)
        assert method is not None
        channel.basic_reject(delivery_tag=method.delivery_tag, requeue=False)
    for index in range(EXPIRED):
        channel.basic_publish(
            exchange="",
            routing_key=dead_letter_queue.work,
            body=f'{{"order": {index}}}'.encode(),
            properties=pika.BasicProperties(message_id=f"expired-{index}", expiration="0"),
        )
    for hostile in HOSTILE_BODIES:
        channel.basic_publish(
            exchange="",
            routing_key=dead_letter_queue.dlq,
            body=hostile.body,
            properties=pika.BasicProperties(
                content_type=hostile.content_type,
                content_encoding=hostile.content_encoding or None,
                headers={"hostile": hostile.name},
            ),
        )
    for _ in range(2):  # identical in every byte: no message id, no timestamp
        channel.basic_publish(exchange="", routing_key=dead_letter_queue.dlq, body=b"same")
    total = REJECTED + EXPIRED + len(HOSTILE_BODIES) + 2
    assert total == 372
    assert wait_for_depth(channel, dead_letter_queue.dlq, total, timeout=60) == total

    consumer = consume_dlq("--queues", dead_letter_queue.dlq, "--exit-when-idle", "3")
    assert consumer.wait(timeout=300) == 0, consumer.output[-3000:]

    with psycopg.connect(subprocess_database_url()) as database:
        reasons: dict[str, int] = dict(
            database.execute(
                "SELECT death_reason, count(*) FROM deadletters_deadletter WHERE source_queue = %s GROUP BY 1",
                [dead_letter_queue.dlq],
            ).fetchall()
        )
        identical = database.execute(
            "SELECT count(*) FROM deadletters_deadletter WHERE source_queue = %s AND identical_to_id IS NOT NULL",
            [dead_letter_queue.dlq],
        ).fetchone()
    assert sum(reasons.values()) == total, consumer.output[-3000:]
    assert (reasons["rejected"], reasons["expired"]) == (REJECTED, EXPIRED)
    assert identical == (1,)
    assert f"{total} received, {total} new, 0 duplicates" in consumer.output
    assert wait_for_depth(channel, dead_letter_queue.dlq, 0, timeout=0) == 0
