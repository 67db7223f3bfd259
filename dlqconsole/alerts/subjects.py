"""What an alert is about, as its subject key says it: "queue:orders.dlq" (a queue of the broker default),
"queue@staging:orders.dlq" (the queue of that name on the broker staging), "pattern:12", "operation:7".

A rule covering every queue raises one alert per subject, so the same queue name on two brokers is two subjects. The
key of a queue of the broker default is the one it had before there were several brokers: its open alerts, their
cooldowns and the growth history recorded under it carry on. Another broker's name goes between "queue" and the
first colon. Broker names hold neither "@" nor ":", so the first colon always ends the kind and the broker, and
whatever follows it is the queue's name, colons and slashes included: a queue of the broker default named
"staging/orders.dlq" or "queue@staging:x" is never read as another broker's.
"""

from __future__ import annotations

import re

from dlqconsole.brokers.models import DEFAULT, NAME_PATTERN
from dlqconsole.core.bidi import isolate

QUEUE = "queue"
_BROKER_NAME = re.compile(NAME_PATTERN)


def queue_subject(queue: str, *, broker: str = DEFAULT) -> str:
    if broker == DEFAULT:
        return f"{QUEUE}:{queue}"
    return f"{QUEUE}@{broker}:{queue}"


def parse_queue_subject(subject: str) -> tuple[str, str] | None:
    """(broker name, queue name) of a queue subject; None for any other subject (or a malformed one)."""
    kind, colon, queue = subject.partition(":")
    if not colon:
        return None
    if kind == QUEUE:
        return DEFAULT, queue
    prefix, at, broker = kind.partition("@")
    if prefix == QUEUE and at and _BROKER_NAME.fullmatch(broker) and broker != DEFAULT:
        return broker, queue
    return None


def pattern_subject(pk: int) -> str:
    return f"pattern:{pk}"


def pattern_growth_key(pk: int, *, broker: str) -> str:
    """The growth history of a pattern's dead letters on one broker (a rule scoped to a broker and a pattern): apart
    from "pattern:12", the history of the pattern's total on every broker."""
    return f"pattern@{broker}:{pk}"


def subject_pattern_id(subject: str) -> int | None:
    kind, _, rest = subject.partition(":")
    return int(rest) if kind == "pattern" and rest.isdigit() else None


def queue_label(queue: str, *, broker: str, several: bool) -> str:
    """A queue as an alert's label and summary name it: with its broker where there are several, so "orders.dlq on
    staging" and "orders.dlq on default" read apart; the name alone where there is only the broker default."""
    return f"{isolate(queue)} on {broker}" if several else isolate(queue)
