"""The run loop of an operation: claim it, work through its frozen items in chunks, record every outcome.

A chunk of a retry or move goes through three steps:
1. take: lock the chunk's items and dead letters, skip what changed since planning (or what another operation is
   publishing right now), mark the rest in flight and commit, so a worker killed from here on leaves a record;
2. publish: windowed confirms, paced by the shared rate limiter, with a heartbeat every couple of seconds that
   also notices a pause, a cancel or a new rate;
3. record: confirmed ones become published (dead letters replayed or moved), returned or refused ones failed,
   never-sent ones go back to pending; ones sent but unconfirmed (the connection died) stay in flight and are
   published again on the next take, counted as possible duplicates.

A dead letter keeps its status while its message is in flight: the in-flight item is the claim, checked under the
dead letter's row lock by every other operation's take. (Changing the status twice per message would double the
writes to the widest, most indexed table; see bench/replay.py.)

While an operation runs (outside a transaction) the work is pipelined over a third of a chunk at a time: the
main thread publishes batch N without waiting for its confirms (they come in while N+1 goes out), a reader thread
reads the batch after next (messages and all, no locks), a taker thread takes batch N+1 once the record of N-2 has
landed, and two recorder threads write outcomes as each batch's confirms are all in. Each thread has its own
database connection. At most PIPELINE_DEPTH batches, a chunk, are in flight at any moment. Inside a transaction
(tests wrapped in one) every step runs at once on the caller's connection; the steps are the same.

Only one worker runs an operation at a time: it claims the row with a conditional UPDATE and keeps a heartbeat;
the sweeper hands an operation whose heartbeat went stale to another worker.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import F, JSONField, Q, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.core import amqp, replay_guard
from dlqconsole.core.publish import (
    CONFIRMED,
    NACKED,
    NOT_SENT,
    RETURNED,
    UNCONFIRMED,
    UNSENDABLE,
    ConfirmedPublisher,
    Message,
    Outcome,
    PublishError,
)
from dlqconsole.core.ratelimit import Rate, RateLimiter, get_rate_limiter, parse_rate
from dlqconsole.deadletters.counters import CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.destinations import (
    Destination,
    check_destinations,
    move_destination,
    refused_destination,
    replay_properties,
    retry_destination,
)
from dlqconsole.operations.models import (
    ACTIVE_STATUSES,
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    OperationStatus,
    eligible_statuses,
)
from dlqconsole.operations.purged import record_purged

logger = logging.getLogger(__name__)

# Look for replays that came back at most this often (a query over recent arrivals).
RETURN_CHECK_SECONDS = 2.0
# A share of returns means little before this many replays.
RETURN_SHARE_MIN_SAMPLE = 20
# Broker or limiter failures in a row before the operation pauses.
CONNECTION_ATTEMPTS = 3
TICK_SECONDS = 2.0
# During a canary's wait, how often its messages are looked for in the dead-letter queues.
CANARY_LOOK_SECONDS = 2.0
# The rate limiter hands out the tokens due within this many seconds in one round trip. Tokens left over at the end
# of a batch carry over to the next, so a pause between batches shorter than this costs no rate; at the end of an
# operation they are wasted (a quarter of a second of its rate at most).
RESERVE_HORIZON = 0.25
RESERVE_AT_MOST = 1000
# Batches in flight at most while pipelining (one publishing, one taken ahead, the rest not yet recorded); a batch
# is this share of DLQ_OPERATION_CHUNK_SIZE, so the chunk still bounds what a killed worker can leave in flight.
PIPELINE_DEPTH = 3
RECORDERS = 2
LETTER_FIELDS = (
    "id",
    "source_queue",
    "pattern_id",
    "failure_reason",
    "status",
    "original_queue",
    "original_exchange",
    "original_routing_keys",
    "headers",
    "properties",
    "body",
    "replay_count",
    "body_truncated",
)
BUSY = "another operation is publishing it right now"
# A body over DLQ_MAX_BODY_BYTES was stored cut: what a replay would send is not the message that died.
CUT_BODY = "its body was cut at ingest (over DLQ_MAX_BODY_BYTES): a replay would send a different message"
# A dead letter whose publish fails becomes "failed" (waiting, retried by a policy) only when it was waiting: one
# already replayed or moved, sent again and refused, keeps its status; the failure is on the operation's item.
# Else a second replay that could not be routed would make a delivered message wait for redelivery.
FAILABLE_STATUSES = frozenset({DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED})
# The death headers as RabbitMQ 3.10 to 4.x writes them, left out of the headers read for a replay.
DEATH_HEADER_NAMES = frozenset(amqp.DEATH_HEADERS) | {
    f"{prefix}{part}" for prefix in amqp.DEATH_HEADER_PREFIXES for part in ("queue", "reason", "exchange")
}
REPLAY_HEADERS_SQL = f'{DeadLetter._meta.db_table}."headers" - %s::text[]'


@dataclass
class _Letter:
    """The columns of a dead letter that a replay needs (plain values: building model instances for thousands of
    rows a second costs more than publishing them)."""

    pk: int
    source_queue: str
    pattern_id: int
    failure_reason: str
    status: str
    original_queue: str
    original_exchange: str
    original_routing_keys: list[Any]
    headers: Any
    properties: Any
    body: bytes
    replay_count: int
    body_truncated: bool


@dataclass
class _Claimed:
    item_pk: int
    resumed: bool
    letter: _Letter
    destination: Destination


@dataclass
class _Read:
    """An item read ahead (no lock, nothing marked) with its dead letter's message (None if it is gone)."""

    item_pk: int
    # The item's status when read: pending, or in flight (a leftover to publish again).
    status: str
    letter: _Letter | None


@dataclass
class _Batch:
    """A published batch waiting for its outcomes; `landed` resolves once they are recorded."""

    claimed: list[_Claimed]
    outcomes: dict[Hashable, Outcome] = field(default_factory=dict)
    waiting: int = 0
    landed: Future[None] = field(default_factory=Future)


