"""Acceptance: the circuit breaker of a destination whose consumer dead-letters everything, with a real worker.

Two operations and a retry policy replay into one queue whose consumer rejects every message into its DLQ, and
ingest of that DLQ runs, so each replay comes back as a boomerang. The breaker opens for all three at once; they wait
without holding the worker (a solo worker, one slot, runs another operation meanwhile); once the consumer is fixed,
the half-open probe closes the breaker and the waiting replays finish by themselves, each message delivered once.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pika
import pytest
from django.conf import settings
from django.db import connection as db_connection
from django.utils import timezone

from dlqconsole.core.amqp import connect
from dlqconsole.core.breaker import CLOSED, get_breakers
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations import policies
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus, RetryPolicy
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import start_operation
from tests.support import declare_with_dlq, ingest_from, kill_on_broker, wait_for, wait_for_depth, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

BREAKER_ENV = {
    "DLQ_BREAKER_FAILURES": "5",
    "DLQ_BREAKER_MIN_SAMPLE": "10",
    "DLQ_BREAKER_COOLDOWN_SECONDS": "2",
    "DLQ_BREAKER_WATCH_SECONDS": "3",
    "DLQ_BREAKER_PROBE_SIZE": "5",
}


@dataclass
class Consumer:
    """A service consuming its work queue in a thread: while `broken` it rejects every message into the DLQ."""

    queue: str
    broken: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    deliveries: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        connection = connect(settings.AMQP_URL)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)

        def on_message(channel: pika.channel.Channel, method: pika.spec.Basic.Deliver, properties, body) -> None:  # type: ignore[no-untyped-def]
            with self.lock:
                self.deliveries[str(properties.message_id)] += 1
                if self.broken.is_set():
                    self.rejected += 1
                    channel.basic_nack(delivery_tag=method.delivery_tag, requeue=False)
                else:
                    channel.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_consume(queue=self.queue, on_message_callback=on_message)
        while not self.stop.is_set():
            connection.process_data_events(time_limit=0.1)
        connection.close()


def ingest_loop(dlq: str, stop: threading.Event) -> None:
    """consume_dlq in short: ingest what reaches the DLQ, so boomerangs are linked (and reported) as they come."""
    connection = connect(settings.AMQP_URL)
    channel = connection.channel()
    try:
        while not stop.wait(0.2):
            ingest_from(channel, dlq)
    finally:
        connection.close()
        db_connection.close()


@pytest.fixture
def threads() -> Iterator[list[tuple[threading.Thread, threading.Event]]]:
    started: list[tuple[threading.Thread, threading.Event]] = []
    yield started
    for thread, stop in started:
        stop.set()
        thread.join(timeout=10)


def dead_letters(channel, queue: str, prefix: str, count: int, error: str) -> list[DeadLetter]:  # type: ignore[no-untyped-def]
    for number in range(count):
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=f"{prefix} {number}".encode(),
            properties=pika.BasicProperties(message_id=f"{prefix}-{number}", headers={"x-exception-message": error}),
        )
    kill_on_broker(channel, queue, count)
    assert wait_for_depth(channel, queue + ".dlq", count) == count
    return ingest_from(channel, queue + ".dlq", expect=count)


def test_a_failing_destination_opens_its_breaker_for_everyone_and_the_probe_closes_it(
    channel, queue_name, operator, celery_worker, threads, settings
):
    for name, value in BREAKER_ENV.items():
        setattr(settings, name, int(value))
    orders, other = queue_name("orders"), queue_name("other")
    declare_with_dlq(channel, orders)
    declare_with_dlq(channel, other)
    first = dead_letters(channel, orders, "first", 20, "order rejected by the warehouse")
    second = dead_letters(channel, orders, "second", 20, "order rejected by the warehouse")
    automatic = dead_letters(channel, orders, "automatic", 20, "payment gateway timed out")
    unrelated = dead_letters(channel, other, "unrelated", 5, "order rejected by the warehouse")
    worker = celery_worker(**BREAKER_ENV)

    consumer = Consumer(orders)
    consumer.broken.set()
    threads.append((threading.Thread(target=consumer.run), consumer.stop))
    ingest_stop = threading.Event()
    threads.append((threading.Thread(target=ingest_loop, args=(orders + ".dlq", ingest_stop)), ingest_stop))
    for thread, _ in threads:
        thread.start()
    worker.wait_until_ready()

    # Two operations and a retry policy replay into the queue at once, the operations with the default share of
    # returns that pauses one: while the breaker guards the destination, it waits for the probe instead.
    operations = [
        start_operation(
            operation=plan_operation(
                kind=OperationKind.RETRY,
                filter={"ids": [letter.pk for letter in part]},
                actor=operator,
                rate="10/1s",
            ),
            actor=operator,
        )
        for part in (first, second)
    ]
    RetryPolicy.objects.create(name="orders", pattern_id=automatic[0].pattern_id, delays=[1], rate="10/1s")
    later = timezone.now() + dt.timedelta(minutes=1)
    assert policies.schedule_new_dead_letters(now=later) == 20
    (by_policy,) = policies.start_due_retries(now=later + dt.timedelta(seconds=5))
    operations.append(by_policy)
    key = f"queue:{orders}"

    # The boomerangs open the breaker; all three wait for it, and none holds the worker.
    assert wait_until(lambda: get_breakers().peek(key).state != CLOSED, timeout=30)
    assert wait_until(lambda: all(waiting(operation) for operation in operations), timeout=30)
    assert get_breakers().peek(key).reason

    # The worker's one slot is free: another operation, to a healthy queue, runs to the end meanwhile.
    unrelated_retry = start_operation(
        operation=plan_operation(
            kind=OperationKind.RETRY, filter={"ids": [letter.pk for letter in unrelated]}, actor=operator
        ),
        actor=operator,
    )
    wait_for(unrelated_retry, OperationStatus.DONE, timeout=30)
    assert wait_for_depth(channel, other, 5) == 5
    assert get_breakers().peek(key).state != CLOSED
    assert not all(operation.status == OperationStatus.DONE for operation in refreshed(operations))

    # The consumer is fixed: the next probe stays away for the watch, the breaker closes, the replays finish.
    consumer.broken.clear()
    for operation in operations:
        wait_for(operation, OperationStatus.DONE, timeout=90)
    assert get_breakers().peek(key).state == CLOSED

    # Every message reached the queue once: the ones sent before the breaker opened died there and came back as
    # boomerangs (not replayed again), the others were held back and went after the probe.
    with consumer.lock:
        deliveries = dict(consumer.deliveries)
    expected = {str(letter.message_id) for letter in first + second + automatic}
    assert set(deliveries) == expected
    assert set(deliveries.values()) == {1}
    assert 0 < consumer.rejected < 60
    for operation in refreshed(operations):
        assert (operation.succeeded, operation.failed, operation.skipped) == (20, 0, 0)
        assert (operation.breaker_wait, operation.breaker_wait_until) == ("", None)
        assert operation.last_error == ""  # waiting for a breaker is no error, and leaves none behind
    boomerangs = DeadLetter.objects.filter(source_queue=orders + ".dlq", previous__isnull=False)
    assert wait_until(lambda: boomerangs.count() == consumer.rejected, timeout=10)


def waiting(operation: Operation) -> bool:
    operation.refresh_from_db()
    return bool(operation.breaker_wait) and operation.runner == "" and operation.status == OperationStatus.RUNNING


def refreshed(operations: list[Operation]) -> list[Operation]:
    for operation in operations:
        operation.refresh_from_db()
    return operations
