"""The run of a shed: scan a live work queue once, keep each matching message as an archived dead letter, give
the others back. docs/operations.md ("Shedding a flooded queue") tells the whole story; in short:

- AMQP cannot take messages selectively, so the scan consumes (manual acks, its consumer priority above the
  queue's own consumers, a prefetch window of DLQ_SHED_HOLD messages) and looks at each message in turn.
- A matching message is stored and committed (an archived dead letter, reason SHED, with an OperationItem in
  flight), then acked; a round trip on the channel after the acks proves the broker has them, and the items are
  marked done.
- A message that does not match (or comes after --limit) is held, unacked, while the scan goes deeper. Given
  back at once with basic.nack(requeue=true), it would go back to the front of its priority in a classic
  priority queue, and the next delivery would be that message again: a scan could never reach the low
  priorities behind the high ones. Held, it is not delivered again, so no message is looked at twice in a scan.
- The scan stops, saying why, when it has looked at as many messages as the queue held when it began, when it
  has shed --limit, when it holds DLQ_SHED_HOLD messages, when nothing more is delivered for
  DLQ_SHED_IDLE_SECONDS, or when a person pauses or cancels it. Then it cancels its consumer and gives the held
  messages back, all at once (they come back marked redelivered, at the front of their priorities).
- After a crash between a commit and its acks the broker redelivers those messages. The items still in flight
  say which contents were stored and not known acked: a redelivered message with such a content is acked without
  storing it again (one per item). Any other message, identical ones included, is stored: two identical messages
  in the queue are two dead letters (the second a further occurrence of the first, as ingest keeps them).

- Every run, the first and each after a resume or a hand-over, checks the queue again as the plan did
  (shed_queue.inspect_queue): a queue declared again as a quorum queue or a stream since, gone, or now drained as a
  dead-letter queue pauses the operation with the reason, taking nothing. A delivery carrying a header only a
  quorum queue or a stream adds (x-delivery-count, x-stream-offset) stops the scan the same way.

The operations app cannot import ingest (they are siblings), so the parsing and storing are lent to it when Django
starts (dlqconsole/apps.py): `shed_queue.register_storage`.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from pika.exceptions import ChannelClosedByBroker

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.core.amqp import queue_depth
from dlqconsole.core.ratelimit import RateLimiter, RateLimiterUnavailable, get_rate_limiter, parse_rate, scoped_key
from dlqconsole.operations.models import ACTIVE_STATUSES, ItemStatus, Operation, OperationItem, OperationStatus
from dlqconsole.operations.pacing import Pacer
from dlqconsole.operations.shed_queue import ShedLetter, ShedRefused, inspect_queue, storage

logger = logging.getLogger(__name__)

# Above any consumer priority an application sets (the default is 0): while the scan has room in its window,
# the broker delivers to it first, so it sees the queue before the consumers take the low priorities it wants.
SCAN_CONSUMER_PRIORITY = 1000
# Messages stored per transaction at most; a batch is also stored whenever the scan waits.
STORE_BATCH = 200
# The longest the scan waits for a delivery between two looks at the operation row (heartbeat, pause, cancel).
TICK_SECONDS = 0.5
# Headers only a quorum queue (a redelivery's count) or a stream (the offset) adds to what it delivers.
NOT_CLASSIC_HEADERS = ("x-delivery-count", "x-stream-offset")
# A wait for the rate at least this long stores what is waiting first (shorter ones, between two messages of a
# steady rate, would store batches of one).
STORE_BEFORE_WAIT_SECONDS = 0.5
# AMQP's prefetch count is a short.
MAX_PREFETCH = 65535


def matches(properties: Any, *, priority_below: int, older_than: int | None, now: dt.datetime) -> bool:
    """Whether a message is shed: its priority (none is 0, as the broker files it) below `priority_below` and,
    with `older_than`, its `timestamp` at least that many seconds before `now`. A message without a usable
    timestamp is never older."""
    priority = getattr(properties, "priority", None)
    if not isinstance(priority, int) or isinstance(priority, bool):
        priority = 0
    if priority >= priority_below:
        return False
    if older_than is None:
        return True
    stamp = getattr(properties, "timestamp", None)
    if not isinstance(stamp, int) or isinstance(stamp, bool):
        return False
    return stamp <= now.timestamp() - older_than


def _not_classic(properties: Any) -> str:
    """The header a delivery carries that only a quorum queue (x-delivery-count) or a stream (x-stream-offset) adds;
    "" when it carries neither."""
    headers = getattr(properties, "headers", None)
    if not isinstance(headers, dict):
        return ""
    return next((name for name in NOT_CLASSIC_HEADERS if name in headers), "")


@dataclass
class Delivery:
    tag: int
    redelivered: bool
    properties: Any
    body: bytes


class ShedRun:
    """One scan of a shed operation's queue, by the worker that claimed it."""

    def __init__(self, operation_id: int) -> None:
        self.operation_id = operation_id
        self.token = uuid.uuid4().hex
        self.held = 0
        self.examined = 0
        self.shed = 0
        self.duplicates = 0
        self.pending: list[Delivery] = []
        self.channel: Any = None
        self.limiter: RateLimiter | None = None
        self.pacer: Pacer | None = None
        self.pacer_text = ""
        self.last_beat = 0.0
        self.rate_text = ""
        # Why the scan stopped on a message only a quorum queue or a stream delivers ("" while it has not).
        self.refused = ""

    def run(self) -> bool:
        """Scan the queue if no live worker holds the operation; False when it was not ours to run."""
        if not self._claim():
            return False
        operation = Operation.objects.get(pk=self.operation_id)
        self.plan = dict((operation.breakdown or {}).get("shed") or {})
        self.skipped_before, self.examined_before = operation.skipped, int(self.plan.get("examined") or 0)
        self.rate_text = operation.rate
        connection = None
        try:
            broker = registry.get(str(self.plan["broker"]))
            try:
                # What the plan refused is refused again now: the queue may be another one since it was planned.
                inspect_queue(broker, str(self.plan["queue"]), empty_refused=False)
            except ShedRefused as refused:
                self._pause(f"not run: {refused}"[:2000])
                return True
            connection = registry.connect(broker, heartbeat=60)
            self.channel = connection.channel()
            stopped = self._scan(broker)
            if self.refused:
                self._pause(self.refused[:2000])
            elif stopped:
                self._finish(stopped)
        except Exception as error:
            logger.exception("shed %s stopped by an error", self.operation_id)
            self._pause(f"stopped by an error: {error!r}"[:2000])
        finally:
            if connection is not None and connection.is_open:
                # Closing gives back whatever is still unacked (nothing, after a clean stop).
                connection.close()
            self._record_counts()
            Operation.objects.filter(pk=self.operation_id, runner=self.token).update(runner="")
        return True

    def _claim(self) -> bool:
        now = timezone.now()
        stale = now - dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS)
        return bool(
            Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES)
            .filter(Q(runner="") | Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True))
            .update(runner=self.token, heartbeat_at=now)
        )

    # The scan -------------------------------------------------------------------------------------------------

    def _scan(self, broker: Broker) -> str:
        """Look at the queue once; why it stopped ("" when a person paused or cancelled it)."""
        queue = str(self.plan["queue"])
        try:
            depth, _ = queue_depth(self.channel, queue)
        except ChannelClosedByBroker as error:
            raise RuntimeError(f"queue {queue!r}: {error.reply_text}") from None
        self.plan["depth_at_scan"] = depth
        hold = settings.DLQ_SHED_HOLD
        self.channel.basic_qos(prefetch_count=min(MAX_PREFETCH, hold + STORE_BATCH))
        self.in_flight = self._in_flight_items()
        priority_below, older_than = int(self.plan["priority_below"]), self.plan.get("older_than")
        limit = self.plan.get("limit")
        note = f"shed from queue {queue} (priority below {priority_below})"
        idle_since = time.monotonic()
        stopped = ""
        for method, properties, body in self.channel.consume(
            queue, auto_ack=False, arguments={"x-priority": SCAN_CONSUMER_PRIORITY}, inactivity_timeout=TICK_SECONDS
        ):
            if method is None:
                self._store_pending(broker, note)
                if time.monotonic() - idle_since >= settings.DLQ_SHED_IDLE_SECONDS:
                    stopped = (
                        f"nothing more was delivered for {settings.DLQ_SHED_IDLE_SECONDS}s: the queue is empty, "
                        "or the rest of it is with its consumers"
                    )
                    break
            elif found := _not_classic(properties):
                self.refused = (
                    f"stopped: a message of queue {queue!r} carries {found}, which only a quorum queue or a stream "
                    "adds: a shed runs on classic queues only. The messages it held were given back"
                )
                break
            else:
                idle_since = time.monotonic()
                self.examined += 1
                delivery = Delivery(method.delivery_tag, bool(method.redelivered), properties, bytes(body))
                taken = self.shed + len(self.pending)
                wanted = limit is None or taken < int(limit)
                if wanted and matches(
                    properties, priority_below=priority_below, older_than=older_than, now=timezone.now()
                ):
                    if not self._wait_for_rate(broker, note):
                        break
                    self.pending.append(delivery)
                    if len(self.pending) >= STORE_BATCH:
                        self._store_pending(broker, note)
                else:
                    self.held += 1
                stopped = self._stop_rule(depth=depth, hold=hold, limit=limit)
                if stopped:
                    break
            if time.monotonic() - self.last_beat >= 1.0 and not self._heartbeat():
                break
        self._store_pending(broker, note)
        self._give_back()
        return stopped

    def _stop_rule(self, *, depth: int, hold: int, limit: Any) -> str:
        if limit is not None and self.shed + len(self.pending) >= int(limit):
            return f"shed {int(limit):,}, its limit"
        if self.examined >= depth:
            return f"looked at {self.examined:,} messages, as many as the queue held when the scan began"
        if self.held >= hold:
            return (
                f"holding {self.held:,} messages that stay (DLQ_SHED_HOLD): the rest of the queue is behind them. Shed "
                "again once its consumers have taken some, or raise DLQ_SHED_HOLD"
            )
        return ""

    def _give_back(self) -> None:
        """Cancel the scan's consumer, then give back every message it holds, at once."""
        if self.channel is None or not self.channel.is_open:
            return
        # Cancelling first: given back while the consumer is still there, they would be delivered to it again.
        # cancel() gives back the deliveries it had not handed over yet.
        self.channel.cancel()
        self.channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
        # A round trip: the broker has taken the nack when it answers.
        self.channel.basic_qos(prefetch_count=0)

    def _wait_for_rate(self, broker: Broker, note: str) -> bool:
        """Wait until the rate lets one more message be shed, keeping the heartbeat; False when the operation was
        paused or cancelled meanwhile. The pacer reserves the tokens due shortly in one round trip (as a replay's
        does), so a message costs no call to the limiter of its own; before a longer wait, what is waiting to be
        stored is stored, so it is not held unacked."""
        if not self.rate_text:
            return True
        if self.pacer is None or self.pacer_text != self.rate_text:
            if self.limiter is None:
                self.limiter = get_rate_limiter()
            self.pacer, self.pacer_text = Pacer(self.limiter, parse_rate(self.rate_text)), self.rate_text
        key = scoped_key(f"shed:{self.plan['queue']}", broker="" if broker.is_default else broker.name)
        while True:
            try:
                wait = self.pacer.delay_for(key)
            except RateLimiterUnavailable:
                wait = 1.0
            if wait <= 0:
                return True
            if wait >= STORE_BEFORE_WAIT_SECONDS:
                self._store_pending(broker, note)
            time.sleep(min(wait, 1.0))
            if time.monotonic() - self.last_beat >= 1.0 and not self._heartbeat():
                return False

    # Storing ------------------------------------------------------------------------------------------------

    def _in_flight_items(self) -> dict[str, list[int]]:
        """This operation's messages stored before a restart whose acks were not confirmed, by content hash."""
        found: dict[str, list[int]] = defaultdict(list)
        rows = OperationItem.objects.filter(operation_id=self.operation_id, status=ItemStatus.IN_FLIGHT).values_list(
            "pk", "dead_letter__dedupe_key"
        )
        for pk, key in rows:
            found[str(key or "")[:64]].append(pk)
        return found

    def _store_pending(self, broker: Broker, note: str) -> None:
        """Store what matched, commit, ack, and once the broker has the acks mark the items done."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        now = timezone.now()
        lent = storage()
        to_store: list[Delivery] = []
        acked: list[Delivery] = []
        letters: list[ShedLetter] = []
        settled: list[int] = []
        for delivery in batch:
            letter = lent.parse(
                queue=str(self.plan["queue"]),
                broker=broker,
                body=delivery.body,
                properties=delivery.properties,
                note=note,
                now=now,
            )
            if letter.body_truncated:
                # Over DLQ_MAX_BODY_BYTES a dead letter keeps only the start of its body: taken, the message would
                # be lost. It stays in the queue, held with the others.
                self.held += 1
                self.plan["too_big"] = int(self.plan.get("too_big") or 0) + 1
                continue
            waiting = self.in_flight.get(letter.content_hash) if delivery.redelivered else None
            if waiting:
                # Stored before a restart, its ack lost: this is that message again.
                settled.append(waiting.pop())
                acked.append(delivery)
                continue
            to_store.append(delivery)
            letters.append(letter)
        with transaction.atomic():
            ids = lent.store(letters, now=now) if letters else []
            items = OperationItem.objects.bulk_create(
                OperationItem(
                    operation_id=self.operation_id,
                    dead_letter_id=dead_letter_id,
                    status=ItemStatus.IN_FLIGHT,
                    destination=f"from queue {self.plan['queue']}"[:512],
                )
                for dead_letter_id in ids
            )
            Operation.objects.filter(pk=self.operation_id).update(
                succeeded=F("succeeded") + len(ids), duplicates=F("duplicates") + len(settled), heartbeat_at=now
            )
        for delivery in to_store + acked:
            self.channel.basic_ack(delivery_tag=delivery.tag)
        # A round trip on the channel: when the broker answers it, it has taken every ack sent before.
        self.channel.basic_qos(prefetch_count=min(MAX_PREFETCH, settings.DLQ_SHED_HOLD + STORE_BATCH))
        OperationItem.objects.filter(pk__in=[item.pk for item in items] + settled).update(
            status=ItemStatus.DONE, published_at=now
        )
        self.shed += len(ids)
        self.duplicates += len(settled)

    # The operation row ----------------------------------------------------------------------------------------

    def _heartbeat(self) -> bool:
        """Keep the claim and the figures; False when the operation was paused, cancelled or taken over."""
        self.last_beat = time.monotonic()
        self._record_counts()
        if not Operation.objects.filter(pk=self.operation_id, runner=self.token).update(heartbeat_at=timezone.now()):
            return False
        status, self.rate_text = Operation.objects.filter(pk=self.operation_id).values_list("status", "rate").get()
        return status in ACTIVE_STATUSES

    def _record_counts(self) -> None:
        self.plan["examined"] = self.examined_before + self.examined
        Operation.objects.filter(pk=self.operation_id).update(
            skipped=self.skipped_before + self.held,
            breakdown=_with_shed(self.operation_id, self.plan),
        )

    def _finish(self, stopped: str) -> None:
        """Done, saying why the scan stopped. Items left in flight by an earlier run whose message did not come
        back were acked before that run died (or, requeued, went to a consumer): they are done either way."""
        now = timezone.now()
        self.plan["stopped"] = stopped
        self._record_counts()
        OperationItem.objects.filter(operation_id=self.operation_id, status=ItemStatus.IN_FLIGHT).update(
            status=ItemStatus.DONE,
            error="stored before a worker restart, its ack not confirmed: acked then, or given to a consumer too",
        )
        finished = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES, runner=self.token).update(
            status=OperationStatus.DONE, finished_at=now, in_flight=0, heartbeat_at=now
        )
        if finished:
            operation = Operation.objects.get(pk=self.operation_id)
            record_audit(
                actor=None,
                action="operation.shed.done",
                target=f"operation:{self.operation_id}",
                filter=operation.filter,
                count=operation.succeeded,
                detail=f"shed {operation.succeeded:,}, left {operation.skipped:,} in the queue; stopped: {stopped}"[
                    :2000
                ],
            )

    def _pause(self, reason: str) -> None:
        paused = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES).update(
            status=OperationStatus.PAUSED, pause_reason=reason, paused_automatically=True, last_error=reason
        )
        if paused:
            record_audit(actor=None, action="operation.pause", target=f"operation:{self.operation_id}", detail=reason)


def _with_shed(operation_id: int, plan: dict[str, Any]) -> dict[str, Any]:
    breakdown = Operation.objects.filter(pk=operation_id).values_list("breakdown", flat=True).get() or {}
    return {**breakdown, "shed": plan}


def run_shed(*, operation_id: int) -> bool:
    """Run a shed in this process until its scan stops, it is paused or cancelled; False if another worker holds
    it."""
    return ShedRun(operation_id).run()