@dataclass
class _Take:
    """What a take claimed for publishing, and how many failed at once (a missing exchange) with which error."""

    claimed: list[_Claimed] = field(default_factory=list)
    failed: int = 0
    error: str = ""
    # The claimed ones' messages, built by the taker so the publishing thread only publishes.
    messages: list[Message] = field(default_factory=list)


class _Pacer:
    """Spaces publishes per destination by the shared rate limiter, reserving the tokens due shortly at once and
    spending them at their due times (kept as monotonic-clock deadlines)."""

    def __init__(self, limiter: RateLimiter, rate: Rate) -> None:
        self.limiter = limiter
        self.rate = rate
        self.tokens: dict[str, deque[float]] = defaultdict(deque)

    def delay_for(self, key: str) -> float:
        # Tokens that fell due during a pause are spent at once. They are few: at most what was reserved ahead,
        # a horizon's worth when the pause began and another primed at its start.
        tokens = self.tokens[key]
        if not tokens:
            wait = self._reserve(key)
            if wait:
                return wait
        delay = tokens[0] - time.monotonic()
        if delay > 0.0005:
            return delay
        tokens.popleft()
        return 0.0

    def prime(self, keys: set[str]) -> None:
        """Reserve ahead for these destinations now, between batches: the tokens falling due while the next batch
        is taken are spent as soon as it is ready, instead of the rate dropping for the length of the gap."""
        for key in keys:
            tokens = self.tokens[key]
            if not tokens or tokens[-1] < time.monotonic() + RESERVE_HORIZON:
                self._reserve(key)

    def _reserve(self, key: str) -> float:
        """Add the tokens due within the horizon; when none is, the seconds until asking again is worth it."""
        grant = self.limiter.reserve(key, self.rate, RESERVE_AT_MOST, horizon=RESERVE_HORIZON)
        if grant.count == 0:
            return max(0.001, grant.at + grant.due(0) - RESERVE_HORIZON - time.monotonic())
        self.tokens[key].extend(grant.at + grant.due(index) for index in range(grant.count))
        return 0.0


class _Lane:
    """Runs database steps in order: on a thread of their own (its own connection), or at once on the caller's."""

    def __init__(self, *, threaded: bool) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="operation-db") if threaded else None

    def submit(self, step: Callable[..., Any], *args: Any) -> Future[Any]:
        if self.executor is not None:
            return self.executor.submit(step, *args)
        future: Future[Any] = Future()
        try:
            future.set_result(step(*args))
        except Exception as error:  # noqa: BLE001  (raised again by result(), as with the thread)
            future.set_exception(error)
        return future

    def close(self) -> None:
        if self.executor is not None:
            self.executor.submit(connections.close_all).result()
            self.executor.shutdown()


