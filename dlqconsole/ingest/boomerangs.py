"""Boomerangs to the circuit breakers: a replay that died again within DLQ_BREAKER_WINDOW_SECONDS of its replay
counts against the breaker of the destination it was replayed to (core/breaker.py).

Everything in a boomerang's headers is hostile (anyone who can publish to a DLQ can name any dead letter in
dlq-replayed-from and any queue in x-death), so it counts only when its origin dead letter was REPLAYED within the
window, the breaker key is the one of that replay (core.breaker.destination_key over the origin's stored x-death, as
operations.destinations.retry_destination computed it, the key Destination.limit_key gives), the boomerang died
there, on the origin's broker (its own newest x-death agrees), and it is the origin's first return. A MOVED origin's
return is not counted: where a move went is not kept on the dead letter. Reported after
ingest's commit, and never allowed to stop ingest: when Redis cannot be reached, boomerangs go uncounted for a while
instead of making every batch wait for its timeout."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from dlqconsole.brokers.models import DEFAULT
from dlqconsole.core.breaker import BOOMERANG, Event, destination_key, get_breakers
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.ingest.envelope import ParsedDeadLetter

logger = logging.getLogger(__name__)

# After Redis failed, boomerangs are not reported for this long.
QUIET_SECONDS = 30.0
# Until when (time.monotonic()) this process reports none.
QUIET = {"until": 0.0}


def report_boomerangs(letters: Sequence[ParsedDeadLetter]) -> int:
    """Count the replays among `letters` (stored already) that died again within the window; how many were
    reported."""
    linked = [letter for letter in letters if letter.replayed_from]
    if not linked or time.monotonic() < QUIET["until"]:
        return 0
    try:
        return _report(linked)
    except Exception as error:  # noqa: BLE001  (the breakers must never stop ingest)
        QUIET["until"] = time.monotonic() + QUIET_SECONDS
        logger.warning("boomerangs not counted by the circuit breakers for %ss: %r", QUIET_SECONDS, error)
        return 0


def _report(linked: list[ParsedDeadLetter]) -> int:
    # One query: each origin's status, replay time, broker and stored fields, and how many boomerangs it has.
    origins = {
        row[0]: row
        for row in DeadLetter.objects.filter(pk__in={letter.replayed_from for letter in linked})
        .annotate(returned=Count("boomerangs"))
        .values_list(
            "pk",
            "status",
            "status_changed_at",
            "broker_id",
            "broker__name",
            "original_exchange",
            "original_routing_keys",
            "original_queue",
            "returned",
            "source_queue",
        )
    }
    now = timezone.now().timestamp()
    events: dict[str, list[Event]] = {}
    counted: set[int] = set()
    for letter in linked:
        origin = origins.get(letter.replayed_from or 0)
        if origin is None or origin[0] in counted:
            continue
        key, replayed_at = _origin_key(origin, now=now)
        # The boomerang of a replay to a destination dies there, on the origin's broker: a letter that names
        # another destination, or an origin that came back before, is not this replay's return.
        if (
            not key
            or letter.broker_id != origin[3]
            or letter.source_queue != origin[9]
            or _destination_key(letter, broker=_scope(origin[4])) != key
        ):
            continue
        if origin[8] != sum(1 for other in linked if other.replayed_from == origin[0]):
            continue
        counted.add(origin[0])
        reason = f"a replay came back ({letter.death_reason}) from queue {letter.original_queue}"
        events.setdefault(key, []).append(Event(BOOMERANG, replayed_at=replayed_at, reason=reason))
    breakers = get_breakers()
    for key, reported in events.items():
        breakers.record(key, reported)
    return sum(len(reported) for reported in events.values())


def _origin_key(origin: tuple[Any, ...], *, now: float) -> tuple[str, float | None]:
    """The breaker key of where `origin` was replayed and when (None: just now), or ("", None) when its return does
    not count: replayed before the window, moved (where a move went is not kept on the dead letter), or in a state
    no replay leaves. An origin still waiting (parked, scheduled, failed) counts as replayed just now: a replay's
    dead letter keeps its status while its message is in flight, and a boomerang can be stored before the record
    of its confirm; _report takes such a return only from the origin's own dead-letter queue, where a replay that
    died again lands, so naming a dead letter from another queue's messages counts for nothing."""
    _pk, status, changed_at, _broker_id, broker_name, exchange, routing_keys, queue, _returned, _source = origin
    replayed_at: float | None = None
    if status == DeadLetterStatus.REPLAYED and changed_at is not None:
        replayed_at = changed_at.timestamp()
        if not 0 <= now - replayed_at <= settings.DLQ_BREAKER_WINDOW_SECONDS:
            return "", None
    elif status not in (DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED):
        return "", None
    keys = routing_keys if isinstance(routing_keys, list) else []
    return destination_key(exchange=exchange, routing_keys=keys, queue=queue, broker=_scope(broker_name)), replayed_at


def _scope(broker_name: str | None) -> str:
    return "" if not broker_name or broker_name == DEFAULT else broker_name


def _destination_key(letter: ParsedDeadLetter, *, broker: str) -> str:
    return destination_key(
        exchange=letter.original_exchange,
        routing_keys=list(letter.original_routing_keys),
        queue=letter.original_queue,
        broker=broker,
    )
