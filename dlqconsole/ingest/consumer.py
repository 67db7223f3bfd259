"""The consume_dlq loop: drain dead-letter queues into the database, acking only what is committed.

A loop of small steps in the style of healthchecks' sendalerts, so tests can drive it step by step:

- `connect()` opens one AMQP connection; `refresh_queues()` starts a consumer (one channel each, with its own
  prefetch) on every queue we should drain and retries missing ones later;
- `poll()` services the connection for a moment (heartbeats, deliveries into the buffer);
- `submit()` parses the next batch and hands it to a writer, which stores it in one transaction
  (`ingest_batch`); `collect()` acks the written batches, oldest first, with one `basic_ack(multiple=True)` per
  channel.

On PostgreSQL the writers are threads of their own (two, each with its database connection): while the database
stores a batch, the loop keeps reading and parsing the next, and a second batch is written while the first one
commits (database_side.py). Batches are taken from the buffer in delivery order and acked in that order, each only
once it and every older one are committed, so acking a batch with multiple=True never covers a delivery that is
not committed. On other databases (SQLite) the batch is written in the loop.

Memory: the bodies held (received, not acked) are bounded by DLQ_CONSUMER_MAX_BYTES, past which the loop stops
reading until a batch is acked, and what the broker sends ahead on each queue by a prefetch sized to the queue's
share of that budget (byte_budget.py).

Failures: when RabbitMQ goes away the buffer is dropped (those deliveries were not acked, so the broker
redelivers them) and we reconnect with backoff. When the database goes away nothing is acked; the batches are
kept and written again once the database answers, while the AMQP connection keeps its heartbeats. A batch that
the database refuses for its content is split to store the message at fault reduced (batch_writer.py), so one
bad message neither blocks the queue nor gets lost. Inserts are idempotent, so anything written twice (a crash
between commit and ack, several consumers on the same queues) is counted once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.db import connection as db_connection
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.core.amqp import connection_parameters
from dlqconsole.ingest.amqp_decoding import install_tolerant_decoding
from dlqconsole.ingest.batch_writer import Delivery, InlineExecutor
from dlqconsole.ingest.byte_budget import ByteBudget
from dlqconsole.ingest.database_side import WRITERS, DatabaseSide, Flight
from dlqconsole.ingest.envelope import broker_scope
from dlqconsole.ingest.models import WatchedQueue

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
MISSING_RETRY_SECONDS = 5.0
BROKER_ERRORS: tuple[type[BaseException], ...] = (pika.exceptions.AMQPError, OSError)


@dataclass
class Backoff:
    """Exponential backoff with a cap: 0.5 s, 1 s, 2 s, ... up to `maximum`, reset after a success."""

    first: float = 0.5
    maximum: float = 30.0
    failures: int = 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.first * 2**self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


@dataclass
class ConsumerStats:
    received: int = 0
    inserted: int = 0
    duplicates: int = 0
    batches: int = 0
    reduced: int = 0
    broker_errors: int = 0
    database_errors: int = 0
    per_queue: Counter[str] = field(default_factory=Counter)


class DeadLetterConsumer(ByteBudget, DatabaseSide):
    """The loop and its broker side. The steps that bound what it holds are ByteBudget's (byte_budget.py); those
    that write and ack what it received are DatabaseSide's (database_side.py)."""

    def __init__(
        self,
        *,
        queues: list[str] | None = None,
        batch_size: int | None = None,
        batch_seconds: float | None = None,
        prefetch: int | None = None,
        max_bytes: int | None = None,
        batch_bytes: int | None = None,
        exit_when_idle: float | None = None,
        amqp_url: str | None = None,
        broker: Broker | None = None,
        refresh_seconds: float = 5.0,
        poll_seconds: float = 0.1,
        max_backoff: float = 30.0,
        pipeline: bool | None = None,
        writers: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fixed_queues = [name for name in (queues or []) if name]
        self.batch_size = batch_size or settings.DLQ_CONSUMER_BATCH_SIZE
        self.batch_seconds = settings.DLQ_CONSUMER_BATCH_SECONDS if batch_seconds is None else batch_seconds
        self.prefetch = prefetch or settings.DLQ_CONSUMER_PREFETCH
        self.max_bytes = max_bytes or settings.DLQ_CONSUMER_MAX_BYTES
        self.batch_bytes = batch_bytes or settings.DLQ_CONSUMER_BATCH_BYTES
        self.exit_when_idle = exit_when_idle
        # The broker consumed: `broker`, or `default` (AMQP_URL, or `amqp_url` in tests) when None; its dead
        # letters are then filed under default by ingest_batch.
        self.broker = broker
        self.broker_name = broker.name if broker is not None else DEFAULT
        self.broker_id = broker.pk if broker is not None else None
        self.amqp_url = amqp_url
        self.broker_scope = broker_scope(broker.pk, default=broker.is_default) if broker is not None else ""
        self.refresh_seconds = refresh_seconds
        self.poll_seconds = poll_seconds
        self.clock = clock

        self.connection: BlockingConnection | None = None
        self.channels: dict[str, BlockingChannel] = {}
        # Channels whose consumer the broker cancelled (queue deleted): kept open until their deliveries are acked.
        self.retired: list[BlockingChannel] = []
        self.buffer: list[Delivery] = []
        # Bytes of the bodies held: received and not acked (buffer and batch), and of those in the buffer.
        self.held_bytes = 0
        self.buffer_bytes = 0
        self.next_full_read = 0.0
        self.full_since: float | None = None
        # Per queue: the largest body lately seen, the prefetch its consumer runs with, when that last shrank, and
        # the queues whose prefetch is due for a change.
        self.largest: dict[str, int] = {}
        self.prefetch_of: dict[str, int] = {}
        self.prefetch_shrunk_at: dict[str, float] = {}
        self.resize: set[str] = set()
        # The batches handed to the writers, oldest first, until acked (or kept after a database error until they
        # can be written again).
        self.flights: list[Flight] = []
        self.retry_at = 0.0
        if pipeline is None:
            pipeline = db_connection.vendor == "postgresql"
        # One thread per writer: each keeps its own database connection.
        self.writers: list[ThreadPoolExecutor] | list[InlineExecutor] = (
            [
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"consume_dlq-writer-{number}")
                for number in range(writers or WRITERS)
            ]
            if pipeline
            else [InlineExecutor()]
        )
        self.batch_started_at = 0.0
        self.last_activity = self.clock()
        self.next_refresh = 0.0
        self.next_heartbeat = 0.0
        self.missing: set[str] = set()
        self.broker_backoff = Backoff(maximum=max_backoff)
        self.database_backoff = Backoff(maximum=max_backoff)
        self.stats = ConsumerStats()
        self.stopping = False
        self.closed = False
        self._warned_no_queues = False

    # The loop -----------------------------------------------------------------------------------------------

    def run(self) -> None:
        install_tolerant_decoding()
        log.info(
            "consume_dlq starting on broker %s: batch %d / %.2f s, prefetch %d",
            self.broker_name,
            self.batch_size,
            self.batch_seconds,
            self.prefetch,
        )
        while not self.stopping:
            self.step()
            if self.idle_too_long():
                log.info("no dead letter for %.1f s; exiting", self.exit_when_idle)
                break
        self.shutdown()

    def step(self) -> None:
        """One round: be connected and consuming, take deliveries for a moment, write the batch when it is due."""
        self.heartbeat()
        try:
            if self.connection is None or not self.connection.is_open:
                self.connect()
            if self.clock() >= self.next_refresh:
                self.refresh_queues()
            self.collect()
            if self.resize:
                self.adjust_prefetch()
            self.poll()
            if self.may_submit():
                self.submit()
            elif self.writing:
                self.prepare()
        except BROKER_ERRORS as error:
            self.on_broker_error(error)
        except DatabaseError as error:
            self.on_database_error(error)
        except Exception:  # noqa: BLE001  (a bug must not turn into a crash loop that redelivers forever)
            delay = self.database_backoff.next_delay()
            log.exception("unexpected error; %d deliveries stay unacked; retrying in %.1f s", self.pending, delay)
            self.sleep(delay)

    def stop(self) -> None:
        """Ask the loop to finish: the current batch is written and acked, then the connection is closed."""
        self.stopping = True

    def idle_too_long(self) -> bool:
        if self.exit_when_idle is None or self.pending:
            return False
        return self.clock() - self.last_activity >= self.exit_when_idle

    @property
    def pending(self) -> int:
        """Deliveries received and not acked yet."""
        return len(self.buffer) + sum(len(flight.deliveries) for flight in self.flights)

    # Broker side ----------------------------------------------------------------------------------------------

    def connect(self) -> None:
        self.drop_connection()
        parameters = (
            registry.connection_parameters(self.broker)
            if self.broker is not None and not self.amqp_url
            else connection_parameters(self.amqp_url)
        )
        # Named so that an operator (or a test) can tell the consumers apart in the management UI.
        parameters.client_properties = {
            "connection_name": f"dlqconsole consume_dlq {socket.gethostname()}:{os.getpid()}"
        }
        self.connection = pika.BlockingConnection(parameters)
        self.next_refresh = 0.0
        if self.broker_backoff.failures:
            log.info("connected to broker %s again", self.broker_name)
        self.broker_backoff.reset()

    def where(self, queue: str) -> str:
        """A queue as the log names it: after its broker's name unless that is default."""
        return queue if self.broker_name == DEFAULT else f"{self.broker_name}/{queue}"

    def wanted_queues(self) -> list[str]:
        """--queues, else DLQ_QUEUES (on the broker `default`), else the DLQ of every enabled WatchedQueue of the
        broker (re-read on each refresh, so queues declared while we run are picked up)."""
        if self.fixed_queues:
            return self.fixed_queues
        if settings.DLQ_QUEUES and self.broker_name == DEFAULT:
            return list(settings.DLQ_QUEUES)
        close_old_connections()
        return list(
            WatchedQueue.objects.filter(enabled=True)
            .filter(**({"broker_id": self.broker_id} if self.broker_id else {"broker__name": DEFAULT}))
            .values_list("dead_letter_queue", flat=True)
        )

    def refresh_queues(self) -> None:
        assert self.connection is not None
        self.next_refresh = self.clock() + self.refresh_seconds
        wanted = self.wanted_queues()
        if not wanted and not self._warned_no_queues:
            log.warning(
                "broker %s: no dead-letter queues to consume: pass --queues, set DLQ_QUEUES or run declare_topology",
                self.broker_name,
            )
        self._warned_no_queues = not wanted
        added = [queue for queue in wanted if queue not in self.channels]
        for queue in added:
            self.start_consuming(queue)
        if added:
            # Each queue's share of the budget is smaller now.
            self.resize.update(
                queue for queue in self.channels if self.wanted_prefetch(queue) * 2 <= self.prefetch_of.get(queue, 0)
            )
        for queue in [queue for queue in self.channels if queue not in wanted]:
            log.info("queue %s is no longer watched; stopping its consumer", self.where(queue))
            self.retired.append(self.channels.pop(queue))
            self.retired[-1].basic_cancel(consumer_tag=f"consume_dlq:{queue}")
        if self.missing or not wanted:
            # A queue about to be declared (a service starting beside us), or the first watched queue about to be
            # recorded (declare_topology or the demo running as the console starts), is picked up within seconds.
            self.next_refresh = min(self.next_refresh, self.clock() + MISSING_RETRY_SECONDS)

    def start_consuming(self, queue: str) -> None:
        assert self.connection is not None
        channel = self.connection.channel()
        try:
            channel.queue_declare(queue=queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            # Most often 404: the queue was not declared yet. Not a reason to stop draining the others.
            if queue not in self.missing:
                log.warning(
                    "cannot consume %s: %s %s; retrying every %g s",
                    self.where(queue),
                    error.reply_code,
                    error.reply_text,
                    min(self.refresh_seconds, MISSING_RETRY_SECONDS),
                )
            self.missing.add(queue)
            return
        channel.add_on_cancel_callback(partial(self.on_cancelled, queue))
        self.channels[queue] = channel
        self.consume(queue, channel, self.wanted_prefetch(queue))
        if queue in self.missing:
            log.info("queue %s exists now; consuming it", self.where(queue))
            self.missing.discard(queue)
        else:
            log.info("consuming %s", self.where(queue))

    def consume(self, queue: str, channel: BlockingChannel, prefetch: int) -> None:
        channel.basic_qos(prefetch_count=prefetch)
        channel.basic_consume(
            queue=queue,
            on_message_callback=partial(self.on_message, queue),
            consumer_tag=f"consume_dlq:{queue}",
        )
        if queue in self.prefetch_of and prefetch < self.prefetch_of[queue]:
            self.prefetch_shrunk_at[queue] = self.clock()
        self.prefetch_of[queue] = prefetch

    def on_message(
        self, queue: str, channel: BlockingChannel, method: Any, properties: pika.BasicProperties, body: bytes
    ) -> None:
        if not self.buffer:
            self.batch_started_at = self.clock()
        self.buffer.append(Delivery(queue, channel, method.delivery_tag, properties, body, bool(method.redelivered)))
        size = len(body)
        self.held_bytes += size
        self.buffer_bytes += size
        self.last_activity = self.clock()
        first = queue not in self.largest
        if first or size > self.largest[queue]:
            self.largest[queue] = size
            # Larger bodies than the prefetch was set for: shrink it at once. The first delivery of a queue
            # replaces the size assumed until then, so it may grow it at once too (else growing waits, see collect).
            wanted, current = self.wanted_prefetch(queue), self.prefetch_of.get(queue, 0)
            if wanted * 2 <= current or (first and wanted >= 2 * current):
                self.resize.add(queue)

    def on_cancelled(self, queue: str, frame: Any) -> None:
        log.warning(
            "RabbitMQ cancelled the consumer of %s (queue deleted?); retrying every %g s",
            self.where(queue),
            min(self.refresh_seconds, MISSING_RETRY_SECONDS),
        )
        channel = self.channels.pop(queue, None)
        if channel is not None:
            self.retired.append(channel)
        self.missing.add(queue)

    def poll(self) -> None:
        assert self.connection is not None
        if self.full:
            self.read_while_full(self.connection)
            return
        now = self.clock()
        if self.writing:
            # Back soon to ack the batch being written.
            limit = min(self.poll_seconds, 0.01)
        elif now < self.retry_at:
            limit = min(self.poll_seconds, self.retry_at - now)
        elif self.buffer:
            remaining = self.batch_started_at + self.batch_seconds - self.clock()
            limit = max(0.0, min(self.poll_seconds, remaining))
        else:
            limit = self.poll_seconds
        self.connection.process_data_events(time_limit=limit)

    def on_broker_error(self, error: BaseException) -> None:
        self.stats.broker_errors += 1
        delay = self.broker_backoff.next_delay()
        log.warning(
            "broker %s: connection lost (%s: %s); %d unacked deliveries will be redelivered; reconnecting in %.1f s",
            self.broker_name,
            type(error).__name__,
            error,
            self.pending,
            delay,
        )
        self.abandon()
        self.drop_connection()
        self.sleep(delay)

    def abandon(self) -> None:
        """Forget every unacked delivery (the broker redelivers them). A batch being written is waited for:
        whether it commits or not, its copies come back and the dedupe key sorts them out."""
        for flight in self.flights:
            if flight.writing is not None:
                try:
                    flight.writing.result()
                except Exception:  # noqa: BLE001  (its deliveries are redelivered either way)
                    log.debug("an abandoned batch failed too", exc_info=True)
        self.flights = []
        self.buffer = []
        self.held_bytes = self.buffer_bytes = 0
        self.full_since = None
        self.retry_at = 0.0

    def drop_connection(self) -> None:
        connection, self.connection = self.connection, None
        self.channels = {}
        self.resize = set()
        self.retired = []
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except BROKER_ERRORS:
                log.debug("closing a broken connection failed", exc_info=True)

    # Helpers ----------------------------------------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Touch DLQ_CONSUMER_HEARTBEAT_FILE every few seconds while the loop turns (also while it waits out an
        outage): a container health check reads its age."""
        if self.clock() < self.next_heartbeat or not settings.DLQ_CONSUMER_HEARTBEAT_FILE:
            return
        self.next_heartbeat = self.clock() + HEARTBEAT_SECONDS
        try:
            Path(settings.DLQ_CONSUMER_HEARTBEAT_FILE).touch()
        except OSError as error:
            log.debug("cannot touch the heartbeat file: %s", error)

    def sleep(self, seconds: float) -> None:
        """Wait, servicing the AMQP connection (heartbeats) if there is one; returns early on stop()."""
        deadline = self.clock() + seconds
        while not self.stopping:
            self.heartbeat()
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            if self.connection is not None and self.connection.is_open:
                try:
                    if self.full:
                        self.read_while_full(self.connection)
                    else:
                        self.connection.process_data_events(time_limit=min(remaining, 0.2))
                except BROKER_ERRORS as error:
                    log.warning("broker %s: connection lost while waiting (%s)", self.broker_name, error)
                    self.abandon()
                    self.drop_connection()
            else:
                time.sleep(min(remaining, 0.2))

    def shutdown(self) -> None:
        """Write and ack what is received (one attempt), then close. Anything not acked is redelivered."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.connection is not None and self.connection.is_open:
                self.flush()
            else:
                self.abandon()
        except Exception as error:  # noqa: BLE001  (stopping anyway; nothing acked is lost)
            log.warning("could not write the last batch (%s); it will be redelivered", error)
            self.abandon()
        self.drop_connection()
        for writer in self.writers:
            if isinstance(writer, ThreadPoolExecutor):
                # A writer thread's database connection is its own to close.
                writer.submit(connections.close_all).result()
            writer.shutdown(wait=True)
        log.info(
            "consume_dlq stopped: %d received, %d new, %d duplicates in %d batches",
            self.stats.received,
            self.stats.inserted,
            self.stats.duplicates,
            self.stats.batches,
        )
