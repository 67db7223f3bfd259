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

Each message goes back to its destination's broker (a retry's is the broker its dead letter came from), through a
publisher per broker: a batch spanning two brokers goes out through both, and each publisher's confirms are all in
by the end of the next batch, as with one. A broker that cannot be reached holds back only its own messages (see
run_state.py).

Each destination has a circuit breaker shared by every worker (breaking.py): while it is open, its messages are held
back like those of a broker that cannot be reached, the others go on, and when nothing else is left the run stops and
its task comes back when the breaker probes, holding no worker meanwhile.

The loop and the publishing are here; each step has a module of its own beside this one, a part of OperationRunner
built on the state of run_state.py: taking.py, recording.py, breaking.py (the circuit breakers), canary.py (the
canary, the returns, finishing) and changes.py (archive, restore, purge). pipeline.py holds what passes between the
steps and the lanes that run them, pacing.py the pacer, item_sql.py the SQL over many items at once.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from dlqconsole.core.publish import NOT_SENT, UNCONFIRMED, Message, Outcome, PublishError
from dlqconsole.deadletters.models import DeadLetterStatus
from dlqconsole.operations.breaking import BreakerSteps
from dlqconsole.operations.canary import CanarySteps
from dlqconsole.operations.changes import ChangeSteps
from dlqconsole.operations.item_sql import finalize_cancelled
from dlqconsole.operations.models import (
    ACTIVE_STATUSES,
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    OperationStatus,
)
from dlqconsole.operations.pipeline import HELD, Batch, Claimed, Lane, Read, Take, land
from dlqconsole.operations.recording import RecordSteps
from dlqconsole.operations.shedding import run_shed
from dlqconsole.operations.taking import TakeSteps

logger = logging.getLogger(__name__)

# Batches in flight at most while pipelining (one publishing, one taken ahead, the rest not yet recorded); a batch
# is this share of DLQ_OPERATION_CHUNK_SIZE, so the chunk still bounds what a killed worker can leave in flight.
PIPELINE_DEPTH = 3
RECORDERS = 2
# While waiting for a broker to be tried again, the longest sleep between two heartbeats.
WAIT_TICK_SECONDS = 1.0