class OperationRunner:
    """Runs one operation until it is done, paused, cancelled, waiting for its canary, or claimed elsewhere.

    `continue_later(seconds)` schedules another run (the Celery task passes one); without it the runner waits
    in process (the CLI's --inline).
    """

    def __init__(self, operation_id: int, *, continue_later: Callable[[float], None] | None = None) -> None:
        self.operation_id = operation_id
        self.continue_later = continue_later
        self.token = uuid.uuid4().hex
        self.publisher: ConfirmedPublisher | None = None
        self.destination_problems: dict[Destination, str] = {}
        self.failure_streak = 0
        self.connection_failures = 0
        self.rate_text: str | None = None
        self.pacer: _Pacer | None = None
        self.last_return_check = 0.0
        self.limiter: RateLimiter | None = None
        # Used by the database lane only: pending items are read by keyset from here, and items left in flight
        # (by a dead worker, or by a lost connection) are looked for first when this is set.
        self.cursor = 0
        self.look_for_in_flight = True
        self.cursor_lock = threading.Lock()
        self.new_status = DeadLetterStatus.REPLAYED
        # Confirmed in this run, counted as the confirms arrive (the recorded count lags a chunk behind).
        self.confirmed = 0
        self.succeeded_at_start = 0
        # Two database lanes: one reads batches ahead, the other records outcomes, both while the main thread
        # publishes.
        self.reader = _Lane(threaded=False)
        self.taker = _Lane(threaded=False)
        self.recorders = [_Lane(threaded=False)]
        self.batches = 0
        self.read_ahead: Future[list[_Read]] | None = None
        self.prefetched: Future[_Take | None] | None = None
        # Every published batch's `landed`, oldest first; and the batch each unconfirmed message belongs to.
        self.recording: list[Future[None]] = []
        self.unconfirmed: dict[Hashable, _Batch] = {}

    # The loop ------------------------------------------------------------------------------------------------

    def run(self) -> bool:
        """Run the operation if no live worker holds it; False when it was not ours to run."""
        if not self._claim():
            return False
        # A transaction around us (tests) would hide its rows from a second connection.
        threaded = not connection.in_atomic_block
        self.reader, self.taker = _Lane(threaded=threaded), _Lane(threaded=threaded)
        # Two recorders take turns: the update of the dead letters is the longest step, and two batches' updates
        # can run side by side (they meet only on the counters and the operation row, at their very end).
        self.recorders = [_Lane(threaded=threaded) for _ in range(RECORDERS if threaded else 1)]
        try:
            self._loop()
            self._settle()
        except Exception as error:
            logger.exception("operation %s stopped by an error", self.operation_id)
            self._pause(f"stopped by an error: {error!r}"[:2000], error=repr(error))
            try:
                self._settle()
            except Exception:  # noqa: BLE001  (what is left in flight is published again on resume, and counted)
                logger.exception("operation %s: could not give back its prefetched chunk", self.operation_id)
        finally:
            self._close_publisher()
            self.reader.close()
            self.taker.close()
            for recorder in self.recorders:
                recorder.close()
            Operation.objects.filter(pk=self.operation_id, runner=self.token).update(runner="")
        return True

    def _loop(self) -> None:
        kind, self.succeeded_at_start = (
            Operation.objects.filter(pk=self.operation_id).values_list("kind", "succeeded").get()
        )
        self.new_status = DeadLetterStatus.MOVED if kind == OperationKind.MOVE else DeadLetterStatus.REPLAYED
        while True:
            operation = Operation.objects.get(pk=self.operation_id)
            if operation.runner != self.token:
                return
            if operation.status == OperationStatus.CANCELLED:
                self._settle()
                finalize_cancelled(operation=operation)
                return
            if operation.status not in ACTIVE_STATUSES:
                return
            self._sync_rate(operation.rate)
            limit = self._chunk_size()
            running = operation.status == OperationStatus.RUNNING
            if not running:
                # The canary counts what is recorded: nothing may be pending in the lane.
                self._settle()
                operation.refresh_from_db()
                if operation.canary_until is not None:
                    if not self._canary_waited(operation):
                        return
                    continue
                limit = min(limit, operation.canary_size - operation.processed)
            if limit <= 0:
                found = False
            elif operation.publishes:
                found = self._publish_round(operation, limit, prefetch=running)
            else:
                found = self._change_round(operation, limit)
            if not found:
                self._settle()
                if not running and self._has_work():
                    self._start_canary_wait()
                    continue
                self._finish(operation)
                return
            self._check_returns(force=False)

    def _settle(self) -> None:
        """Wait for everything in flight: the confirms still due, a batch read ahead (forgotten: it is read again)
        and one taken ahead (given back: it was never sent), and every record."""
        self._drain()
        if self.prefetched is not None:
            take = self.prefetched.result()
            self.prefetched = None
            if take is not None and take.claimed:
                self._record_now(take.claimed, outcomes={}, publish_error="")
        if self.read_ahead is not None:
            reads = self.read_ahead.result()
            self.read_ahead = None
            if reads:
                with self.cursor_lock:
                    self.cursor = min(self.cursor, reads[0].item_pk - 1)
        self._wait_records()

    def _drain(self) -> None:
        """Collect the confirms of batches already published."""
        if not self.unconfirmed:
            return
        if self.publisher is not None and self.publisher.is_open:
            self._sort_outcomes(self.publisher.publish([], on_tick=self._heartbeat))
        # Whatever is still unaccounted for went out on a connection that is gone: it may or may not have arrived.
        lost = [Outcome(key, UNCONFIRMED, "the connection to RabbitMQ was lost") for key in list(self.unconfirmed)]
        self._sort_outcomes(lost)

    def _sort_outcomes(self, outcomes: list[Outcome]) -> None:
        """File outcomes under their batches; a batch with all of its outcomes goes to a recorder."""
        for outcome in outcomes:
            batch = self.unconfirmed.pop(outcome.key, None)
            if batch is None:
                continue
            batch.outcomes[outcome.key] = outcome
            batch.waiting -= 1
            if batch.waiting == 0:
                self.batches += 1
                recorder = self.recorders[self.batches % len(self.recorders)]
                future = recorder.submit(self._record, batch.claimed, batch.outcomes, "")
                future.add_done_callback(functools.partial(_land, batch.landed))

    def _wait_records(self) -> None:
        while self.recording:
            self.recording.pop(0).result()

    def _claim(self) -> bool:
        now = timezone.now()
        stale = now - dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS)
        return bool(
            Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES)
            .filter(Q(runner="") | Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True))
            .update(runner=self.token, heartbeat_at=now)
        )

    def _heartbeat(self) -> bool:
        """Keep the claim alive; False when the operation was paused, cancelled, finished or taken over."""
        if not Operation.objects.filter(pk=self.operation_id, runner=self.token).update(heartbeat_at=timezone.now()):
            return False
        status, rate = Operation.objects.filter(pk=self.operation_id).values_list("status", "rate").get()
        if status not in ACTIVE_STATUSES:
            return False
        self._sync_rate(rate)
        return True

    def _chunk_size(self) -> int:
        size = settings.DLQ_OPERATION_CHUNK_SIZE
        if self.pacer is not None:
            # Under a rate limit a chunk holds about two seconds of work: a kill then leaves little in flight.
            size = min(size, max(1, int(self.pacer.rate.per_second * 2)))
        return size

    def _sync_rate(self, text: str) -> None:
        if text == self.rate_text:
            return
        self.rate_text = text
        if not text:
            self.pacer = None
            return
        try:
            rate = parse_rate(text)
        except ValueError:
            logger.warning("operation %s has an unreadable rate %r; keeping the previous one", self.operation_id, text)
            return
        if self.limiter is None:
            self.limiter = get_rate_limiter()
        self.pacer = _Pacer(self.limiter, rate)

    def _next_items(self, limit: int, *, resume: bool = True) -> list[tuple[int, int, str]]:
        """(pk, dead letter id, status) of the next items: ones left in flight first (when there may be some),
        then pending ones after the cursor.

        `resume=False` while a chunk of this run is in flight (a prefetch): its items are in flight too, and must
        not be taken for leftovers."""
        items = OperationItem.objects.filter(operation_id=self.operation_id).order_by("pk")
        fields = ("pk", "dead_letter_id", "status")
        with self.cursor_lock:
            if resume and self.look_for_in_flight:
                rows = list(items.filter(status=ItemStatus.IN_FLIGHT).values_list(*fields)[:limit])
                if rows:
                    return rows
                self.look_for_in_flight = False
            rows = list(items.filter(status=ItemStatus.PENDING, pk__gt=self.cursor).values_list(*fields)[:limit])
            if rows:
                self.cursor = rows[-1][0]
        return rows

    def _has_work(self) -> bool:
        return OperationItem.objects.filter(
            operation_id=self.operation_id, status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT]
        ).exists()

    # Archive, restore, purge ---------------------------------------------------------------------------------

    def _change_round(self, operation: Operation, limit: int) -> bool:
        items = self._next_items(limit)
        if not items:
            return False
        self._change_items(operation, items)
        return True

    def _change_items(self, operation: Operation, items: list[tuple[int, int, str]]) -> None:
        now = timezone.now()
        allowed = eligible_statuses(operation.kind, operation.filter.get("status"))
        with transaction.atomic():
            locked = list(
                OperationItem.objects.select_for_update()
                .filter(pk__in=[item[0] for item in items], status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT])
                .values_list("pk", "dead_letter_id")
            )
            letters = {
                row[0]: CountedRow(*row[1:])
                # A purge deletes, so it takes the full lock; the others leave the key alone (see _take).
                for row in DeadLetter.objects.select_for_update(no_key=operation.kind != OperationKind.PURGE)
                .filter(pk__in=[dead_letter_id for _, dead_letter_id in locked])
                .order_by("pk")
                .values_list("pk", "source_queue", "pattern_id", "failure_reason", "status")
            }
            busy = busy_elsewhere(list(letters), operation_id=self.operation_id)
            done: list[int] = []
            letter_ids: list[int] = []
            skipped: dict[int, str] = {}
            for item_pk, dead_letter_id in locked:
                row = letters.get(dead_letter_id)
                if row is None:
                    skipped[item_pk] = "the dead letter no longer exists"
                elif dead_letter_id in busy:
                    skipped[item_pk] = BUSY
                elif row.status not in allowed:
                    skipped[item_pk] = f"its status is now {row.status}"
                else:
                    done.append(item_pk)
                    letter_ids.append(dead_letter_id)
            rows = [letters[pk] for pk in letter_ids]
            if operation.kind == OperationKind.PURGE:
                # What it deletes is recorded in the same transaction: a chunk leaves both, or (rolled back) neither.
                record_purged(operation=operation, dead_letter_ids=letter_ids)
                delete_dead_letters(ids=letter_ids)
                count_status_change(rows, to_status=None)
            else:
                new_status = (
                    DeadLetterStatus.ARCHIVED if operation.kind == OperationKind.ARCHIVE else DeadLetterStatus.PARKED
                )
                DeadLetter.objects.filter(pk__in=letter_ids).update(
                    status=new_status, status_changed_at=now, next_retry_at=None
                )
                count_status_change(rows, to_status=new_status)
            OperationItem.objects.filter(pk__in=done).update(status=ItemStatus.DONE, error="")
            _mark_items(skipped, status=ItemStatus.SKIPPED)
            Operation.objects.filter(pk=self.operation_id).update(
                succeeded=F("succeeded") + len(done), skipped=F("skipped") + len(skipped), heartbeat_at=now
            )

    # Retry, move, edit and retry -----------------------------------------------------------------------------

    def _publish_round(self, operation: Operation, limit: int, *, prefetch: bool) -> bool:
        """Publish one batch. With `prefetch` (a running operation) the next batch is taken while this one goes out,
        and confirms lag one batch behind (see the module docstring). False when nothing is left."""
        if prefetch:
            limit = max(1, limit // PIPELINE_DEPTH)
        ahead = self.prefetched is not None
        if self.prefetched is not None:
            take = self.prefetched.result()
            self.prefetched = None
        else:
            take = self._take_fresh(operation, limit)
        if take is None and ahead:
            # Takes ahead see pending items only: before calling it done, look once more for leftovers in flight
            # (from a worker that died, or from a lost connection).
            self._settle()
            with self.cursor_lock:
                self.look_for_in_flight = True
            take = self._take_fresh(operation, limit)
        if take is None:
            return False
        if prefetch:
            # The next batch is read a batch ahead (no locks) and taken once the record that leaves room has landed:
            # PIPELINE_DEPTH batches in flight at most, this one included.
            reads = self.read_ahead or self.reader.submit(self._read_next, limit, False)
            self.read_ahead = self.reader.submit(self._read_next, limit, False)
            # In flight then: this batch, the one taken ahead, and the newest PIPELINE_DEPTH - 2 unrecorded ones;
            # every older record must have landed (they may land out of order: two recorders).
            keep = PIPELINE_DEPTH - 2
            earlier = self.recording[: max(0, len(self.recording) - keep)]
            self.prefetched = self.taker.submit(self._take_read, operation, reads, earlier)
        if take.failed:
            self._count_failures(take.failed, take.error)
        if not take.claimed:
            return True
        try:
            publisher = self._open_publisher()
        except PublishError as error:
            self._record_now(take.claimed, outcomes={}, publish_error=str(error))
            self._settle()
            self._count_connection_failure(str(error))
            return True
        batch = _Batch(claimed=take.claimed, waiting=len(take.claimed))
        for entry in take.claimed:
            self.unconfirmed[entry.letter.pk] = batch
        # Let go of what has landed (raising here if a record failed), keeping memory flat.
        while self.recording and self.recording[0].done():
            self.recording.pop(0).result()
        self.recording.append(batch.landed)
        # Pipelining, the call returns once the batch is sent: its confirms arrive during the next one.
        outcomes = publisher.publish(
            take.messages,
            delay_for=self._delay_for(take.claimed),
            on_tick=self._heartbeat,
            wait_for_confirms=not prefetch,
        )
        if self.pacer is not None and not publisher.error:
            self.pacer.prime({entry.destination.limit_key for entry in take.claimed})
        lost = publisher.error or ("" if publisher.is_open else "the connection to RabbitMQ was lost")
        self._count_outcomes(outcomes)
        self._sort_outcomes(outcomes)
        if lost:
            # Nothing more goes out: let what is due come in, give back what was taken ahead, back off.
            self._settle()
            if not publisher.is_open:
                self._count_connection_failure(lost)
        return True

    def _take_fresh(self, operation: Operation, limit: int) -> _Take | None:
        """A take that may pick up leftovers in flight: only once every record has landed, when nothing of ours is."""
        self._settle()
        reads = self.reader.submit(self._read_next, limit, True).result()
        return self.taker.submit(self._take, operation, reads).result() if reads else None

    def _take_read(self, operation: Operation, reads: Future[list[_Read]], after: list[Future[None]]) -> _Take | None:
        """Take a batch read ahead, once the records `after` (up to the one that leaves room) have landed."""
        for record in after:
            record.result()
        batch = reads.result()
        return self._take(operation, batch) if batch else None

    def _messages(self, claimed: list[_Claimed]) -> list[Message]:
        return [
            Message(
                key=entry.letter.pk,
                exchange=entry.destination.exchange,
                routing_key=entry.destination.routing_key,
                body=bytes(entry.letter.body),
                properties=replay_properties(
                    stored_properties=entry.letter.properties,
                    stored_headers=entry.letter.headers,
                    dead_letter_id=entry.letter.pk,
                    replay_count=entry.letter.replay_count + 1,
                ),
            )
            for entry in claimed
        ]

    def _delay_for(self, claimed: list[_Claimed]) -> Callable[[Message], float] | None:
        pacer = self.pacer
        if pacer is None:
            return None
        keys: dict[Hashable, str] = {entry.letter.pk: entry.destination.limit_key for entry in claimed}

        def delay_for(message: Message) -> float:
            # The pacer of the moment: an operator may change (or lift) the rate while this chunk runs.
            current = self.pacer
            return 0.0 if current is None else current.delay_for(keys[message.key])

        return delay_for

    def _read_next(self, limit: int, resume: bool) -> list[_Read]:
        """The next items and their messages, read without locks: the wide read happens off the critical path."""
        items = self._next_items(limit, resume=resume)
        found = DeadLetter.objects.filter(pk__in=_ids([item[1] for item in items]))
        fields: tuple[str, ...] = LETTER_FIELDS
        if connection.vendor == "postgresql":
            # The broker's death headers (x-death is most of a dead letter's headers) are dropped by the replay
            # anyway: PostgreSQL leaves them out, so this thread does not decode them from JSON, thousands a
            # second. replay_properties still drops any it finds (other spellings, tagged tables).
            found = found.annotate(
                replay_headers=RawSQL(REPLAY_HEADERS_SQL, (sorted(DEATH_HEADER_NAMES),), output_field=JSONField())
            )
            fields = tuple("replay_headers" if name == "headers" else name for name in LETTER_FIELDS)
        letters = {row[0]: _Letter(*row) for row in found.values_list(*fields)}
        return [_Read(item_pk, status, letters.get(dead_letter_id)) for item_pk, dead_letter_id, status in items]

    def _take(self, operation: Operation, reads: list[_Read]) -> _Take:
        """Lock the batch, settle what cannot be published, mark the rest in flight; return the rest.

        Statuses are read again under the locks: what was read ahead may have changed since (the message itself
        never does)."""
        now = timezone.now()
        allowed = eligible_statuses(operation.kind, operation.filter.get("status"))
        with transaction.atomic():
            current = {
                row[0]: CountedRow(*row[1:])
                # FOR NO KEY UPDATE, in id order: ingest linking a boomerang to one of these (a foreign key check
                # takes KEY SHARE) neither waits for us nor deadlocks with us.
                for row in DeadLetter.objects.select_for_update(no_key=True)
                .filter(pk__in=_ids([read.letter.pk for read in reads if read.letter is not None]))
                .order_by("pk")
                .values_list("pk", "source_queue", "pattern_id", "failure_reason", "status")
            }
            busy = busy_elsewhere(list(current), operation_id=self.operation_id)
            skipped: dict[int, str] = {}
            candidates: list[_Claimed] = []
            for read in reads:
                letter = read.letter
                row = current.get(letter.pk) if letter is not None else None
                if letter is None or row is None:
                    skipped[read.item_pk] = "the dead letter no longer exists"
                    continue
                letter.source_queue, letter.pattern_id, letter.failure_reason, letter.status = row
                if letter.pk in busy:
                    skipped[read.item_pk] = BUSY
                elif letter.status not in allowed:
                    skipped[read.item_pk] = f"its status is now {letter.status}"
                elif (destination := self._destination(operation, letter)) is None:
                    skipped[read.item_pk] = "no known destination: no queue, exchange or routing key in its x-death"
                else:
                    candidates.append(_Claimed(read.item_pk, read.status == ItemStatus.IN_FLIGHT, letter, destination))
            problems = self._destination_problems({entry.destination for entry in candidates})
            reasons = {
                entry.item_pk: CUT_BODY
                if entry.letter.body_truncated
                else problems.get(entry.destination, "") or _routing_header_problem(entry)
                for entry in candidates
            }
            failed = [entry for entry in candidates if reasons[entry.item_pk]]
            claimed = [entry for entry in candidates if not reasons[entry.item_pk]]

            # Only items still as read are taken: pending ones (a cancel may have skipped some since the read, and
            # an item read twice is taken once), or leftovers still in flight.
            marked = _mark_in_flight([entry.item_pk for entry in claimed if not entry.resumed], was=ItemStatus.PENDING)
            marked |= _mark_in_flight([entry.item_pk for entry in claimed if entry.resumed], was=ItemStatus.IN_FLIGHT)
            claimed = [entry for entry in claimed if entry.item_pk in marked]
            waiting = [entry for entry in failed if entry.letter.status in FAILABLE_STATUSES]
            DeadLetter.objects.filter(pk__in=[entry.letter.pk for entry in waiting]).update(
                status=DeadLetterStatus.FAILED, status_changed_at=now, next_retry_at=None
            )
            count_status_change([_counted(entry.letter) for entry in waiting], to_status=DeadLetterStatus.FAILED)
            _mark_items(
                {entry.item_pk: reasons[entry.item_pk] for entry in failed},
                status=ItemStatus.FAILED,
                destinations={entry.item_pk: str(entry.destination) for entry in failed},
            )
            Operation.objects.filter(pk=self.operation_id).update(
                skipped=F("skipped") + _mark_items(skipped, status=ItemStatus.SKIPPED),
                failed=F("failed") + len(failed),
                in_flight=len(claimed),
                # Items published again after an uncertain publish may reach their queue twice: say so.
                duplicates=F("duplicates") + sum(entry.resumed for entry in claimed),
                heartbeat_at=now,
            )
        error = reasons[failed[-1].item_pk] if failed else ""
        return _Take(claimed=claimed, failed=len(failed), error=error, messages=self._messages(claimed))

    def _destination(self, operation: Operation, letter: _Letter) -> Destination | None:
        if operation.kind == OperationKind.MOVE:
            return move_destination(
                target_queue=operation.target_queue,
                target_exchange=operation.target_exchange,
                target_routing_key=operation.target_routing_key,
            )
        return retry_destination(
            exchange=letter.original_exchange, routing_keys=letter.original_routing_keys, queue=letter.original_queue
        )

    def _destination_problems(self, destinations: set[Destination]) -> dict[Destination, str]:
        """The console's own Celery queues (never a destination, whatever a dead letter says) and missing
        exchanges, checked once per run: publishing to one would close the channel for everybody.

        A missing queue is left to the broker: the message comes back (mandatory) and is marked failed.
        """
        unknown = {destination for destination in destinations if destination not in self.destination_problems}
        for destination in list(unknown):
            if refused := refused_destination(destination):
                self.destination_problems[destination] = refused
                unknown.discard(destination)
        if unknown:
            exchanges = {Destination(exchange=d.exchange, routing_key=d.routing_key) for d in unknown if d.exchange}
            try:
                found = check_destinations(exchanges) if exchanges else {}
            except Exception as error:  # noqa: BLE001  (the publisher will meet the same problem and report it)
                logger.warning("could not check destinations: %r", error)
                return {}
            for destination in unknown:
                bare = Destination(exchange=destination.exchange, routing_key=destination.routing_key)
                self.destination_problems[destination] = found.get(bare, "")
        return {destination: self.destination_problems[destination] for destination in destinations}

    def _record_now(self, claimed: list[_Claimed], *, outcomes: dict[Hashable, Outcome], publish_error: str) -> None:
        self.recorders[0].submit(self._record, claimed, outcomes, publish_error).result()

    def _record(self, claimed: list[_Claimed], outcomes: dict[Hashable, Outcome], publish_error: str) -> None:
        now = timezone.now()
        new_status = self.new_status
        rows: list[tuple[int, str, dt.datetime | None, str, str]] = []
        outcome_of: dict[int, str] = {}
        unsent: list[int] = []
        uncertain: list[int] = []
        last_error = ""
        for entry in claimed:
            outcome = outcomes.get(entry.letter.pk) or Outcome(entry.letter.pk, NOT_SENT, publish_error)
            moment = dt.datetime.fromtimestamp(outcome.published_at, tz=dt.UTC) if outcome.published_at else None
            if outcome.status == CONFIRMED:
                rows.append((entry.item_pk, ItemStatus.PUBLISHED, moment, str(entry.destination), ""))
                outcome_of[entry.letter.pk] = new_status
            elif outcome.status in (RETURNED, NACKED, UNSENDABLE):
                rows.append((entry.item_pk, ItemStatus.FAILED, moment, str(entry.destination), outcome.error[:2000]))
                outcome_of[entry.letter.pk] = DeadLetterStatus.FAILED
                last_error = outcome.error
            elif outcome.status == NOT_SENT:
                unsent.append(entry.item_pk)
            else:
                uncertain.append(entry.item_pk)
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # This commit need not wait for the disk: if PostgreSQL itself crashed before writing it, the items
                # would still be in flight (their take was committed durably) and would be published again and
                # counted as duplicates, as after a killed worker. The take is never relaxed like this.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit TO off")
            # The statuses and patterns as they are now (a policy may have scheduled one meanwhile, a merge moved
            # it to another pattern): the counters move from there.
            current = {
                row[0]: CountedRow(*row[1:])
                for row in DeadLetter.objects.select_for_update(no_key=True)
                .filter(pk__in=_ids(list(outcome_of)))
                .order_by("pk")
                .values_list("pk", "source_queue", "pattern_id", "failure_reason", "status")
            }
            _record_items(rows)
            for status in (new_status, DeadLetterStatus.FAILED):
                ids = [
                    pk
                    for pk, outcome in outcome_of.items()
                    if outcome == status
                    and pk in current
                    and (status != DeadLetterStatus.FAILED or current[pk].status in FAILABLE_STATUSES)
                ]
                if not ids:
                    continue
                changes: dict[str, Any] = {"status": status, "status_changed_at": now, "next_retry_at": None}
                if status == new_status:
                    changes["replay_count"] = F("replay_count") + 1
                DeadLetter.objects.filter(pk__in=_ids(ids)).update(**changes)
                count_status_change([current[pk] for pk in ids], to_status=status)
            # Never sent: back to pending, as if never taken.
            if unsent:
                OperationItem.objects.filter(pk__in=_ids(unsent)).update(
                    status=ItemStatus.PENDING, attempts=F("attempts") - 1
                )
            succeeded = sum(1 for outcome in outcome_of.values() if outcome == new_status)
            Operation.objects.filter(pk=self.operation_id).update(
                succeeded=F("succeeded") + succeeded,
                failed=F("failed") + len(outcome_of) - succeeded,
                in_flight=len(uncertain),
                last_error=(publish_error or last_error or F("last_error")),
                heartbeat_at=now,
            )
        with self.cursor_lock:
            if unsent:
                self.cursor = min(self.cursor, min(unsent) - 1)
            if uncertain:
                self.look_for_in_flight = True

    def _count_outcomes(self, outcomes: list[Outcome]) -> None:
        """The circuit breaker: returned or refused publishes in a row (in confirm order) pause the operation."""
        last_error = ""
        for outcome in outcomes:
            if outcome.status == CONFIRMED:
                self.confirmed += 1
                self.failure_streak = 0
                self.connection_failures = 0
            elif outcome.status in (RETURNED, NACKED, UNSENDABLE):
                self.failure_streak += 1
                last_error = outcome.error
        if last_error:
            self._count_failures(0, last_error)

    def _count_failures(self, count: int, error: str) -> None:
        self.failure_streak += count
        if self.failure_streak >= settings.DLQ_OPERATION_BREAKER_FAILURES:
            self._pause(f"publishing keeps failing: {self.failure_streak} failures in a row; the last: {error}")

    def _count_connection_failure(self, error: str) -> None:
        self._close_publisher()
        self.destination_problems.clear()
        self.connection_failures += 1
        if self.connection_failures >= CONNECTION_ATTEMPTS:
            self._pause(f"cannot publish: {error}")
            return
        time.sleep(min(2.0**self.connection_failures, 10.0))

    def _open_publisher(self) -> ConfirmedPublisher:
        if self.publisher is None or not self.publisher.is_open:
            self._close_publisher()
            publisher = ConfirmedPublisher(
                amqp.connection_parameters(),
                key_header=settings.DLQ_REPLAYED_FROM_HEADER,
                window=settings.DLQ_PUBLISH_WINDOW,
            )
            publisher.open()
            self.publisher = publisher
        return self.publisher

    def _close_publisher(self) -> None:
        if self.publisher is not None:
            try:
                self.publisher.close()
            except Exception:  # noqa: BLE001  (closing a broken connection must not hide the real problem)
                logger.debug("closing the publisher failed", exc_info=True)
            self.publisher = None

    # Canary, returns, pausing, finishing ---------------------------------------------------------------------

    def _start_canary_wait(self) -> None:
        operation = Operation.objects.get(pk=self.operation_id)
        until = timezone.now() + dt.timedelta(seconds=operation.canary_wait_seconds)
        Operation.objects.filter(pk=self.operation_id, runner=self.token).update(canary_until=until)

    def _canary_waited(self, operation: Operation) -> bool:
        """Judge the canary: failed as soon as one of its messages comes back (or could not be published),
        passed once its wait is over without that. False when the runner should stop for now.

        A resume after a pause during the wait comes back here: the watch goes on until `canary_until`, and a
        pause that outlasted it leaves the canary judged at once."""
        assert operation.canary_until is not None
        returned = self._check_returns(force=True)
        if returned or operation.failed:
            parts = []
            if returned:
                parts.append(f"{returned} came back to a dead-letter queue within {operation.canary_wait_seconds}s")
            if operation.failed:
                parts.append(f"{operation.failed} could not be published ({operation.last_error})")
            self._pause(f"canary of {operation.canary_size}: " + "; ".join(parts), canary_failed=True)
            return True
        remaining = (operation.canary_until - timezone.now()).total_seconds()
        if remaining > 0:
            # Look again soon: a canary that comes back stops the operation then, not at the end of the wait.
            if self.continue_later is not None:
                self.continue_later(min(remaining, CANARY_LOOK_SECONDS))
                return False
            time.sleep(min(remaining, TICK_SECONDS, CANARY_LOOK_SECONDS))
            return self._heartbeat()
        Operation.objects.filter(pk=self.operation_id, status=OperationStatus.CANARY).update(
            status=OperationStatus.RUNNING, canary_passed=True
        )
        return True

    def _check_returns(self, *, force: bool, may_pause: bool = True) -> int:
        """Count our replays that died again (linked by ingest through `previous`), each once; pause on too many."""
        if not force and time.monotonic() - self.last_return_check < RETURN_CHECK_SECONDS:
            return 0
        self.last_return_check = time.monotonic()
        operation = Operation.objects.get(pk=self.operation_id)
        if not operation.publishes or operation.started_at is None:
            return 0
        returned = count_returned(operation=operation)
        Operation.objects.filter(pk=self.operation_id).update(returned=returned)
        published = max(operation.succeeded, self.succeeded_at_start + self.confirmed) - operation.succeeded_baseline
        fresh = returned - operation.returned_baseline
        if (
            may_pause
            and operation.status == OperationStatus.RUNNING
            and published >= RETURN_SHARE_MIN_SAMPLE
            and fresh > operation.max_return_share * published
        ):
            self._pause(
                f"{fresh} of {published} replayed messages came back to a dead-letter queue "
                f"(more than {operation.max_return_share:.0%})"
            )
        return returned

    def _pause(self, reason: str, *, error: str = "", canary_failed: bool = False) -> None:
        paused = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES).update(
            status=OperationStatus.PAUSED,
            pause_reason=reason[:2000],
            paused_automatically=True,
            last_error=error or reason[:2000],
            **({"canary_failed": True} if canary_failed else {}),
        )
        if paused:
            logger.warning("operation %s paused: %s", self.operation_id, reason)
            record_audit(actor=None, action="operation.pause", target=f"operation:{self.operation_id}", detail=reason)

    def _finish(self, operation: Operation) -> None:
        now = timezone.now()
        if operation.publishes:
            self._check_returns(force=True, may_pause=False)
        finished = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES, runner=self.token).update(
            status=OperationStatus.DONE, finished_at=now, in_flight=0, heartbeat_at=now
        )
        if finished:
            operation.refresh_from_db()
            record_audit(
                actor=None,
                action=f"operation.{operation.kind}.done",
                target=f"operation:{operation.pk}",
                filter=operation.filter,
                count=operation.succeeded,
                detail=f"succeeded {operation.succeeded}, failed {operation.failed}, skipped {operation.skipped}",
            )


