"""consume_dlq against the real broker and database: batches, acks after the commit, queues found and lost,
clean stops, database failures, several consumers at once."""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.db.models import Sum
from django.test import override_settings
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern
from dlqconsole.ingest.batch_writer import Delivery
from dlqconsole.ingest.consumer import DeadLetterConsumer
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.models import IngestStat, WatchedQueue
from dlqconsole.ingest.services import ingest_batch
from tests.factories import dead_letter_properties
from tests.ingest.conftest import ConsumerProcess, publish_dead_letters
from tests.support import DeadLetterQueue, declare_with_dlq, queue_depth, subprocess_database_url, wait_until

transactional = pytest.mark.django_db(transaction=True)


def counters() -> tuple[int, int, int]:
    """(rows, sum of DeadLetterCount, sum of FailurePattern.total_count)."""
    return (
        DeadLetter.objects.count(),
        DeadLetterCount.objects.aggregate(total=Sum("count"))["total"] or 0,
        FailurePattern.objects.aggregate(total=Sum("total_count"))["total"] or 0,
    )


def step_until(consumer: DeadLetterConsumer, condition: Callable[[], bool], timeout: float = 20) -> None:
    def stepped() -> bool:
        consumer.step()
        return condition()

    assert wait_until(stepped, timeout=timeout, interval=0), "condition not met"


