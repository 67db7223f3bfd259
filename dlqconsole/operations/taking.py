"""The take of a retry or move (see runner.py): read the next items ahead, lock them and their dead letters, settle
what cannot be published, mark the rest in flight and build their messages."""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.db.models import F, JSONField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from dlqconsole.core import amqp
from dlqconsole.core.publish import Message
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.destinations import (
    Destination,
    check_destinations,
    move_destination,
    replay_properties,
    retry_destination,
)
from dlqconsole.operations.item_sql import BUSY, busy_elsewhere, id_array, mark_in_flight, mark_items
from dlqconsole.operations.models import ItemStatus, Operation, OperationKind, eligible_statuses
from dlqconsole.operations.pipeline import Claimed, Letter, Read, Take
from dlqconsole.operations.run_state import RunState

logger = logging.getLogger(__name__)

LETTER_FIELDS = (
    "id",
    "broker_id",
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


class TakeSteps(RunState):
    """The take of OperationRunner (the first of the steps runner.py's docstring describes)."""

    def _read_next(self, limit: int, resume: bool) -> list[Read]:
        """The next items and their messages, read without locks: the wide read happens off the critical path."""
        items = self._next_items(limit, resume=resume)
        found = DeadLetter.objects.filter(pk__in=id_array([item[1] for item in items]))
        fields: tuple[str, ...] = LETTER_FIELDS
        if connection.vendor == "postgresql":
            # The broker's death headers (x-death is most of a dead letter's headers) are dropped by the replay
            # anyway: PostgreSQL leaves them out, so this thread does not decode them from JSON, thousands a
            # second. replay_properties still drops any it finds (other spellings, tagged tables).
            found = found.annotate(
                replay_headers=RawSQL(REPLAY_HEADERS_SQL, (sorted(DEATH_HEADER_NAMES),), output_field=JSONField())
            )
            fields = tuple("replay_headers" if name == "headers" else name for name in LETTER_FIELDS)
        letters = {row[0]: Letter(*row) for row in found.values_list(*fields)}
        return [Read(item_pk, status, letters.get(dead_letter_id)) for item_pk, dead_letter_id, status in items]

    def _take(self, operation: Operation, reads: list[Read]) -> Take:
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
                .filter(pk__in=id_array([read.letter.pk for read in reads if read.letter is not None]))
                .order_by("pk")
                .values_list("pk", *COUNTED_FIELDS)
            }
            busy = busy_elsewhere(list(current), operation_id=self.operation_id)
            skipped: dict[int, str] = {}
            candidates: list[Claimed] = []
            for read in reads:
                letter = read.letter
                row = current.get(letter.pk) if letter is not None else None
                if letter is None or row is None:
                    skipped[read.item_pk] = "the dead letter no longer exists"
                    continue
                letter.broker_id, letter.source_queue, letter.pattern_id, letter.failure_reason, letter.status = row
                if letter.pk in busy:
                    skipped[read.item_pk] = BUSY
                elif letter.status not in allowed:
                    skipped[read.item_pk] = f"its status is now {letter.status}"
                elif (destination := self._destination(operation, letter)) is None:
                    skipped[read.item_pk] = "no known destination: no queue, exchange or routing key in its x-death"
                elif read.status == ItemStatus.PENDING and self._blocked(destination):
                    # Its destination's breaker holds it back: left pending, behind the cursor, read again later.
                    continue
                else:
                    candidates.append(Claimed(read.item_pk, read.status == ItemStatus.IN_FLIGHT, letter, destination))
            problems = self._destination_problems({entry.destination for entry in candidates})
            reasons = {
                entry.item_pk: CUT_BODY
                if entry.letter.body_truncated
                else problems.get(entry.destination, "") or self._routing_header_problem(entry)
                for entry in candidates
            }
            failed = [entry for entry in candidates if reasons[entry.item_pk]]
            claimed = [entry for entry in candidates if not reasons[entry.item_pk]]

            # Only items still as read are taken: pending ones (a cancel may have skipped some since the read, and
            # an item read twice is taken once), or leftovers still in flight.
            marked = mark_in_flight([entry.item_pk for entry in claimed if not entry.resumed], was=ItemStatus.PENDING)
            marked |= mark_in_flight([entry.item_pk for entry in claimed if entry.resumed], was=ItemStatus.IN_FLIGHT)
            claimed = [entry for entry in claimed if entry.item_pk in marked]
            waiting = [entry for entry in failed if entry.letter.status in FAILABLE_STATUSES]
            DeadLetter.objects.filter(pk__in=[entry.letter.pk for entry in waiting]).update(
                status=DeadLetterStatus.FAILED, status_changed_at=now, next_retry_at=None
            )
            count_status_change([_counted(entry.letter) for entry in waiting], to_status=DeadLetterStatus.FAILED)
            mark_items(
                {entry.item_pk: reasons[entry.item_pk] for entry in failed},
                status=ItemStatus.FAILED,
                destinations={entry.item_pk: str(entry.destination) for entry in failed},
            )
            Operation.objects.filter(pk=self.operation_id).update(
                skipped=F("skipped") + mark_items(skipped, status=ItemStatus.SKIPPED),
                failed=F("failed") + len(failed),
                in_flight=len(claimed),
                # Items published again after an uncertain publish may reach their queue twice: say so.
                duplicates=F("duplicates") + sum(entry.resumed for entry in claimed),
                heartbeat_at=now,
            )
        error = reasons[failed[-1].item_pk] if failed else ""
        return Take(claimed=claimed, failed=len(failed), error=error, messages=self._messages(claimed))

    def _messages(self, claimed: list[Claimed]) -> list[Message]:
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

    def _destination(self, operation: Operation, letter: Letter) -> Destination | None:
        """Where the dead letter goes: a retry to its original queue on the broker it came from; a move to the
        target on the move's target broker, else on the dead letter's own."""
        if operation.kind == OperationKind.MOVE:
            return move_destination(
                target_queue=operation.target_queue,
                target_exchange=operation.target_exchange,
                target_routing_key=operation.target_routing_key,
                broker=self.brokers.name(operation.target_broker_id or letter.broker_id),
            )
        return retry_destination(
            exchange=letter.original_exchange,
            routing_keys=letter.original_routing_keys,
            queue=letter.original_queue,
            broker=self.brokers.name(letter.broker_id),
        )

    def _destination_problems(self, destinations: set[Destination]) -> dict[Destination, str]:
        """Disabled brokers, the console's own Celery queues (never a destination, whatever a dead letter says)
        and missing exchanges, checked once per run on each destination's broker: publishing to a missing exchange
        would close the channel for everybody.

        A missing queue is left to the broker: the message comes back (mandatory) and is marked failed. The
        exchanges of a broker that cannot be reached now are not checked: its messages are held back anyway.
        """
        # The main thread replaces the dict when a broker fails: what is learnt here goes to the one read now.
        known = self.destination_problems
        unknown = {destination for destination in destinations if destination not in known}
        for destination in list(unknown):
            if refused := self.brokers.unpublishable(destination):
                known[destination] = refused
                unknown.discard(destination)
        by_broker: dict[str, set[Destination]] = {}
        for destination in unknown:
            if destination.exchange and not self._broker_down(destination.broker):
                by_broker.setdefault(destination.broker, set()).add(destination.on_exchange)
        for name, exchanges in by_broker.items():
            try:
                found = check_destinations(exchanges, broker=self.brokers.named(name))
            except Exception as error:  # noqa: BLE001  (the publisher will meet the same problem and report it)
                logger.warning("could not check destinations on broker %s: %r", name, error)
                continue
            for destination in unknown:
                if destination.broker == name:
                    known[destination] = found.get(destination.on_exchange, "")
        for destination in unknown:
            if not destination.exchange:
                known[destination] = ""
        return {destination: known.get(destination, "") for destination in destinations}

    def _routing_header_problem(self, entry: Claimed) -> str:
        """Why the CC or BCC header of a dead letter keeps it from being replayed ("" when it has none or they
        pass), judged for the broker it goes to."""
        headers = entry.letter.headers
        if not isinstance(headers, dict) or not ("CC" in headers or "BCC" in headers):
            return ""
        return self.brokers.header_refusal(entry.destination, headers)


def _counted(letter: Letter) -> CountedRow:
    return CountedRow(letter.broker_id, letter.source_queue, letter.pattern_id, letter.failure_reason, letter.status)