def _routing_header_problem(entry: _Claimed) -> str:
    """Why the CC or BCC header of a dead letter keeps it from being replayed ("" when it has none or they pass)."""
    headers = entry.letter.headers
    if not isinstance(headers, dict) or not ("CC" in headers or "BCC" in headers):
        return ""
    refused = replay_guard.header_refusal(entry.destination.exchange, headers)
    return f"refused: {refused}" if refused else ""


def _land(target: Future[None], source: Future[None]) -> None:
    """Pass a record's result on to its batch's `landed`."""
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(None)


def _ids(ids: list[int]) -> Any:
    """A value for `pk__in`: on PostgreSQL one array parameter rather than a placeholder per id. psycopg parses
    every placeholder of a statement on the client, which at a thousand ids costs more than running it."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", (_pg_array(ids),))
    return list(ids)


def _pg_array(values: list[Any]) -> str:
    """A PostgreSQL array literal, built here because psycopg dumps Python lists element by element in Python."""
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
        elif isinstance(value, int):
            items.append(str(value))
        else:
            text = value.isoformat() if isinstance(value, dt.datetime) else str(value)
            items.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(items) + "}"


def _counted(letter: _Letter) -> CountedRow:
    return CountedRow(letter.source_queue, letter.pattern_id, letter.failure_reason, letter.status)


def busy_elsewhere(dead_letter_ids: list[int], *, operation_id: int) -> set[int]:
    """Dead letters another operation has in flight. Call it holding their row locks: a take that committed before
    we got them is visible, and none can commit while we hold them."""
    return set(
        OperationItem.objects.filter(dead_letter_id__in=_ids(dead_letter_ids), status=ItemStatus.IN_FLIGHT)
        .exclude(operation_id=operation_id)
        .values_list("dead_letter_id", flat=True)
    )


def count_returned(*, operation: Operation) -> int:
    """Dead letters of this operation that came back after their replay (each counted once)."""
    if operation.started_at is None:
        return 0
    # Boomerangs are new arrivals linked to an earlier record: few, and the (status, ingested_at) index finds them
    # among what arrived since the start without touching the operation's (possibly huge) item list.
    came_back = set(
        DeadLetter.objects.filter(
            status__in=[DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED],
            ingested_at__gte=operation.started_at,
            previous__isnull=False,
        ).values_list("previous_id", flat=True)
    )
    if not came_back:
        return 0
    # In flight counts too: one that came back was published, even if its confirm is not recorded yet.
    return OperationItem.objects.filter(
        operation=operation,
        dead_letter_id__in=_ids(sorted(pk for pk in came_back if pk is not None)),
        status__in=[ItemStatus.PUBLISHED, ItemStatus.IN_FLIGHT],
    ).count()


def finalize_cancelled(*, operation: Operation) -> None:
    """Settle what a cancelled operation left: pending items and in-flight ones never confirmed are skipped (their
    dead letters never changed). Only call it when no worker is publishing the operation."""
    now = timezone.now()
    with transaction.atomic():
        pending = OperationItem.objects.filter(operation=operation, status=ItemStatus.PENDING).update(
            status=ItemStatus.SKIPPED, error="cancelled"
        )
        in_flight = OperationItem.objects.filter(operation=operation, status=ItemStatus.IN_FLIGHT).update(
            status=ItemStatus.SKIPPED, error="cancelled; it may have been published before its worker stopped"
        )
        Operation.objects.filter(pk=operation.pk).update(
            skipped=F("skipped") + pending + in_flight,
            in_flight=0,
            finished_at=Coalesce("finished_at", Value(now)),
        )


def delete_dead_letters(*, ids: list[int]) -> None:
    """Delete dead letters for good (the caller adjusts the counters). Links to them are cleared; operation items
    keep the id as the record of what was deleted."""
    if not ids:
        return
    DeadLetter.objects.filter(previous_id__in=ids).update(previous=None)
    DeadLetter.objects.filter(edited_from_id__in=ids).update(edited_from=None)
    table = connection.ops.quote_name(DeadLetter._meta.db_table)
    with connection.cursor() as cursor:
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            cursor.execute(f"DELETE FROM {table} WHERE id IN ({', '.join(['%s'] * len(chunk))})", chunk)


def _record_items(rows: list[tuple[int, str, dt.datetime | None, str, str]]) -> None:
    """Write (pk, status, published_at, destination, error) of many items, a statement per thousand.

    Each item has its own publish time, so one UPDATE per value will not do, and Django's bulk_update builds a
    CASE per column with a branch per row, which costs seconds per thousand rows. UPDATE ... FROM a VALUES list
    does the same in milliseconds (PostgreSQL, and SQLite 3.33 or newer).
    """
    table = connection.ops.quote_name(OperationItem._meta.db_table)
    if connection.vendor == "postgresql" and rows:
        # Five array parameters instead of five placeholders per row (see _ids).
        columns = [_pg_array(list(column)) for column in zip(*rows, strict=True)]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET status = changed.status, published_at = changed.published_at, "
                "destination = changed.destination, error = changed.error "
                "FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::text[], %s::text[]) "
                f"AS changed (id, status, published_at, destination, error) WHERE {table}.id = changed.id",
                columns,
            )
        return
    for start in range(0, len(rows), 1000):
        chunk = rows[start : start + 1000]
        params: list[Any] = []
        for pk, status, published_at, destination, error in chunk:
            params += [pk, status, connection.ops.adapt_datetimefield_value(published_at), destination, error]
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH changed (id, status, published_at, destination, error) AS (VALUES {values}) "
                f"UPDATE {table} SET status = changed.status, published_at = changed.published_at, "
                f"destination = changed.destination, error = changed.error FROM changed WHERE {table}.id = changed.id",
                params,
            )


def _mark_items(errors: dict[int, str], *, status: str, destinations: dict[int, str] | None = None) -> int:
    """Set items still open to `status` with their own error text (grouped, since most share one); how many."""
    grouped: dict[tuple[str, str], list[int]] = defaultdict(list)
    for pk, error in errors.items():
        grouped[(error[:2000], (destinations or {}).get(pk, ""))].append(pk)
    changed = 0
    for (error, destination), pks in grouped.items():
        changed += OperationItem.objects.filter(
            pk__in=_ids(pks), status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT]
        ).update(status=status, error=error, destination=destination)
    return changed


def _mark_in_flight(pks: list[int], *, was: str) -> set[int]:
    """Mark items in flight (one more attempt) if their status is still `was`; the ones marked."""
    if not pks:
        return set()
    table = connection.ops.quote_name(OperationItem._meta.db_table)
    params: list[Any]
    if connection.vendor == "postgresql":
        where, params = "id IN (SELECT unnest(%s::bigint[]))", [_pg_array(pks)]
    else:
        where, params = f"id IN ({', '.join(['%s'] * len(pks))})", list(pks)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET status = %s, attempts = attempts + 1 WHERE {where} AND status = %s RETURNING id",
            [ItemStatus.IN_FLIGHT, *params, was],
        )
        return {row[0] for row in cursor.fetchall()}


def run_operation(*, operation_id: int, continue_later: Callable[[float], None] | None = None) -> bool:
    """Run an operation in this process until it is done, paused or waiting; False if another worker holds it."""
    return OperationRunner(operation_id, continue_later=continue_later).run()
