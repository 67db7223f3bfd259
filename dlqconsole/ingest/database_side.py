"""The database side of the consume_dlq loop: batches taken from the buffer in delivery order, handed to the
writer (batch_writer.py) one at a time, and acked once committed; an outage keeps the batch unacked for later.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from django.db import DatabaseError
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.ingest.batch_writer import Delivery, InlineExecutor, WriteResult, write_batch
from dlqconsole.ingest.envelope import parse_envelope

if TYPE_CHECKING:
    # For the annotations only: consumer.py, which builds on this module, defines them.
    from dlqconsole.ingest.consumer import Backoff, ConsumerStats

# consume_dlq logs under the consumer's name, whichever of its modules a step lives in, so that one logger
# configures (and filters) all of it.
log = logging.getLogger("dlqconsole.ingest.consumer")


class DatabaseSide(ABC):
    """The steps of DeadLetterConsumer that write what it received and ack it (a mixin of the consumer)."""

    # The consumer's state these steps read and change, set up by DeadLetterConsumer.__init__.
    batch_size: int
    batch_seconds: float
    batch_bytes: int
    clock: Callable[[], float]
    stopping: bool
    retired: list[BlockingChannel]
    buffer: list[Delivery]
    held_bytes: int
    buffer_bytes: int
    full_since: float | None
    batch: list[Delivery]
    writing: Future[WriteResult] | None
    writer: ThreadPoolExecutor | InlineExecutor
    retry_at: float
    batch_started_at: float
    last_activity: float
    database_backoff: Backoff
    stats: ConsumerStats
    broker_id: int | None
    broker_scope: str

    @property
    @abstractmethod
    def pending(self) -> int:
        """Deliveries received and not acked yet (the loop's)."""

    @property
    @abstractmethod
    def full(self) -> bool:
        """Holding the byte budget or more (ByteBudget's)."""

    @abstractmethod
    def forget_sizes(self, batch: list[Delivery]) -> None:
        """Let the sizes of an acked batch's bodies fade from the queues' prefetch (ByteBudget's)."""

    def batch_due(self) -> bool:
        if not self.buffer:
            return False
        return (
            self.stopping
            or self.full
            or len(self.buffer) >= self.batch_size
            or self.buffer_bytes >= self.batch_bytes
            or self.clock() - self.batch_started_at >= self.batch_seconds
        )

    def take_batch(self) -> list[Delivery]:
        """The oldest deliveries of the buffer, up to the batch size or DLQ_CONSUMER_BATCH_BYTES (at least one)."""
        count = size = 0
        for delivery in self.buffer[: self.batch_size]:
            if count and size + len(delivery.body) > self.batch_bytes:
                break
            count += 1
            size += len(delivery.body)
        batch, self.buffer = self.buffer[:count], self.buffer[count:]
        self.buffer_bytes -= size
        return batch

    def submit(self) -> None:
        """Hand the next batch (or the one a database error sent back) to the writer."""
        if self.batch:
            # A batch sent back by a database error may have been committed all the same (the connection died
            # during the commit): written again, each of its messages is a redelivery, counted once.
            for delivery in self.batch:
                delivery.redelivered = True
                if delivery.letter is not None:
                    delivery.letter.redelivered = True
        else:
            self.batch = self.take_batch()
            if self.buffer:
                self.batch_started_at = self.clock()
        self.parse(self.batch)
        self.writing = self.writer.submit(write_batch, self.batch)

    def prepare(self) -> None:
        """While the writer is busy, parse what the next batch will hold, so it is ready when the writer is."""
        self.parse(self.buffer[: self.batch_size])

    def parse(self, deliveries: list[Delivery]) -> None:
        now = timezone.now()
        for delivery in deliveries:
            if delivery.letter is None:
                delivery.letter = parse_envelope(
                    source_queue=delivery.queue,
                    body=delivery.body,
                    properties=delivery.properties,
                    now=now,
                    redelivered=delivery.redelivered,
                    broker_id=self.broker_id,
                    broker_scope=self.broker_scope,
                )

    def collect(self, *, wait: bool = False) -> None:
        """Ack the batch the writer finished. A database outage keeps it (unacked) for a later attempt."""
        if self.writing is None or not (wait or self.writing.done()):
            return
        writing, self.writing = self.writing, None
        try:
            written = writing.result()
        except DatabaseError as error:
            self.on_database_error(error)
            return
        self.ack(self.batch)
        self.record(self.batch, written)
        self.held_bytes -= sum(len(delivery.body) for delivery in self.batch)
        self.forget_sizes(self.batch)
        self.batch = []
        if self.full_since is not None and not self.full:
            log.info("reading again after %.1f s over the byte budget", self.clock() - self.full_since)
            self.full_since = None
        self.database_backoff.reset()
        # Idle time counts from here: a slow batch is not a quiet queue.
        self.last_activity = self.clock()

    def flush(self) -> None:
        """Write and ack everything received, waiting for the writer (one attempt per batch). Raises
        DatabaseError, with the deliveries kept unacked, when the database is unavailable."""
        while True:
            if self.writing is None:
                if not (self.batch or self.buffer):
                    return
                self.submit()
            assert self.writing is not None
            error = self.writing.exception()
            self.collect(wait=True)
            if error is not None:
                raise error

    def ack(self, batch: list[Delivery]) -> None:
        last: dict[int, tuple[BlockingChannel, int]] = {}
        for delivery in batch:
            last[id(delivery.channel)] = (delivery.channel, delivery.delivery_tag)
        for channel, tag in last.values():
            if channel.is_open:
                channel.basic_ack(delivery_tag=tag, multiple=True)
            else:
                # Committed but no longer ackable: the broker redelivers them and the dedupe key absorbs it.
                log.info("a channel closed before its ack; its deliveries will come again as duplicates")
        for channel in self.retired:
            if channel.is_open:
                channel.close()
        self.retired = []

    def record(self, batch: list[Delivery], written: WriteResult) -> None:
        result = written.result
        self.stats.reduced += written.reduced
        self.stats.batches += 1
        self.stats.received += result.received
        self.stats.inserted += result.inserted
        self.stats.duplicates += result.duplicates
        for delivery in batch:
            self.stats.per_queue[delivery.queue] += 1
        log.debug("batch of %d: %d new, %d duplicates", result.received, result.inserted, result.duplicates)

    def on_database_error(self, error: BaseException) -> None:
        """Keep what is unacked and try again after a backoff; the loop keeps the AMQP connection alive."""
        self.stats.database_errors += 1
        delay = self.database_backoff.next_delay()
        log.warning(
            "database error (%s: %s); %d deliveries stay unacked; retrying in %.1f s",
            type(error).__name__,
            str(error).strip().splitlines()[0] if str(error).strip() else "",
            self.pending,
            delay,
        )
        self.retry_at = self.clock() + delay