@transactional
@pytest.mark.sqlite
def test_consume_dlq_stores_broker_dead_letters_and_empties_the_queue(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    publish_dead_letters(amqp_channel, dead_letter_queue, range(30))

    call_command("consume_dlq", queues=dead_letter_queue.dlq, batch_size=8, exit_when_idle=0.5)

    assert "30 received, 30 new, 0 duplicates" in capsys.readouterr().out
    assert counters() == (30, 30, 30)
    letter = DeadLetter.objects.get(message_id="m-8")
    assert (letter.source_queue, letter.original_queue, letter.death_reason) == (
        dead_letter_queue.dlq,
        dead_letter_queue.work,
        "expired",
    )
    assert (letter.error_type, letter.failure_reason) == ("ConnectionResetError", "NETWORK_ERROR")
    assert bytes(letter.body) == b'{"order": 8}'
    stat = IngestStat.objects.get(source_queue=dead_letter_queue.dlq)
    assert (stat.received, stat.inserted, stat.duplicates, stat.malformed) == (30, 30, 0, 0)
    assert stat.batches >= 4
    assert stat.last_batch_at is not None
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
@pytest.mark.sqlite
def test_batch_committed_but_not_acked_comes_back_only_as_duplicates(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, make_consumer: Callable[..., DeadLetterConsumer]
) -> None:
    publish_dead_letters(amqp_channel, dead_letter_queue, range(20))
    consumer = make_consumer(queues=[dead_letter_queue.dlq], batch_size=1000, batch_seconds=60)
    step_until(consumer, lambda: len(consumer.buffer) == 20)
    # The process dies between the commit and the ack: the rows are there, the broker still holds the messages.
    now = timezone.now()
    ingest_batch(
        letters=[
            parse_envelope(source_queue=d.queue, body=d.body, properties=d.properties, now=now) for d in consumer.buffer
        ]
    )
    consumer.drop_connection()
    consumer.shutdown()
    assert wait_until(lambda: queue_depth(dead_letter_queue.dlq) == 20)

    call_command("consume_dlq", queues=dead_letter_queue.dlq, exit_when_idle=0.5)

    assert counters() == (20, 20, 20)
    stat = IngestStat.objects.get(source_queue=dead_letter_queue.dlq)
    assert (stat.received, stat.inserted, stat.duplicates) == (40, 20, 20)
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
@pytest.mark.sqlite
def test_missing_queue_is_reported_and_consumed_once_declared(
    dead_letter_queue: DeadLetterQueue,
    queue_name: Callable[[str], str],
    amqp_channel: Any,
    caplog: pytest.LogCaptureFixture,
    make_consumer: Callable[..., DeadLetterConsumer],
) -> None:
    later = f"{queue_name('later')}.dlq"
    publish_dead_letters(amqp_channel, dead_letter_queue, range(5))
    consumer = make_consumer(queues=[later, dead_letter_queue.dlq], batch_seconds=0.05, refresh_seconds=0.3)

    with caplog.at_level(logging.WARNING, logger="dlqconsole.ingest.consumer"):
        step_until(consumer, lambda: DeadLetter.objects.count() == 5)
    assert f"cannot consume {later}: 404" in caplog.text

    amqp_channel.queue_declare(queue=later, durable=True)
    amqp_channel.basic_publish(
        exchange="", routing_key=later, body=b"late", properties=dead_letter_properties(99, expiration=None)
    )
    step_until(consumer, lambda: DeadLetter.objects.filter(source_queue=later).exists())
    consumer.shutdown()

    assert bytes(DeadLetter.objects.get(source_queue=later).body) == b"late"
    assert queue_depth(later) == 0


@transactional
@pytest.mark.sqlite
@override_settings(DLQ_QUEUES=[])
def test_watched_queues_are_consumed_and_new_ones_picked_up(
    queue_name: Callable[[str], str], amqp_channel: Any, make_consumer: Callable[..., DeadLetterConsumer]
) -> None:
    first = declare_with_dlq(amqp_channel, queue_name("first"))
    WatchedQueue.objects.create(name=first.work, dead_letter_queue=first.dlq, dead_letter_exchange=f"{first.work}.dlx")
    publish_dead_letters(amqp_channel, first, range(3))
    consumer = make_consumer(batch_seconds=0.05, refresh_seconds=0.3)
    step_until(consumer, lambda: DeadLetter.objects.count() == 3)

    second = declare_with_dlq(amqp_channel, queue_name("second"))
    WatchedQueue.objects.create(
        name=second.work, dead_letter_queue=second.dlq, dead_letter_exchange=f"{second.work}.dlx"
    )
    publish_dead_letters(amqp_channel, second, range(100, 104))
    step_until(consumer, lambda: DeadLetter.objects.filter(source_queue=second.dlq).count() == 4)
    consumer.shutdown()

    assert (queue_depth(first.dlq), queue_depth(second.dlq)) == (0, 0)


@transactional
@pytest.mark.parametrize("pipeline", [True, False], ids=["writer-thread", "inline"])
def test_database_outage_keeps_the_batch_unacked_and_writes_it_when_back(
    pipeline: bool,
    dead_letter_queue: DeadLetterQueue,
    amqp_channel: Any,
    make_consumer: Callable[..., DeadLetterConsumer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = make_consumer(queues=[dead_letter_queue.dlq], batch_seconds=0.05, pipeline=pipeline)
    publish_dead_letters(amqp_channel, dead_letter_queue, range(5))
    step_until(consumer, lambda: consumer.stats.batches == 1)
    consumer.batch_seconds = 300
    publish_dead_letters(amqp_channel, dead_letter_queue, range(5, 17), wait=False)
    step_until(consumer, lambda: len(consumer.buffer) == 12)
    # What a database restart does to every session, the consumer's (whichever thread it is in) for real.
    with psycopg.connect(subprocess_database_url(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    if pipeline:
        # This test's own session died too; inline, it is the consumer's session and must fail in its hands.
        connection.close()
    consumer.batch_seconds = 0

    with caplog.at_level(logging.WARNING, logger="dlqconsole.ingest.consumer"):
        step_until(consumer, lambda: consumer.stats.database_errors == 1)
    assert "12 deliveries stay unacked" in caplog.text
    assert consumer.pending == 12
    assert DeadLetter.objects.count() == 5
    step_until(consumer, lambda: consumer.stats.batches == 2)
    consumer.shutdown()

    assert counters() == (17, 17, 17)
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
def test_dead_letter_the_database_refuses_is_stored_reduced_with_the_error(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, make_consumer: Callable[..., DeadLetterConsumer]
) -> None:
    publish_dead_letters(amqp_channel, dead_letter_queue, range(4))
    consumer = make_consumer(queues=[dead_letter_queue.dlq], batch_size=1000, batch_seconds=60)
    step_until(consumer, lambda: len(consumer.buffer) == 4)
    # A parser bug that lets a NUL through: PostgreSQL refuses it in a text column.
    poisoned: Delivery = consumer.buffer[2]
    poisoned.letter = parse_envelope(
        source_queue=poisoned.queue, body=poisoned.body, properties=poisoned.properties, now=timezone.now()
    )
    poisoned.letter.error_type = "Bad\x00Type"

    consumer.flush()
    consumer.shutdown()

    assert counters() == (4, 4, 4)
    reduced = DeadLetter.objects.get(message_id="")
    assert bytes(reduced.body) == poisoned.body
    assert any("the database refused the parsed fields" in problem for problem in reduced.parse_errors)
    assert consumer.stats.reduced == 1
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
def test_sigterm_writes_the_current_batch_before_stopping(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, consume_dlq: Callable[..., ConsumerProcess]
) -> None:
    consumer = consume_dlq("--queues", dead_letter_queue.dlq, "--batch-size", "100000", "--batch-seconds", "300")
    assert wait_until(lambda: "consuming " + dead_letter_queue.dlq in consumer.output)
    publish_dead_letters(amqp_channel, dead_letter_queue, range(40), wait=False)
    # Every message delivered to the consumer (none ready), none written yet: the batch waits for 300 s.
    assert wait_until(lambda: queue_depth(dead_letter_queue.dlq) == 0 and DeadLetter.objects.count() == 0)

    consumer.signal(signal.SIGTERM)

    assert consumer.wait(timeout=30) == 0
    assert "SIGTERM received" in consumer.output
    assert counters() == (40, 40, 40)
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
def test_several_consumers_on_one_queue_store_each_dead_letter_once(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, consume_dlq: Callable[..., ConsumerProcess]
) -> None:
    publish_dead_letters(amqp_channel, dead_letter_queue, range(3000))

    consumers = [
        consume_dlq(
            "--queues", dead_letter_queue.dlq, "--batch-size", "50", "--prefetch", "100", "--exit-when-idle", "2"
        )
        for _ in range(3)
    ]

    assert [consumer.wait() for consumer in consumers] == [0, 0, 0]
    assert counters() == (3000, 3000, 3000)
    stat = IngestStat.objects.get(source_queue=dead_letter_queue.dlq)
    assert (stat.inserted, stat.received - stat.duplicates) == (3000, 3000)
    assert all(" new, " in consumer.output and "0 database errors" in consumer.output for consumer in consumers)
    assert queue_depth(dead_letter_queue.dlq) == 0


@transactional
def test_concurrent_batches_of_the_same_dead_letters_count_each_once(dead_letter_queue: DeadLetterQueue) -> None:
    now = timezone.now()
    letters = [
        parse_envelope(
            source_queue=dead_letter_queue.dlq,
            body=f"body {index}".encode(),
            properties=dead_letter_properties(
                index, headers={"x-exception-type": f"Kind{index % 37}Error", "x-exception-message": "it failed"}
            ),
            now=now,
            # Two consumers can only hold the same dead letter when one of them has a redelivered copy of it.
            redelivered=True,
        )
        for index in range(300)
    ]
    inserted: list[int] = []
    errors: list[BaseException] = []

    def ingest(seed: int) -> None:
        batch = letters[:]
        random.Random(seed).shuffle(batch)
        try:
            for attempt in range(5):
                try:
                    inserted.append(ingest_batch(letters=batch[: 150 + seed * 50]).inserted)
                    break
                except OperationalError:
                    # A deadlock victim is retried, as consume_dlq retries a batch.
                    if attempt == 4:
                        raise
        except BaseException as error:  # noqa: BLE001  (reported below, in the test thread)
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=ingest, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sum(inserted) == 300
    assert counters() == (300, 300, 300)
    assert FailurePattern.objects.count() == 37
    stat = IngestStat.objects.get(source_queue=dead_letter_queue.dlq)
    assert (stat.received, stat.inserted, stat.duplicates) == (150 + 200 + 250 + 300, 300, 600)


def test_the_loop_touches_its_heartbeat_file(
    make_consumer: Callable[..., DeadLetterConsumer], settings: Any, tmp_path: Path
) -> None:
    alive = tmp_path / "consume_dlq.alive"
    settings.DLQ_CONSUMER_HEARTBEAT_FILE = str(alive)
    now = [100.0]
    consumer = make_consumer(queues=["unused"], clock=lambda: now[0])

    consumer.heartbeat()
    assert alive.exists()
    os.utime(alive, (0, 0))
    consumer.heartbeat()  # not due yet
    assert alive.stat().st_mtime == 0
    now[0] += 5
    consumer.heartbeat()
    assert alive.stat().st_mtime > 0  # touched again (its time is the file system's, not this process's clock)


def test_a_missing_queue_is_tried_again_within_seconds(
    queue_name: Callable[[str], str], make_consumer: Callable[..., DeadLetterConsumer]
) -> None:
    """A service declaring its queues as the console starts should not wait for the 30 s queue refresh."""
    now = [1000.0]
    consumer = make_consumer(queues=[f"{queue_name('soon')}.dlq"], refresh_seconds=30, clock=lambda: now[0])
    consumer.connect()

    consumer.refresh_queues()

    assert consumer.missing and consumer.next_refresh == 1005.0


@transactional
def test_with_no_queue_to_consume_the_watched_queues_are_read_again_within_seconds(
    queue_name: Callable[[str], str],
    make_consumer: Callable[..., DeadLetterConsumer],
    settings: Any,
    amqp_channel: Any,
) -> None:
    """The console starting before anything is watched (the demo declares its queues a moment later) should not
    wait for the 30 s refresh to drain them."""
    from dlqconsole.ingest.models import WatchedQueue

    settings.DLQ_QUEUES = []
    now = [1000.0]
    consumer = make_consumer(refresh_seconds=30, clock=lambda: now[0])
    consumer.connect()
    WatchedQueue.objects.all().delete()

    consumer.refresh_queues()
    nothing_watched_next = consumer.next_refresh
    queue = queue_name("later")
    amqp_channel.queue_declare(queue=f"{queue}.dlq", durable=True)
    WatchedQueue.objects.create(name=queue, dead_letter_queue=f"{queue}.dlq")
    now[0] = nothing_watched_next
    consumer.refresh_queues()

    assert nothing_watched_next == 1005.0
    assert f"{queue}.dlq" in consumer.channels
