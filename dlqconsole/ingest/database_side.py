"""The database side of the consume_dlq loop: batches taken from the buffer in delivery order, handed to the
writers (batch_writer.py), and acked once committed, oldest first; an outage keeps a batch unacked for later.

On PostgreSQL up to WRITERS batches are written at once, each in a writer thread with its own database connection
and its own transaction, so that the database stores one batch while it finishes the transaction of the one
before (most of a batch's time is the database's: its rows, their indexes, the counters). Two batches in flight
are two concurrent ingest transactions, as two consumer processes make: they take their locks in the order
ingest's services fix, and a later one waits at the counters for the earlier one to commit. A batch is acked
only when it and every batch taken before it are committed, so an ack with multiple=True never covers a delivery
that is not committed.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
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

# Batches written at once on PostgreSQL, by as many writer threads.
WRITERS = 2


@dataclass(eq=False)
class Flight:
    """A batch handed to a writer: being written (`writing`), written and waiting for an older batch to be acked
    first (`written`), or sent back by a database error (neither) until it is written again."""

    deliveries: list[Delivery]
    writer: ThreadPoolExecutor | InlineExecutor
    writing: Future[WriteResult] | None = None
    written: WriteResult | None = None
    error: BaseException | None = field(default=None, repr=False)


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
    flights: list[Flight]
    writers: list[ThreadPoolExecutor] | list[InlineExecutor]
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
        return self.batch_filled() or (bool(self.buffer) and self.clock() - self.batch_started_at >= self.batch_seconds)

    def batch_filled(self) -> bool:
        """A whole batch is waiting (or everything must be written now)."""
        if not self.buffer:
            return False
        return (
            self.stopping or self.full or len(self.buffer) >= self.batch_size or self.buffer_bytes >= self.batch_bytes
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

    @property
    def writing(self) -> bool:
        """A batch is with a writer."""
        return any(flight.writing is not None for flight in self.flights)

    @property
    def stalled(self) -> list[Flight]:
        """Batches a database error sent back, to be written again."""
        return [flight for flight in self.flights if flight.writing is None and flight.written is None]

    def free_writer(self) -> ThreadPoolExecutor | InlineExecutor | None:
        busy = {id(flight.writer) for flight in self.flights if flight.writing is not None}
        return next((writer for writer in self.writers if id(writer) not in busy), None)

    def may_submit(self) -> bool:
        """A batch to hand to a writer now: one sent back once its retry is due, else a new one when it is due and
        a writer is free (none while a batch waits to be written again: the database is away)."""
        if self.clock() < self.retry_at:
            return False
        if self.stalled:
            return self.free_writer() is not None
        if not self.flights:
            return self.batch_due()
        # Beside a batch being written, only a whole one: a partial batch waits for a free database rather than
        # cost a transaction of its own.
        return len(self.flights) < len(self.writers) and self.batch_filled()

    def submit(self) -> None:
        """Hand the batches a database error sent back to free writers, or else the next batch."""
        stalled = self.stalled
        if stalled:
            for flight in stalled:
                writer = self.free_writer()
                if writer is None:
                    return
                # A batch sent back by a database error may have been committed all the same (the connection
                # died during the commit): written again, each of its messages is a redelivery, counted once.
                for delivery in flight.deliveries:
                    delivery.redelivered = True
                    if delivery.letter is not None:
                        delivery.letter.redelivered = True
                self.start(flight, writer)
            return
        writer = self.free_writer()
        if writer is None or not self.buffer:
            return
        flight = Flight(self.take_batch(), writer)
        if self.buffer:
            self.batch_started_at = self.clock()
        self.flights.append(flight)
        self.start(flight, writer)

    def start(self, flight: Flight, writer: ThreadPoolExecutor | InlineExecutor) -> None:
        self.parse(flight.deliveries)
        flight.writer, flight.error = writer, None
        flight.writing = writer.submit(write_batch, flight.deliveries)

    def prepare(self) -> None:
        """While the writers are busy, parse what the next batch will hold, so it is ready when a writer is."""
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

    def collect(self, *, wait: bool = False) -> BaseException | None:
        """Ack the batches written, oldest first: a batch written before an older one waits for it. A database
        outage sends a batch back (unacked) for a later attempt; returns that error."""
        failed: BaseException | None = None
        for flight in self.flights:
            if flight.writing is None or not (wait or flight.writing.done()):
                continue
            writing, flight.writing = flight.writing, None
            try:
                flight.written = writing.result()
            except DatabaseError as error:
                flight.error = error
                failed = failed or error
        if failed is not None:
            self.on_database_error(failed)
        acked = False
        while self.flights and self.flights[0].written is not None:
            flight = self.flights.pop(0)
            assert flight.written is not None
            self.ack(flight.deliveries)
            self.record(flight.deliveries, flight.written)
            self.held_bytes -= sum(len(delivery.body) for delivery in flight.deliveries)
            self.forget_sizes(flight.deliveries)
            acked = True
        if acked:
            if self.full_since is not None and not self.full:
                log.info("reading again after %.1f s over the byte budget", self.clock() - self.full_since)
                self.full_since = None
            if failed is None and not self.stalled:
                self.database_backoff.reset()
            # Idle time counts from here: a slow batch is not a quiet queue.
            self.last_activity = self.clock()
        return failed

    def flush(self) -> None:
        """Write and ack everything received, waiting for the writers (one attempt per batch). Raises
        DatabaseError, with the deliveries kept unacked, when the database is unavailable."""
        while self.flights or self.buffer:
            if self.stalled or (self.buffer and len(self.flights) < len(self.writers)):
                self.submit()
            if not self.writing:
                # Every writer is free and nothing could be handed over: only a batch sent back is left.
                raise self.stalled[0].error or DatabaseError("a batch could not be written")
            error = self.collect(wait=True)
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
        # A retired channel is closed once none of its deliveries waits for an ack any more.
        waiting = {id(delivery.channel) for flight in self.flights for delivery in flight.deliveries}
        waiting.update(id(delivery.channel) for delivery in self.buffer)
        for channel in self.retired:
            if channel.is_open and id(channel) not in waiting:
                channel.close()
        self.retired = [channel for channel in self.retired if id(channel) in waiting]

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
