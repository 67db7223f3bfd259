"""The run loop of an operation: claim it, work through its frozen items in chunks, record every outcome.

A chunk goes through three steps, each its own transaction or broker round:
1. take: lock the chunk's items and dead letters, skip the ones that changed since planning, mark the rest in
   flight (dead letters `replaying`) and commit, so a worker killed from here on leaves a record;
2. publish: windowed confirms, paced by the shared rate limiter, with a heartbeat every couple of seconds that
   also notices a pause, a cancel or a new rate;
3. record: confirmed ones become published (dead letters replayed or moved), returned or refused ones failed,
   never-sent ones go back to pending; ones sent but unconfirmed (the connection died) stay in flight and are
   published again, counted as possible duplicates.

Only one worker runs an operation at a time: it claims the row with a conditional UPDATE and keeps a heartbeat;
the sweeper hands an operation whose heartbeat went stale to another worker.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.core import amqp
from dlqconsole.core.publish import (
    CONFIRMED,
    NACKED,
    NOT_SENT,
    RETURNED,
    ConfirmedPublisher,
    Message,
    Outcome,
    PublishError,
)
from dlqconsole.core.ratelimit import Grant, Rate, RateLimiter, RateLimiterUnavailable, get_rate_limiter, parse_rate
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.counts import CountedRow, count_status_change
from dlqconsole.operations.destinations import (
    Destination,
    check_destinations,
    move_destination,
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

logger = logging.getLogger(__name__)

# Look for replays that came back at most this often (a query over recent arrivals).
RETURN_CHECK_SECONDS = 2.0
# A share of returns means little before this many replays.
RETURN_SHARE_MIN_SAMPLE = 20
# Broker or limiter failures in a row before the operation pauses, and the backoff between tries.
CONNECTION_ATTEMPTS = 3
TICK_SECONDS = 2.0
# The rate limiter hands out the tokens due within this many seconds in one round trip.
RESERVE_HORIZON = 0.1
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
)


@dataclass
class _Item:
    pk: int
    dead_letter_id: int
    status: str
    attempts: int
    previous_status: str


@dataclass
class _Claimed:
    item: _Item
    letter: DeadLetter
    destination: Destination
    previous_status: str


def _counted(letter: DeadLetter, status: str | None = None) -> CountedRow:
    return CountedRow(letter.source_queue, letter.pattern_id, letter.failure_reason, status or letter.status)


class _Pacer:
    """Spaces publishes per destination by the shared rate limiter, reserving the tokens due shortly at once."""

    def __init__(self, limiter: RateLimiter, rate: Rate) -> None:
        self.limiter = limiter
        self.rate = rate
        self.grants: dict[str, tuple[Grant, int]] = {}
        self.wanted: dict[str, int] = defaultdict(int)

    def delay_for(self, key: str) -> float:
        grant, index = self.grants.get(key, (None, 0))
        if grant is None or index >= grant.count:
            wanted = max(1, min(self.wanted[key], 1000))
            grant = self.limiter.reserve(key, self.rate, wanted, horizon=RESERVE_HORIZON)
            index = 0
            if grant.count == 0:
                self.grants.pop(key, None)
                # Ask again when the next token is within reach of the horizon.
                return max(0.001, grant.at + grant.due(0) - RESERVE_HORIZON - time.monotonic())
        delay = grant.at + grant.due(index) - time.monotonic()
        if delay > 0.0005:
            self.grants[key] = (grant, index)
            return delay
        self.grants[key] = (grant, index + 1)
        self.wanted[key] -= 1
        return 0.0


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

    # The loop ------------------------------------------------------------------------------------------------

    def run(self) -> bool:
        """Run the operation if no live worker holds it; False when it was not ours to run."""
        if not self._claim():
            return False
        try:
            self._loop()
        except Exception as error:
            logger.exception("operation %s stopped by an error", self.operation_id)
            self._pause(f"stopped by an error: {error!r}"[:2000], error=repr(error))
        finally:
            self._close_publisher()
            Operation.objects.filter(pk=self.operation_id, runner=self.token).update(runner="")
        return True

    def _loop(self) -> None:
        while True:
            operation = Operation.objects.get(pk=self.operation_id)
            if operation.runner != self.token:
                return
            if operation.status == OperationStatus.CANCELLED:
                finalize_cancelled(operation=operation)
                return
            if operation.status not in ACTIVE_STATUSES:
                return
            self._sync_rate(operation.rate)
            limit = self._chunk_size()
            if operation.status == OperationStatus.CANARY:
                if operation.canary_until is not None:
                    if not self._canary_waited(operation):
                        return
                    continue
                limit = min(limit, operation.canary_size - operation.processed)
            items = self._next_items(limit) if limit > 0 else []
            if not items:
                if operation.status == OperationStatus.CANARY and self._has_work():
                    self._start_canary_wait(operation)
                    continue
                self._finish(operation)
                return
            if operation.publishes:
                self._publish_items(operation, items)
            else:
                self._change_items(operation, items)
            self._check_returns(force=False)

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
        previous = self.pacer
        self.pacer = _Pacer(self.limiter, rate)
        if previous is not None:
            self.pacer.wanted.update(previous.wanted)

    def _next_items(self, limit: int) -> list[_Item]:
        """Items left in flight by a worker that died (or by a lost connection) first, then pending ones."""
        fields = ("pk", "dead_letter_id", "status", "attempts", "previous_status")
        items = OperationItem.objects.filter(operation_id=self.operation_id)
        rows = list(items.filter(status=ItemStatus.IN_FLIGHT).order_by("pk").values_list(*fields)[:limit])
        if not rows:
            rows = list(items.filter(status=ItemStatus.PENDING).order_by("pk").values_list(*fields)[:limit])
        return [_Item(*row) for row in rows]

    def _has_work(self) -> bool:
        return OperationItem.objects.filter(
            operation_id=self.operation_id, status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT]
        ).exists()

    # Archive, restore, purge ---------------------------------------------------------------------------------

    def _change_items(self, operation: Operation, items: list[_Item]) -> None:
        now = timezone.now()
        allowed = eligible_statuses(operation.kind, operation.filter.get("status"))
        with transaction.atomic():
            locked = list(
                OperationItem.objects.select_for_update()
                .filter(pk__in=[item.pk for item in items], status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT])
                .values_list("pk", "dead_letter_id")
            )
            letters = {
                row[0]: CountedRow(*row[1:])
                for row in DeadLetter.objects.select_for_update()
                .filter(pk__in=[dead_letter_id for _, dead_letter_id in locked])
                .values_list("pk", "source_queue", "pattern_id", "failure_reason", "status")
            }
            done: list[int] = []
            letter_ids: list[int] = []
            skipped: dict[int, str] = {}
            for item_pk, dead_letter_id in locked:
                row = letters.get(dead_letter_id)
                if row is None:
                    skipped[item_pk] = "the dead letter no longer exists"
                elif row.status not in allowed:
                    skipped[item_pk] = f"its status is now {row.status}"
                else:
                    done.append(item_pk)
                    letter_ids.append(dead_letter_id)
            rows = [letters[pk] for pk in letter_ids]
            if operation.kind == OperationKind.PURGE:
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

    def _publish_items(self, operation: Operation, items: list[_Item]) -> None:
        claimed = self._take(operation, items)
        if not claimed:
            return
        try:
            publisher = self._open_publisher()
        except PublishError as error:
            self._record(operation, claimed, outcomes={}, publish_error=str(error))
            return
        by_key: dict[Hashable, _Claimed] = {entry.letter.pk: entry for entry in claimed}
        messages = [
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
        pacer = self.pacer
        delay_for: Callable[[Message], float] | None = None
        if pacer is not None:
            for entry in claimed:
                pacer.wanted[entry.destination.limit_key] += 1

            def delay_for(message: Message) -> float:
                # The pacer of the moment: an operator may change (or lift) the rate while this chunk runs.
                current = self.pacer
                return 0.0 if current is None else current.delay_for(by_key[message.key].destination.limit_key)

        outcomes = publisher.publish(messages, delay_for=delay_for, on_tick=self._heartbeat, tick_seconds=TICK_SECONDS)
        self._record(
            operation,
            claimed,
            outcomes={outcome.key: outcome for outcome in outcomes},
            publish_error=publisher.error or ("" if publisher.is_open else "the connection to RabbitMQ was lost"),
        )

    def _take(self, operation: Operation, items: list[_Item]) -> list[_Claimed]:
        """Lock the chunk, settle what cannot be published, mark the rest in flight; return the rest."""
        now = timezone.now()
        allowed = eligible_statuses(operation.kind, operation.filter.get("status"))
        with transaction.atomic():
            locked = [
                _Item(*row)
                for row in OperationItem.objects.select_for_update()
                .filter(pk__in=[item.pk for item in items], status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT])
                .order_by("pk")
                .values_list("pk", "dead_letter_id", "status", "attempts", "previous_status")
            ]
            letters = {
                letter.pk: letter
                for letter in DeadLetter.objects.select_for_update()
                .filter(pk__in=[item.dead_letter_id for item in locked])
                .only(*LETTER_FIELDS)
            }
            skipped: dict[int, str] = {}
            candidates: list[_Claimed] = []
            for item in locked:
                letter = letters.get(item.dead_letter_id)
                if letter is None:
                    skipped[item.pk] = "the dead letter no longer exists"
                    continue
                if item.status == ItemStatus.IN_FLIGHT:
                    if letter.status != DeadLetterStatus.REPLAYING:
                        skipped[item.pk] = f"its status is now {letter.status}"
                        continue
                    previous = item.previous_status or DeadLetterStatus.PARKED
                elif letter.status not in allowed:
                    skipped[item.pk] = f"its status is now {letter.status}"
                    continue
                else:
                    previous = letter.status
                destination = self._destination(operation, letter)
                if destination is None:
                    skipped[item.pk] = "no known destination: no queue, exchange or routing key in its x-death"
                    continue
                candidates.append(_Claimed(item=item, letter=letter, destination=destination, previous_status=previous))
            problems = self._destination_problems({entry.destination for entry in candidates})
            failed = [entry for entry in candidates if problems.get(entry.destination)]
            claimed = [entry for entry in candidates if not problems.get(entry.destination)]

            fresh = [entry for entry in claimed if entry.item.status == ItemStatus.PENDING]
            DeadLetter.objects.filter(pk__in=[entry.letter.pk for entry in fresh]).update(
                status=DeadLetterStatus.REPLAYING, status_changed_at=now, next_retry_at=None
            )
            count_status_change([_counted(entry.letter) for entry in fresh], to_status=DeadLetterStatus.REPLAYING)
            by_previous: dict[str, list[int]] = defaultdict(list)
            for entry in fresh:
                by_previous[entry.previous_status].append(entry.item.pk)
            for previous, pks in by_previous.items():
                OperationItem.objects.filter(pk__in=pks).update(
                    status=ItemStatus.IN_FLIGHT, attempts=F("attempts") + 1, previous_status=previous
                )
            resumed = [entry.item.pk for entry in claimed if entry.item.status == ItemStatus.IN_FLIGHT]
            OperationItem.objects.filter(pk__in=resumed).update(attempts=F("attempts") + 1)
            for entry in claimed:
                entry.item.attempts += 1

            DeadLetter.objects.filter(pk__in=[entry.letter.pk for entry in failed]).update(
                status=DeadLetterStatus.FAILED, status_changed_at=now, next_retry_at=None
            )
            count_status_change([_counted(entry.letter) for entry in failed], to_status=DeadLetterStatus.FAILED)
            _mark_items(
                {entry.item.pk: problems[entry.destination] for entry in failed},
                status=ItemStatus.FAILED,
                destinations={entry.item.pk: str(entry.destination) for entry in failed},
            )
            _mark_items(skipped, status=ItemStatus.SKIPPED)
            Operation.objects.filter(pk=self.operation_id).update(
                skipped=F("skipped") + len(skipped),
                failed=F("failed") + len(failed),
                in_flight=len(claimed),
                # Items taken again after an uncertain publish may reach their queue twice: say so.
                duplicates=F("duplicates") + len(resumed),
                heartbeat_at=now,
            )
        if failed:
            self._count_failures(len(failed), problems[failed[-1].destination])
        return claimed

    def _destination(self, operation: Operation, letter: DeadLetter) -> Destination | None:
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
        """Missing exchanges, checked once per run: publishing to one would close the channel for everybody.

        A missing queue is left to the broker: the message comes back (mandatory) and is marked failed.
        """
        unknown = {destination for destination in destinations if destination not in self.destination_problems}
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

    def _record(
        self, operation: Operation, claimed: list[_Claimed], *, outcomes: dict[Hashable, Outcome], publish_error: str
    ) -> None:
        now = timezone.now()
        succeeded: list[tuple[_Claimed, dt.datetime]] = []
        failed: list[tuple[_Claimed, str, dt.datetime | None]] = []
        unsent: list[_Claimed] = []
        uncertain = 0
        streak_error = ""
        for entry in claimed:
            outcome = outcomes.get(entry.letter.pk) or Outcome(entry.letter.pk, NOT_SENT, publish_error)
            published_at = outcome.published_at
            moment = dt.datetime.fromtimestamp(published_at, tz=dt.UTC) if published_at else None
            if outcome.status == CONFIRMED and moment is not None:
                succeeded.append((entry, moment))
            elif outcome.status in (RETURNED, NACKED):
                failed.append((entry, outcome.error, moment))
                streak_error = outcome.error
            elif outcome.status == NOT_SENT:
                unsent.append(entry)
            else:
                uncertain += 1
        new_status = DeadLetterStatus.MOVED if operation.kind == OperationKind.MOVE else DeadLetterStatus.REPLAYED
        with transaction.atomic():
            items = []
            for entry, moment in succeeded:
                items.append(
                    OperationItem(
                        pk=entry.item.pk,
                        status=ItemStatus.PUBLISHED,
                        published_at=moment,
                        destination=str(entry.destination),
                        error="",
                    )
                )
            for entry, error, moment in failed:
                items.append(
                    OperationItem(
                        pk=entry.item.pk,
                        status=ItemStatus.FAILED,
                        published_at=moment,
                        destination=str(entry.destination),
                        error=error[:2000],
                    )
                )
            OperationItem.objects.bulk_update(items, ["status", "published_at", "destination", "error"], batch_size=500)
            ok_ids = [entry.letter.pk for entry, _ in succeeded]
            DeadLetter.objects.filter(pk__in=ok_ids).update(
                status=new_status, status_changed_at=now, replay_count=F("replay_count") + 1
            )
            count_status_change(
                [_counted(entry.letter, DeadLetterStatus.REPLAYING) for entry, _ in succeeded], to_status=new_status
            )
            DeadLetter.objects.filter(pk__in=[entry.letter.pk for entry, _, _ in failed]).update(
                status=DeadLetterStatus.FAILED, status_changed_at=now
            )
            count_status_change(
                [_counted(entry.letter, DeadLetterStatus.REPLAYING) for entry, _, _ in failed],
                to_status=DeadLetterStatus.FAILED,
            )
            # Never sent: give the dead letters back as they were and the items back to pending.
            by_previous: dict[str, list[_Claimed]] = defaultdict(list)
            for entry in unsent:
                by_previous[entry.previous_status].append(entry)
            for previous, entries in by_previous.items():
                DeadLetter.objects.filter(pk__in=[entry.letter.pk for entry in entries]).update(
                    status=previous, status_changed_at=now
                )
                count_status_change(
                    [_counted(entry.letter, DeadLetterStatus.REPLAYING) for entry in entries], to_status=previous
                )
            OperationItem.objects.filter(pk__in=[entry.item.pk for entry in unsent]).update(
                status=ItemStatus.PENDING, attempts=F("attempts") - 1
            )
            Operation.objects.filter(pk=self.operation_id).update(
                succeeded=F("succeeded") + len(succeeded),
                failed=F("failed") + len(failed),
                in_flight=uncertain,
                last_error=(publish_error or streak_error or F("last_error")),
                heartbeat_at=now,
            )
        if succeeded:
            self.failure_streak = 0
        if failed:
            self._count_failures(len(failed), streak_error)
        if publish_error and (uncertain or unsent):
            self._count_connection_failure(publish_error)
        elif succeeded or failed:
            self.connection_failures = 0

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

    def _start_canary_wait(self, operation: Operation) -> None:
        until = timezone.now() + dt.timedelta(seconds=operation.canary_wait_seconds)
        Operation.objects.filter(pk=self.operation_id, runner=self.token).update(canary_until=until)

    def _canary_waited(self, operation: Operation) -> bool:
        """Judge the canary once its wait is over; False when the runner should stop for now."""
        assert operation.canary_until is not None
        remaining = (operation.canary_until - timezone.now()).total_seconds()
        if remaining > 0:
            if self.continue_later is not None:
                self.continue_later(remaining)
                return False
            time.sleep(min(remaining, TICK_SECONDS))
            return self._heartbeat()
        returned = self._check_returns(force=True)
        if returned or operation.failed:
            parts = []
            if returned:
                parts.append(f"{returned} came back to a dead-letter queue within {operation.canary_wait_seconds}s")
            if operation.failed:
                parts.append(f"{operation.failed} could not be published ({operation.last_error})")
            self._pause(f"canary of {operation.canary_size}: " + "; ".join(parts))
            return True
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
        published = operation.succeeded - operation.succeeded_baseline
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

    def _pause(self, reason: str, *, error: str = "") -> None:
        paused = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES).update(
            status=OperationStatus.PAUSED, pause_reason=reason[:2000], last_error=error or reason[:2000]
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


def count_returned(*, operation: Operation) -> int:
    """Dead letters of this operation that came back after their replay (each counted once)."""
    published = OperationItem.objects.filter(operation=operation, status=ItemStatus.PUBLISHED).values("dead_letter_id")
    # Boomerangs are new arrivals: the (status, ingested_at) index bounds the scan to what arrived since the start.
    return (
        DeadLetter.objects.filter(
            status__in=[DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED],
            ingested_at__gte=operation.started_at,
            previous_id__in=published,
        )
        .values("previous_id")
        .distinct()
        .count()
    )


def finalize_cancelled(*, operation: Operation) -> None:
    """Settle what a cancelled operation left: pending items are skipped, never-confirmed in-flight ones too (their
    dead letters go back to the status they had). Only call it when no worker is publishing the operation."""
    now = timezone.now()
    with transaction.atomic():
        pending = OperationItem.objects.filter(operation=operation, status=ItemStatus.PENDING).update(
            status=ItemStatus.SKIPPED, error="cancelled"
        )
        in_flight = list(
            OperationItem.objects.select_for_update()
            .filter(operation=operation, status=ItemStatus.IN_FLIGHT)
            .values_list("pk", "dead_letter_id", "previous_status")
        )
        letters = {
            row[0]: CountedRow(*row[1:])
            for row in DeadLetter.objects.select_for_update()
            .filter(pk__in=[row[1] for row in in_flight], status=DeadLetterStatus.REPLAYING)
            .values_list("pk", "source_queue", "pattern_id", "failure_reason", "status")
        }
        by_previous: dict[str, list[int]] = defaultdict(list)
        for _, dead_letter_id, previous in in_flight:
            if dead_letter_id in letters:
                by_previous[previous or DeadLetterStatus.PARKED].append(dead_letter_id)
        for previous, ids in by_previous.items():
            DeadLetter.objects.filter(pk__in=ids).update(status=previous, status_changed_at=now)
            count_status_change([letters[pk] for pk in ids], to_status=previous)
        OperationItem.objects.filter(pk__in=[row[0] for row in in_flight]).update(
            status=ItemStatus.SKIPPED, error="cancelled; it may have been published before its worker stopped"
        )
        Operation.objects.filter(pk=operation.pk).update(
            skipped=F("skipped") + pending + len(in_flight),
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


def _mark_items(errors: dict[int, str], *, status: str, destinations: dict[int, str] | None = None) -> None:
    """Set items to `status` with their own error text (grouped, since most share one)."""
    grouped: dict[tuple[str, str], list[int]] = defaultdict(list)
    for pk, error in errors.items():
        grouped[(error[:2000], (destinations or {}).get(pk, ""))].append(pk)
    for (error, destination), pks in grouped.items():
        OperationItem.objects.filter(pk__in=pks).update(status=status, error=error, destination=destination)


def run_operation(*, operation_id: int, continue_later: Callable[[float], None] | None = None) -> bool:
    """Run an operation in this process until it is done, paused or waiting; False if another worker holds it."""
    return OperationRunner(operation_id, continue_later=continue_later).run()


__all__ = ["OperationRunner", "RateLimiterUnavailable", "count_returned", "finalize_cancelled", "run_operation"]
