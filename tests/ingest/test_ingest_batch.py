from __future__ import annotations

import datetime as dt

import pika
import pytest
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern, PatternStatus
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.services import ingest_batch

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def death(queue: str = "orders", reason: str = "rejected", count: int = 1) -> dict[str, object]:
    return {
        "count": count,
        "reason": reason,
        "queue": queue,
        "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
        "exchange": "shop",
        "routing-keys": ["orders.created"],
    }


def letter(body: bytes, **headers: object):  # type: ignore[no-untyped-def]
    properties = pika.BasicProperties(
        message_id=f"m-{body.decode(errors='replace')}", content_type="application/json", headers=headers
    )
    return parse_envelope(source_queue="orders.dlq", body=body, properties=properties, now=timezone.now())


def test_ingest_is_idempotent_and_counts_once() -> None:
    batch = [
        letter(str(n).encode(), **{"x-death": [death()], "x-exception-message": f"timed out after {n}ms"})
        for n in range(10)
    ]
    first = ingest_batch(letters=batch)
    for redelivered in batch:
        redelivered.redelivered = True  # the broker's flag on a delivery that comes back after a crash
    again = ingest_batch(letters=batch)

    assert (first.inserted, again.inserted, again.duplicates) == (10, 0, 10)
    assert DeadLetter.objects.count() == 10
    pattern = FailurePattern.objects.get()
    assert pattern.template == "timed out after <NUM>ms"
    assert pattern.total_count == 10
    assert DeadLetterCount.objects.get().count == 10
    stored = DeadLetter.objects.get(message_id="m-3")
    assert (stored.original_queue, stored.original_exchange, stored.original_routing_keys) == (
        "orders",
        "shop",
        ["orders.created"],
    )
    assert stored.failure_reason == "TIMEOUT"
    assert bytes(stored.body) == b"3"


def test_resolved_pattern_reopens_on_new_arrival() -> None:
    ingest_batch(letters=[letter(b"a", **{"x-death": [death()], "x-exception-message": "boom 1"})])
    FailurePattern.objects.update(status=PatternStatus.RESOLVED)

    ingest_batch(letters=[letter(b"b", **{"x-death": [death()], "x-exception-message": "boom 2"})])

    pattern = FailurePattern.objects.get()
    assert pattern.status == PatternStatus.OPEN
    assert pattern.events.filter(kind="reopened").count() == 1
