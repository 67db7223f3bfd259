"""Boomerangs to the circuit breakers: a replay that died again within DLQ_BREAKER_WINDOW_SECONDS of its replay
counts against the breaker of the destination it was replayed to (core/breaker.py).

The destination is read from the boomerang itself: where it died now (its newest x-death) is where the replay went,
keyed as a retry to it would be (core.breaker.destination_key, the key Destination.limit_key gives). Reported after
ingest's commit, and never allowed to stop ingest: when Redis cannot be reached, boomerangs go uncounted for a while
instead of making every batch wait for its timeout."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django.conf import settings
from django.utils import timezone

from dlqconsole.brokers.models import DEFAULT, Broker
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
    origins = {
        pk: (status, changed_at)
        for pk, status, changed_at in DeadLetter.objects.filter(
            pk__in={letter.replayed_from for letter in linked}
        ).values_list("pk", "status", "status_changed_at")
    }
    names = dict(Broker.objects.filter(pk__in={letter.broker_id for letter in linked}).values_list("pk", "name"))
    now = timezone.now().timestamp()
    events: dict[str, list[Event]] = {}
    for letter in linked:
        origin = origins.get(letter.replayed_from or 0)
        if origin is None:
            continue
        status, changed_at = origin
        # Its record may not have landed yet (the boomerang was faster): then it was replayed just now.
        replayed = status in (DeadLetterStatus.REPLAYED, DeadLetterStatus.MOVED) and changed_at is not None
        replayed_at = changed_at.timestamp() if replayed else None
        if replayed_at is not None and now - replayed_at > settings.DLQ_BREAKER_WINDOW_SECONDS:
            continue
        name = names.get(letter.broker_id or 0, DEFAULT)
        key = _destination_key(letter, broker="" if name == DEFAULT else name)
        if key:
            reason = f"a replay came back ({letter.death_reason}) from queue {letter.original_queue}"
            events.setdefault(key, []).append(Event(BOOMERANG, replayed_at=replayed_at, reason=reason))
    breakers = get_breakers()
    for key, reported in events.items():
        breakers.record(key, reported)
    return sum(len(reported) for reported in events.values())


def _destination_key(letter: ParsedDeadLetter, *, broker: str) -> str:
    return destination_key(
        exchange=letter.original_exchange,
        routing_keys=list(letter.original_routing_keys),
        queue=letter.original_queue,
        broker=broker,
    )
