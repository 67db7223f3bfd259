"""Parse a dead-lettered AMQP message into the fields of a DeadLetter row.

`parse_envelope` never raises: whatever the broker hands over (binary bodies, headers of the wrong type,
nonsense timestamps, hostile strings) is stored as is, and every problem met is recorded in `parse_errors`.

Headers read (names compared without regard to case):
- `x-death` (every entry: queue, reason, exchange, routing-keys, count, time, original-expiration),
  `x-first-death-queue|reason|exchange`, `x-last-death-queue|reason|exchange`, `x-delivery-count`;
- Celery task protocol v2: `task`, `id`, `retries`, `argsrepr`, `kwargsrepr`, `origin`, `root_id`, `parent_id`;
- application error headers, from the settings DLQ_ERROR_TYPE_HEADERS, DLQ_ERROR_MESSAGE_HEADERS,
  DLQ_STACK_TRACE_HEADERS, DLQ_HOST_HEADERS and DLQ_VERSION_HEADERS (Spring AMQP, MassTransit and
  NServiceBus names are in the defaults);
- `x-original-exchange`, `x-original-routingKey` (Spring's republishing recoverer) when x-death is absent;
- the replay-count header DLQ_REPLAY_COUNT_HEADER that our own replays add.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from dlqconsole.core import jsonsafe
from dlqconsole.deadletters.models import PERMANENT_REASONS, DeathReason, FailureReason
from dlqconsole.ingest.classify import classify

PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
DEATH_REASONS = {choice.value for choice in DeathReason}
BROKER_FAILURE_REASON = {
    DeathReason.REJECTED: FailureReason.REJECTED,
    DeathReason.EXPIRED: FailureReason.EXPIRED,
    DeathReason.MAXLEN: FailureReason.MAXLEN,
    DeathReason.DELIVERY_LIMIT: FailureReason.DELIVERY_LIMIT,
}
# Timestamps outside this window are nonsense (a sender's bug, or a hostile header): kept raw, not used.
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
LATEST_AHEAD = dt.timedelta(days=2)


@dataclass
class ParsedDeadLetter:
    source_queue: str
    body: bytes
    dedupe_key: str = ""
    original_queue: str = ""
    original_exchange: str = ""
    original_routing_keys: list[str] = field(default_factory=list)
    death_reason: str = DeathReason.UNKNOWN
    failure_reason: str = FailureReason.UNKNOWN
    transient: bool = True
    error_type: str = ""
    error_message: str = ""
    stack_trace: str = ""
    attempt_count: int = 1
    first_failed_at: dt.datetime | None = None
    last_failed_at: dt.datetime | None = None
    host: str = ""
    app_version: str = ""
    message_id: str = ""
    correlation_id: str = ""
    priority: int | None = None
    content_type: str = ""
    content_encoding: str = ""
    task_name: str = ""
    task_id: str = ""
    task_retries: int | None = None
    replay_count: int = 0
    replayed_from: int | None = None
    fingerprint: str = ""
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    x_death: list[Any] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)


def parse_envelope(*, source_queue: str, body: bytes, properties: Any, now: dt.datetime) -> ParsedDeadLetter:
    """Turn one delivery (pika BasicProperties and body) into a ParsedDeadLetter. Never raises."""
    parsed = ParsedDeadLetter(source_queue=source_queue, body=bytes(body))
    raw_headers: Any = getattr(properties, "headers", None)
    if raw_headers is None:
        raw_headers = {}
    elif not isinstance(raw_headers, dict):
        parsed.parse_errors.append(f"headers is a {type(raw_headers).__name__}, not a table")
        raw_headers = {"headers": raw_headers}
    headers = {_text(key): value for key, value in raw_headers.items()}
    lowered = {key.lower(): value for key, value in headers.items()}

    _guard(parsed, "properties", _read_properties, parsed, properties)
    _guard(parsed, "x-death", _read_x_death, parsed, lowered, now)
    _guard(parsed, "celery headers", _read_celery, parsed, lowered)
    _guard(parsed, "error headers", _read_error_headers, parsed, lowered)
    _guard(parsed, "classification", _classify, parsed)
    try:
        parsed.headers = jsonsafe.encode(headers)
    except Exception as error:  # noqa: BLE001  (a hostile table must not stop ingest)
        parsed.parse_errors.append(f"headers could not be stored: {error!r}"[:500])
        parsed.headers = {"$str": ""}
    parsed.dedupe_key = dedupe_key(
        source_queue=source_queue, body=parsed.body, properties=parsed.properties, headers=parsed.headers
    )
    return parsed


def dedupe_key(*, source_queue: str, body: bytes, properties: dict[str, Any], headers: Any) -> str:
    """A hash of everything the broker delivered. A redelivered copy (or a duplicate from at-least-once
    dead-lettering) hashes the same; the same message dying again has a new x-death count or time, and a
    replayed one carries a higher replay count, so it hashes differently."""
    digest = hashlib.sha256()
    digest.update(source_queue.encode("utf-8", "replace"))
    digest.update(b"\x00")
    digest.update(json.dumps([properties, headers], sort_keys=True, default=str).encode("utf-8", "replace"))
    digest.update(b"\x00")
    digest.update(body)
    return digest.hexdigest()


def _guard(parsed: ParsedDeadLetter, what: str, step: Any, *args: Any) -> None:
    try:
        step(*args)
    except Exception as error:  # noqa: BLE001  (record the problem, keep the message)
        parsed.parse_errors.append(f"{what}: {type(error).__name__}: {error}"[:500])


def _read_properties(parsed: ParsedDeadLetter, properties: Any) -> None:
    stored: dict[str, Any] = {}
    for name in PROPERTY_NAMES:
        value = getattr(properties, name, None)
        if value is not None:
            stored[name] = jsonsafe.encode(value)
    parsed.properties = stored
    parsed.message_id = _text(properties.message_id)[:255]
    parsed.correlation_id = _text(properties.correlation_id)[:255]
    parsed.content_type = _text(properties.content_type)[:255]
    parsed.content_encoding = _text(properties.content_encoding)[:255]
    priority = properties.priority
    if priority is not None:
        if isinstance(priority, int) and 0 <= priority <= 255:
            parsed.priority = priority
        else:
            parsed.parse_errors.append(f"priority {priority!r} is not an integer from 0 to 255")


def _read_x_death(parsed: ParsedDeadLetter, headers: dict[str, Any], now: dt.datetime) -> None:
    raw = headers.get("x-death")
    entries: list[dict[str, Any]] = []
    if raw is None:
        parsed.parse_errors.append("no x-death header")
    elif not isinstance(raw, list):
        parsed.parse_errors.append(f"x-death is a {type(raw).__name__}, not an array")
    else:
        for position, entry in enumerate(raw):
            if isinstance(entry, dict):
                entries.append({_text(key): value for key, value in entry.items()})
            else:
                parsed.parse_errors.append(f"x-death[{position}] is a {type(entry).__name__}, not a table")
    parsed.x_death = jsonsafe.encode(entries)

    newest = entries[0] if entries else {}
    queue = _text(newest.get("queue")) or _text(headers.get("x-last-death-queue"))
    queue = queue or _text(headers.get("x-first-death-queue"))
    exchange_value = newest.get("exchange", headers.get("x-last-death-exchange", headers.get("x-original-exchange")))
    routing_keys = newest.get("routing-keys")
    if routing_keys is None and "x-original-routingkey" in headers:
        routing_keys = [headers["x-original-routingkey"]]
    if routing_keys is not None and not isinstance(routing_keys, list):
        parsed.parse_errors.append(f"x-death routing-keys is a {type(routing_keys).__name__}, not an array")
        routing_keys = [routing_keys]
    reason = _text(newest.get("reason")) or _text(headers.get("x-last-death-reason"))
    reason = reason or _text(headers.get("x-first-death-reason"))

    parsed.original_queue = queue[:255]
    parsed.original_exchange = _text(exchange_value)[:255]
    parsed.original_routing_keys = [_text(key)[:255] for key in (routing_keys or [])][:32]
    if reason in DEATH_REASONS:
        parsed.death_reason = reason
    elif reason:
        parsed.parse_errors.append(f"unknown death reason {reason[:64]!r}")

    counts = []
    times = []
    for entry in entries:
        count = entry.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and 0 < count < 2**31:
            counts.append(count)
        elif count is not None:
            parsed.parse_errors.append(f"x-death count {str(count)[:40]!r} is not a positive integer")
        moment = entry.get("time")
        if isinstance(moment, dt.datetime):
            aware = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
            if EARLIEST <= aware <= now + LATEST_AHEAD:
                times.append(aware)
            else:
                parsed.parse_errors.append(f"x-death time {aware.isoformat()} is out of range")
        elif moment is not None:
            parsed.parse_errors.append(f"x-death time {str(moment)[:40]!r} is not a timestamp")
    delivery_count = headers.get("x-delivery-count")
    attempts = sum(counts) if counts else 1
    if isinstance(delivery_count, int) and not isinstance(delivery_count, bool) and 0 <= delivery_count < 2**31:
        attempts = max(attempts, delivery_count)
    parsed.attempt_count = max(1, min(attempts, 2**31 - 1))
    parsed.last_failed_at = max(times) if times else now
    parsed.first_failed_at = min(times) if times else parsed.last_failed_at

    replay_count = headers.get(settings.DLQ_REPLAY_COUNT_HEADER.lower())
    if isinstance(replay_count, int) and not isinstance(replay_count, bool) and 0 <= replay_count < 2**31:
        parsed.replay_count = replay_count
    replayed_from = headers.get(settings.DLQ_REPLAYED_FROM_HEADER.lower())
    if isinstance(replayed_from, int) and not isinstance(replayed_from, bool) and 0 < replayed_from < 2**63:
        parsed.replayed_from = replayed_from


def _read_celery(parsed: ParsedDeadLetter, headers: dict[str, Any]) -> None:
    task = headers.get("task")
    task_id = headers.get("id")
    if task is None or task_id is None:
        return
    parsed.task_name = _text(task)[:255]
    parsed.task_id = _text(task_id)[:255]
    retries = headers.get("retries")
    if isinstance(retries, int) and not isinstance(retries, bool) and 0 <= retries < 2**31:
        parsed.task_retries = retries
        parsed.attempt_count = max(parsed.attempt_count, retries + 1)
    origin = _text(headers.get("origin"))
    if origin and not parsed.host:
        # Celery writes "<pid>@<hostname>"; the host is what an operator recognises.
        parsed.host = origin.rpartition("@")[2][:255]


def _read_error_headers(parsed: ParsedDeadLetter, headers: dict[str, Any]) -> None:
    parsed.error_type = _first(headers, settings.DLQ_ERROR_TYPE_HEADERS)[:255]
    parsed.error_message = _first(headers, settings.DLQ_ERROR_MESSAGE_HEADERS, limit=20000)
    parsed.stack_trace = _first(headers, settings.DLQ_STACK_TRACE_HEADERS, limit=100000)
    host = _first(headers, settings.DLQ_HOST_HEADERS)
    if host:
        parsed.host = host[:255]
    parsed.app_version = _first(headers, settings.DLQ_VERSION_HEADERS)[:64]
    if not parsed.error_type and parsed.error_message:
        # "ValueError: bad id 42" carries its type in front of the message, as Python and Java print them.
        head, separator, rest = parsed.error_message.partition(": ")
        if separator and head and " " not in head and len(head) < 200 and (head[0].isupper() or "." in head):
            parsed.error_type = head
            parsed.error_message = rest


def _classify(parsed: ParsedDeadLetter) -> None:
    classified = classify(error_type=parsed.error_type, message=parsed.error_message, stack_trace=parsed.stack_trace)
    if classified is None:
        classified = BROKER_FAILURE_REASON.get(DeathReason(parsed.death_reason), FailureReason.UNKNOWN)
    parsed.failure_reason = classified
    parsed.transient = classified not in PERMANENT_REASONS


def _first(headers: dict[str, Any], names: list[str], *, limit: int = 1000) -> str:
    for name in names:
        value = headers.get(name.lower())
        if value is not None:
            text = jsonsafe.to_text(value, limit=limit).replace("\x00", "\ufffd")
            if text:
                return text
    return ""


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace").replace("\x00", "\ufffd")
    return str(value).replace("\x00", "\ufffd")
