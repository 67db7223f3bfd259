"""Dead letters for the page tests, made the way production makes them: parse_envelope, then ingest_batch
(so the counters the pages read are kept exactly as ingest keeps them)."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pika
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.envelope import ParsedDeadLetter, parse_envelope
from dlqconsole.ingest.services import ingest_batch

_serial = itertools.count(1)


def letter(
    *,
    queue: str = "orders",
    error: str = "Request timed out after 3000ms",
    error_type: str = "TimeoutError",
    body: bytes | None = None,
    headers: dict[str, Any] | None = None,
    priority: int | None = None,
    host: str = "web-1",
    version: str = "1.4.2",
    content_type: str = "application/json",
    reason: str = "rejected",
    exchange: str = "shop",
    routing_key: str = "orders.created",
) -> ParsedDeadLetter:
    serial = next(_serial)
    all_headers: dict[str, Any] = {
        "x-death": [
            {
                "count": 1,
                "reason": reason,
                "queue": queue,
                "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
                "exchange": exchange,
                "routing-keys": [routing_key],
            }
        ],
        "x-exception-type": error_type,
        "x-exception-message": error,
        "x-host": host,
        "x-app-version": version,
        **(headers or {}),
    }
    properties = pika.BasicProperties(
        message_id=f"msg-{serial}",
        content_type=content_type,
        priority=priority,
        headers=all_headers,
    )
    return parse_envelope(
        source_queue=f"{queue}.dlq",
        body=body if body is not None else f'{{"order": {serial}}}'.encode(),
        properties=properties,
        now=timezone.now(),
    )


def ingest(*letters: ParsedDeadLetter, now: dt.datetime | None = None) -> list[DeadLetter]:
    ingest_batch(letters=list(letters), now=now)
    keys = [item.dedupe_key for item in letters]
    found = {row.dedupe_key: row for row in DeadLetter.objects.filter(dedupe_key__in=keys)}
    return [found[key] for key in keys]


def many(count: int, **options: Any) -> list[DeadLetter]:
    return ingest(*(letter(**options) for _ in range(count)))
