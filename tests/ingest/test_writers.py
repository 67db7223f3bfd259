"""consume_dlq writes two batches at once on PostgreSQL and acks them in the order it took them."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from django.db import OperationalError

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.consumer import DeadLetterConsumer
from tests.ingest.conftest import publish_dead_letters
from tests.ingest.test_consume import counters, step_until
from tests.support import DeadLetterQueue, queue_depth

transactional = pytest.mark.django_db(transaction=True)


class HeldWriter:
    """A writer that runs a batch only when the test releases it (in the test's thread and database session), with
    the outcome the test chooses."""

    def __init__(self) -> None:
        self.held: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, function: Callable[..., Any], /, *arguments: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.held.append((future, function, arguments))
        return future

    def release(self) -> None:
        future, function, arguments = self.held.pop(0)
        future.set_result(function(*arguments))

    def fail(self, error: BaseException) -> None:
        future, _, _ = self.held.pop(0)
        future.set_exception(error)

    def shutdown(self, *, wait: bool = True) -> None:
        return None


@transactional
def test_a_batch_committed_before_an_older_one_is_acked_after_it(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, make_consumer: Callable[..., DeadLetterConsumer]
) -> None:
    consumer = make_consumer(queues=[dead_letter_queue.dlq], batch_size=5, batch_seconds=300, pipeline=False)
    older, newer = HeldWriter(), HeldWriter()
    consumer.writers = [older, newer]  # type: ignore[assignment]
    publish_dead_letters(amqp_channel, dead_letter_queue, range(10))
    step_until(consumer, lambda: len(consumer.flights) == 2)

    newer.release()
    for _ in range(5):
        consumer.step()
    assert DeadLetter.objects.count() == 5
    # Committed, but an ack with multiple=True would cover the older batch: it waits.
    assert (consumer.stats.batches, consumer.pending) == (0, 10)

    older.release()
    step_until(consumer, lambda: consumer.stats.batches == 2)
    assert consumer.pending == 0
    consumer.shutdown()

    assert counters() == (10, 10, 10)
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
def test_an_older_batch_the_database_sent_back_holds_the_acks_of_newer_ones_until_written(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, make_consumer: Callable[..., DeadLetterConsumer]
) -> None:
    consumer = make_consumer(queues=[dead_letter_queue.dlq], batch_size=5, batch_seconds=300, pipeline=False)
    older, newer = HeldWriter(), HeldWriter()
    consumer.writers = [older, newer]  # type: ignore[assignment]
    publish_dead_letters(amqp_channel, dead_letter_queue, range(10))
    step_until(consumer, lambda: len(consumer.flights) == 2)

    older.fail(OperationalError("the database went away"))
    newer.release()
    step_until(consumer, lambda: consumer.stats.database_errors == 1)
    assert (consumer.stats.batches, consumer.pending) == (0, 10)

    # Written again after the backoff, as a redelivery: its messages are new all the same.
    consumer.retry_at = 0.0
    step_until(consumer, lambda: len(older.held) == 1)
    assert all(delivery.redelivered for delivery in consumer.flights[0].deliveries)
    older.release()
    step_until(consumer, lambda: consumer.stats.batches == 2)
    consumer.shutdown()

    assert counters() == (10, 10, 10)
    assert queue_depth(dead_letter_queue.dlq) == 0
