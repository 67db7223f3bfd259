"""What consume_dlq's writer runs: store a batch of deliveries, in one transaction if the database takes it.

A batch that the database refuses for its content (a value it cannot store) is written message by message, and a
message that still fails is stored in a reduced form with the error in its parse_errors, so one bad message
neither blocks the queue nor gets lost. An outage is not split: the batch is written again later, whole.

On PostgreSQL the writer is a thread of its own; elsewhere InlineExecutor runs each batch in the loop.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import pika
from django.db import (
    DatabaseError,
    InterfaceError,
    InternalError,
    OperationalError,
    ProgrammingError,
    close_old_connections,
)
from django.db import connection as db_connection
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.ingest.envelope import ParsedDeadLetter
from dlqconsole.ingest.services import IngestResult, ingest_batch

# consume_dlq logs under the consumer's name, whichever of its modules a step lives in, so that one logger
# configures (and filters) all of it.
log = logging.getLogger("dlqconsole.ingest.consumer")

# The database is gone, restarting, not migrated or the connection is broken: retry the whole batch later.
# Any other error while writing a batch (the database refused a value, or a bug met an odd message) would
# fail the same way again, so the batch is split to find and reduce the culprit.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, InternalError, ProgrammingError)


@dataclass
class Delivery:
    """A message received and not acked yet: in the consumer's buffer, then in a batch. `letter` is its parsed
    form, once submit() or prepare() has parsed it."""

    queue: str
    channel: BlockingChannel
    delivery_tag: int
    properties: pika.BasicProperties
    body: bytes
    redelivered: bool = False
    letter: ParsedDeadLetter | None = None


@dataclass(frozen=True)
class WriteResult:
    result: IngestResult
    # Messages stored reduced because the database refused them as parsed.
    reduced: int


def write_batch(batch: list[Delivery]) -> WriteResult:
    """Store a batch (runs in the writer thread when pipelined). Raises DatabaseError on an outage."""
    close_old_connections()
    now = timezone.now()
    letters = [delivery.letter for delivery in batch if delivery.letter is not None]
    try:
        try:
            return WriteResult(ingest_batch(letters=letters, now=now), reduced=0)
        except OUTAGE_ERRORS:
            raise
        except Exception as error:  # noqa: BLE001  (isolate the message that causes it)
            log.warning("the database refused a batch of %d (%s); writing it message by message", len(batch), error)
            return write_one_by_one(batch, now=now)
    except DatabaseError:
        # A connection that failed mid-transaction is unusable (this thread's own); the next batch opens one.
        try:
            db_connection.close()
        except DatabaseError:
            log.debug("closing the broken database connection failed", exc_info=True)
        raise


def write_one_by_one(batch: list[Delivery], *, now: Any) -> WriteResult:
    received = inserted = reduced = 0
    for delivery in batch:
        assert delivery.letter is not None
        try:
            result = ingest_batch(letters=[delivery.letter], now=now)
        except OUTAGE_ERRORS:
            raise
        except Exception as error:  # noqa: BLE001  (store the message reduced rather than lose or block it)
            log.error(
                "a dead letter from %s (delivery %d) could not be stored as parsed (%s: %s); storing it reduced",
                delivery.queue,
                delivery.delivery_tag,
                type(error).__name__,
                error,
            )
            reduced += 1
            delivery.letter = reduced_letter(delivery.letter, error)
            # If even the reduced form fails, this raises: the batch stays unacked and is retried later.
            result = ingest_batch(letters=[delivery.letter], now=now)
        received += result.received
        inserted += result.inserted
    return WriteResult(IngestResult(received=received, inserted=inserted), reduced=reduced)


def reduced_letter(letter: ParsedDeadLetter, error: BaseException) -> ParsedDeadLetter:
    """The letter with everything but its identity, queue, body and raw headers set aside, for a message the
    database refused as parsed. The error goes into parse_errors so the operator sees why."""
    return replace(
        letter,
        original_queue="",
        original_exchange="",
        original_routing_keys=[],
        error_type="",
        error_message="",
        stack_trace="",
        host="",
        app_version="",
        message_id="",
        correlation_id="",
        content_type="",
        content_encoding="",
        task_name="",
        task_id="",
        task_retries=None,
        priority=None,
        replayed_from=None,
        headers={"$bytes": ""} if not letter.headers_json else {"$str": _b64(letter.headers_json)},
        headers_json="",
        properties={"$str": _b64(letter.properties_json)} if letter.properties_json else {},
        properties_json="",
        x_death=[],
        parse_errors=[*letter.parse_errors, f"the database refused the parsed fields: {error}"[:1000]],
    )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()


class InlineExecutor:
    """The writer without a thread: runs each batch at once (SQLite, where one writer is all there is)."""

    def submit(self, function: Callable[..., Any], /, *arguments: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(function(*arguments))
        except BaseException as error:  # noqa: BLE001  (delivered to the caller through the future)
            future.set_exception(error)
        return future

    def shutdown(self, *, wait: bool = True) -> None:
        return None
