"""What a shed (operations/shedding.py) needs from ingest: a message taken from a live work queue read as a dead
letter, stored archived with the failure reason SHED, and which queues the console drains as dead-letter queues.

The operations app cannot import this app (they are siblings); the console lends it this when Django starts
(dlqconsole/apps.py), through `operations.shedding.register_storage`.

A shed message is parsed as any dead letter is (its body, properties and headers stored as they came), then made
the dead letter of the queue it was taken from: that queue is its source and original queue, through the default
exchange (x-death, if it carries any from an earlier death, does not decide where a retry sends it), and it has
no death of its own. It never links to a dead letter it was replayed from (it did not come back, it was taken).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.secrets import CredentialsError
from dlqconsole.core.replay_guard import vhost_of
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, DeathReason, FailureReason
from dlqconsole.ingest.envelope import ParsedDeadLetter, broker_scope, parse_envelope
from dlqconsole.ingest.models import WatchedQueue
from dlqconsole.ingest.services import ingest_batch

# Not a problem for a message that never died: it is a live message, taken before it was processed.
NOT_A_PROBLEM = frozenset({"no x-death header"})


class ShedStorage:
    """Parse and store shed messages; tell the queues a shed must leave alone. Lent to operations/shedding.py."""

    def parse(
        self, *, queue: str, broker: Broker, body: bytes, properties: Any, note: str, now: dt.datetime
    ) -> ParsedDeadLetter:
        """The message as a dead letter of `queue`, keyed by its content as ingest keys a dead letter (its
        content_hash is the same for every delivery of the same message)."""
        letter = parse_envelope(
            source_queue=queue,
            body=body,
            properties=properties,
            now=now,
            broker_id=broker.pk,
            broker_scope=broker_scope(broker.pk, default=broker.is_default),
        )
        letter.original_queue = queue
        letter.original_exchange = ""
        letter.original_routing_keys = []
        letter.death_reason = DeathReason.UNKNOWN
        letter.failure_reason = FailureReason.SHED
        letter.transient = True
        letter.error_type = "Shed"
        letter.error_message = note
        letter.stack_trace = ""
        letter.first_failed_at = letter.first_failed_at or now
        letter.last_failed_at = now
        letter.parse_errors = [error for error in letter.parse_errors if error not in NOT_A_PROBLEM]
        # Taken by a person, not dead: a message the console replayed is not a boomerang when it is shed. The
        # replayed-from header stays among the stored headers, but it links to no previous dead letter and counts
        # against no circuit breaker (ingest/boomerangs.py).
        letter.replayed_from = None
        return letter

    def store(self, letters: Sequence[ParsedDeadLetter], *, now: dt.datetime) -> list[int]:
        """Store every letter as a new archived dead letter (identical messages are each stored, as further
        occurrences of the first); their ids, in the order given. Raises rather than store fewer: the caller
        acks a message only once it is stored."""
        for letter in letters:
            # Always a first delivery here: the shed itself tells a redelivery after a crash (its own in-flight
            # items), and a copy a consumer returned to the queue is another message to keep.
            letter.redelivered = False
        with transaction.atomic():
            result = ingest_batch(letters=letters, now=now)
            if result.inserted != len(letters):
                raise RuntimeError(f"stored {result.inserted} of {len(letters)} shed messages")
            keys = [letter.dedupe_key for letter in letters]
            rows = {
                row[0]: (row[1], CountedRow(*row[2:]))
                for row in DeadLetter.objects.select_for_update(no_key=True)
                .filter(dedupe_key__in=keys)
                .order_by("pk")
                .values_list("dedupe_key", "pk", *COUNTED_FIELDS)
            }
            ids = [rows[key][0] for key in keys]
            DeadLetter.objects.filter(pk__in=ids).update(
                status=DeadLetterStatus.ARCHIVED, status_changed_at=now, next_retry_at=None
            )
            count_status_change([counted for _, counted in rows.values()], to_status=DeadLetterStatus.ARCHIVED)
        return ids

    def drained_queues(self, broker: Broker) -> set[str]:
        """The dead-letter queues consume_dlq drains on `broker`'s vhost, whichever broker entry it drains them
        through: every watched queue's DLQ, and DLQ_QUEUES (which consume_dlq reads on the broker default only).
        Entries on the same vhost name and port count as one vhost (host names are not compared, as replay_guard
        does not: one broker answers to several names). Not known here: the queues a `consume_dlq --queues` process
        was given, and the queues anything but the console drains."""
        entries = [entry for entry in Broker.objects.all() if entry.pk == broker.pk or _same_vhost(entry, broker)]
        names = set(WatchedQueue.objects.filter(broker__in=entries).values_list("dead_letter_queue", flat=True))
        if any(entry.is_default for entry in entries):
            names |= set(settings.DLQ_QUEUES)
        return names

    def watched_kind(self, broker: Broker, queue: str) -> tuple[str, dict[str, Any]] | None:
        """(kind, arguments) of a watched work queue as declare_topology recorded it; None when it is not one."""
        found = WatchedQueue.objects.filter(broker=broker, name=queue).values_list("kind", "arguments").first()
        if found is None:
            return None
        return str(found[0]), found[1] if isinstance(found[1], dict) else {}


def _vhost(broker: Broker) -> tuple[str, int, str] | None:
    try:
        return vhost_of(registry.amqp_url(broker))
    except CredentialsError:
        # No URL in this process: nothing can be consumed or shed through it here.
        return None


def _same_vhost(one: Broker, other: Broker) -> bool:
    found = _vhost(one)
    return found is not None and found == _vhost(other)