class OperationRunner(TakeSteps, RecordSteps, BreakerSteps, CanarySteps, ChangeSteps):
    """Runs one operation until it is done, paused, cancelled, waiting for its canary, or claimed elsewhere.

    `continue_later(seconds)` schedules another run (the Celery task passes one); without it the runner waits
    in process (the CLI's --inline).
    """

    # The loop ------------------------------------------------------------------------------------------------

    def run(self) -> bool:
        """Run the operation if no live worker holds it; False when it was not ours to run."""
        if not self._claim():
            return False
        # A transaction around us (tests) would hide its rows from a second connection.
        threaded = not connection.in_atomic_block
        self.reader, self.taker = Lane(threaded=threaded), Lane(threaded=threaded)
        # Two recorders take turns: the update of the dead letters is the longest step, and two batches' updates
        # can run side by side (they meet only on the counters and the operation row, at their very end).
        self.recorders = [Lane(threaded=threaded) for _ in range(RECORDERS if threaded else 1)]
        try:
            self.brokers.load()
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
            self._close_publishers()
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
            if self.suspended:
                return
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
        for publisher in list(self.publishers.values()):
            if publisher.is_open and publisher.unconfirmed:
                self._sort_outcomes(publisher.publish([], on_tick=self._heartbeat))
        # Whatever is still unaccounted for went out on a connection that is gone: it may or may not have arrived.
        lost = [Outcome(key, UNCONFIRMED, "the connection to RabbitMQ was lost") for key in list(self.unconfirmed)]
        self._sort_outcomes(lost)

    def _sort_outcomes(self, outcomes: list[Outcome]) -> None:
        """File outcomes under their batches; a batch with all of its outcomes goes to a recorder. Each
        destination's breaker hears of them first."""
        self._report_outcomes(outcomes)
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
                future.add_done_callback(functools.partial(land, batch.landed))

    def _wait_records(self) -> None:
        while self.recording:
            self.recording.pop(0).result()

    def _claim(self) -> bool:
        now = timezone.now()
        stale = now - dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS)
        claimable = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES)
        if self.continue_later is not None:
            # Waiting for a breaker, a task that comes well before the wait is over is a stray: the one scheduled
            # for the end of the wait comes then.
            claimable = claimable.exclude(breaker_wait_until__gt=self._claimable_after(now))
        return bool(
            claimable.filter(Q(runner="") | Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True)).update(
                # A wait for a breaker is over once the run looks again (it says so again if it must wait).
                runner=self.token,
                heartbeat_at=now,
                breaker_wait="",
                breaker_wait_until=None,
            )
        )

    def _chunk_size(self) -> int:
        size = settings.DLQ_OPERATION_CHUNK_SIZE
        if self.pacer is not None:
            # Under a rate limit a chunk holds about two seconds of work: a kill then leaves little in flight.
            size = min(size, max(1, int(self.pacer.rate.per_second * 2)))
        return size

    def _has_work(self) -> bool:
        return OperationItem.objects.filter(
            operation_id=self.operation_id, status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT]
        ).exists()

    # Retry, move, edit and retry -----------------------------------------------------------------------------

    def _publish_round(self, operation: Operation, limit: int, *, prefetch: bool) -> bool:
        """Publish one batch. With `prefetch` (a running operation) the next batch is taken while this one goes out,
        and confirms lag one batch behind (see the module docstring). False when nothing is left."""
        if prefetch:
            limit = max(1, limit // PIPELINE_DEPTH)
        self._close_publishers(idle_only=True)
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
            if self.held_back:
                return self._retry_held_back()
            return self._wait_for_breakers() if self.breaker_held else False
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
        if not take.claimed:
            return True
        batch = Batch(claimed=take.claimed, waiting=len(take.claimed))
        for entry in take.claimed:
            self.unconfirmed[entry.letter.pk] = batch
        # Let go of what has landed (raising here if a record failed), keeping memory flat.
        while self.recording and self.recording[0].done():
            self.recording.pop(0).result()
        self.recording.append(batch.landed)
        self._publish_batch(take, prefetch=prefetch)
        return True

    def _publish_batch(self, take: Take, *, prefetch: bool) -> None:
        """Publish a taken batch, each message through the publisher of its destination's broker; hold back the
        messages of a broker that cannot be reached now. Pipelining, each call returns once its messages are sent:
        their confirms arrive during the next batch."""
        broker_of: dict[Hashable, str] = {entry.letter.pk: entry.destination.broker for entry in take.claimed}
        groups: dict[str, list[Message]] = {}
        for message in self._gate(take.claimed, take.messages):
            groups.setdefault(broker_of[message.key], []).append(message)
        delay_for = self._delay_for(take.claimed)
        held: dict[str, list[Message]] = {}
        published, stopped, lost_any = False, "", False
        for name, messages in groups.items():
            if stopped:
                self._sort_outcomes([Outcome(message.key, NOT_SENT, stopped) for message in messages])
                continue
            down = self._broker_down(name)
            if not down:
                try:
                    publisher = self._open_publisher(name)
                except PublishError as error:
                    self._broker_failed(name, str(error))
                    down = self.broker_errors[name]
            if down:
                held[name] = messages
                continue
            outcomes = publisher.publish(
                messages, delay_for=delay_for, on_tick=self._heartbeat, wait_for_confirms=not prefetch
            )
            published = True
            self._count_outcomes(outcomes, broker=name)
            self._sort_outcomes(outcomes)
            if not publisher.is_open:
                self._broker_failed(name, publisher.error or "the connection to RabbitMQ was lost")
                lost_any = True
            elif publisher.error:
                # Halted (a pause, a cancel, the rate limiter failing): nothing more goes out in this batch.
                stopped = publisher.error
        # The confirms still due on brokers this batch did not go to: every batch's are in by the end of the next.
        for name, publisher in list(self.publishers.items()):
            if name not in groups and publisher.is_open and publisher.unconfirmed:
                self._sort_outcomes(publisher.publish([], on_tick=self._heartbeat))
        if held:
            self._hold(held, progressed=published)
        if stopped or lost_any:
            # Nothing more goes out for now: let what is due come in and give back what was taken ahead.
            self._settle()
        elif self.pacer is not None and not held:
            self.pacer.prime({entry.destination.limit_key for entry in take.claimed})

    # Brokers that cannot be reached ---------------------------------------------------------------------------

    def _hold(self, held: dict[str, list[Message]], *, progressed: bool) -> None:
        """The messages of brokers that cannot be reached now. When others went out in this batch, they are passed
        over (pending, behind the cursor) until the end, and tried again then. When none did, the run waits for
        the first of those brokers to be tried again and reads them again; once each of those brokers has been
        given up, it passes over their messages to the next one for a broker it can reach."""
        waiting = [name for name in held if not self._given_up(name)]
        if progressed or not waiting:
            for name, messages in held.items():
                self._sort_outcomes([Outcome(message.key, HELD, self.broker_errors[name]) for message in messages])
            self.held_back.update(held)
            if not progressed:
                self._settle()
                self._skip_to_reachable()
            return
        self._sort_outcomes(
            [
                Outcome(message.key, NOT_SENT, self.broker_errors[name])
                for name, messages in held.items()
                for message in messages
            ]
        )
        self._settle()
        self._wait_for_brokers(waiting)

    def _wait_for_brokers(self, names: list[str]) -> bool:
        """Wait, keeping the heartbeat, until the first of these brokers may be tried again; False when the
        operation was paused, cancelled or taken over meanwhile."""
        until = min(self.retry_at.get(name, 0.0) for name in names)
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, WAIT_TICK_SECONDS))
            if not self._heartbeat():
                return False
        return True

    def _skip_to_reachable(self) -> None:
        """Move the cursor to just before the next pending item for a broker that has not been given up (its
        brokers' items wait behind it), or past the last one when there is none."""
        given_up = [name for name in self.connection_failures if self._given_up(name)]
        target_id = Operation.objects.filter(pk=self.operation_id).values_list("target_broker_id", flat=True).get()
        pending = OperationItem.objects.filter(operation_id=self.operation_id, status=ItemStatus.PENDING)
        with self.cursor_lock:
            after = pending.filter(pk__gt=self.cursor).order_by("pk")
            if target_id is None:
                ids = [self.brokers.named(name).pk for name in given_up]
                reachable = after.exclude(dead_letter__broker_id__in=ids).values_list("pk", flat=True).first()
            else:
                reachable = None if self.brokers.name(target_id) in given_up else self.cursor + 1
            if reachable is not None:
                self.cursor = max(self.cursor, reachable - 1)
            else:
                self.cursor = max(self.cursor, pending.order_by("-pk").values_list("pk", flat=True).first() or 0)

    def _retry_held_back(self) -> bool:
        """Everything else is done: read the held-back messages again once one of their brokers may be tried again;
        pause, naming the brokers, when each has been given up (their messages stay pending for a resume)."""
        self._settle()
        waiting = [name for name in self.held_back if not self._given_up(name)]
        if not waiting:
            pending = OperationItem.objects.filter(operation_id=self.operation_id, status=ItemStatus.PENDING).count()
            errors = "; ".join(self.broker_errors.get(name, name) for name in sorted(self.held_back))
            noun = "message waits" if pending == 1 else "messages wait"
            self._pause(f"cannot publish: {errors}. {pending:,} {noun}: resume once the broker can be reached")
            return True
        if self._wait_for_brokers(waiting):
            self.held_back.clear()
            with self.cursor_lock:
                self.cursor = 0
                self.look_for_in_flight = True
        return True

    def _take_fresh(self, operation: Operation, limit: int) -> Take | None:
        """A take that may pick up leftovers in flight: only once every record has landed, when nothing of ours is."""
        self._settle()
        reads = self.reader.submit(self._read_next, limit, True).result()
        return self.taker.submit(self._take, operation, reads).result() if reads else None

    def _take_read(self, operation: Operation, reads: Future[list[Read]], after: list[Future[None]]) -> Take | None:
        """Take a batch read ahead, once the records `after` (up to the one that leaves room) have landed."""
        for record in after:
            record.result()
        batch = reads.result()
        return self._take(operation, batch) if batch else None

    def _delay_for(self, claimed: list[Claimed]) -> Callable[[Message], float] | None:
        pacer = self.pacer
        if pacer is None:
            return None
        keys: dict[Hashable, str] = {entry.letter.pk: entry.destination.limit_key for entry in claimed}

        def delay_for(message: Message) -> float:
            # The pacer of the moment: an operator may change (or lift) the rate while this chunk runs.
            current = self.pacer
            return 0.0 if current is None else current.delay_for(keys[message.key])

        return delay_for


def run_operation(*, operation_id: int, continue_later: Callable[[float], None] | None = None) -> bool:
    """Run an operation in this process until it is done, paused or waiting; False if another worker holds it."""
    if Operation.objects.filter(pk=operation_id, kind=OperationKind.SHED).exists():
        return run_shed(operation_id=operation_id)
    return OperationRunner(operation_id, continue_later=continue_later).run()
