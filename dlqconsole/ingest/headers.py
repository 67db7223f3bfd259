"""Read the fields of a dead letter from its AMQP properties and header table (steps of parse_envelope).

Headers read (names compared without regard to case):
- `x-death`, every entry as RabbitMQ 3.10 to 4.x writes it (newest first; `queue`, `reason`, `count`, `time`,
  `exchange`, `routing-keys`, `original-expiration`); `x-first-death-queue|reason|exchange` and (3.13+)
  `x-last-death-queue|reason|exchange` fill in when x-death is missing or incomplete; `x-delivery-count`
  (quorum queues) and `x-acquired-count` (4.x) raise the attempt count;
- Celery task protocol v2: `task`, `id`, `retries`, `origin` (`argsrepr`, `kwargsrepr`, `root_id`, `parent_id`,
  `eta` and the rest stay in the stored headers);
- application error headers, from the settings DLQ_ERROR_TYPE_HEADERS, DLQ_ERROR_MESSAGE_HEADERS,
  DLQ_STACK_TRACE_HEADERS, DLQ_HOST_HEADERS and DLQ_VERSION_HEADERS (Spring AMQP, MassTransit and
  NServiceBus names are in the defaults);
- `x-original-exchange`, `x-original-routingKey` (Spring's republishing recoverer) when x-death is absent;
- the replay headers DLQ_REPLAY_COUNT_HEADER and DLQ_REPLAYED_FROM_HEADER that our own replays add.

A value that does not fit its column is cut, and the cut noted in parse_errors; the header table is stored whole.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import pika
from django.conf import settings

from dlqconsole.core import jsonsafe
from dlqconsole.core.amqp import DELIVERY_ANNOTATIONS, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP_AHEAD, PROPERTY_NAMES
from dlqconsole.deadletters.fingerprint import leading_error_type
from dlqconsole.deadletters.models import DeathReason
from dlqconsole.ingest.amqp_decoding import UNDECODABLE_HEADER

if TYPE_CHECKING:
    # For the annotations only: envelope.py, where the letter is defined, runs these steps.
    from dlqconsole.ingest.envelope import ParsedDeadLetter

DEATH_REASONS = {choice.value for choice in DeathReason}
EARLIEST_SECONDS = EARLIEST_TIMESTAMP.timestamp()
INT32_MAX = 2**31 - 1
LARGE_TABLE = 256


@dataclass(frozen=True)
class HeaderNames:
    """The header names settings choose, prepared for lookups in a lower-cased header table."""

    errors: dict[str, tuple[str, int]]
    replay_count: str
    replay_count_lower: str
    replayed_from: str
    max_body: int


_header_names_cache: tuple[object, HeaderNames] | None = None


def header_names() -> HeaderNames:
    """HeaderNames for the current settings, computed again only when the settings object changes (tests
    override settings; reading six settings per message would cost more than the rest of a lookup)."""
    global _header_names_cache
    owner = getattr(settings, "_wrapped", None)
    cached = _header_names_cache
    if cached is not None and cached[0] is owner:
        return cached[1]
    errors: dict[str, tuple[str, int]] = {}
    lists = (
        settings.DLQ_ERROR_TYPE_HEADERS,
        settings.DLQ_ERROR_MESSAGE_HEADERS,
        settings.DLQ_STACK_TRACE_HEADERS,
        settings.DLQ_HOST_HEADERS,
        settings.DLQ_VERSION_HEADERS,
    )
    for field_name, names_of_field in zip(ERROR_FIELDS, lists, strict=True):
        for rank, name in enumerate(names_of_field):
            errors.setdefault(name.lower(), (field_name, rank))
    names = HeaderNames(
        errors=errors,
        replay_count=settings.DLQ_REPLAY_COUNT_HEADER,
        replay_count_lower=settings.DLQ_REPLAY_COUNT_HEADER.lower(),
        replayed_from=settings.DLQ_REPLAYED_FROM_HEADER.lower(),
        max_body=settings.DLQ_MAX_BODY_BYTES,
    )
    _header_names_cache = (getattr(settings, "_wrapped", None), names)
    return names


def lowered_names(table: dict[Any, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header table by lower-cased name (the first of the names that differ only in case wins), and the name
    each lower-cased one stands for."""
    lowered: dict[str, Any] = {}
    original_names: dict[str, Any] = {}
    for key, value in table.items():
        name = key.lower() if type(key) is str else _text(key).lower()
        if name not in lowered:
            lowered[name] = value
            original_names[name] = key
    return lowered, original_names


def header_table(parsed: ParsedDeadLetter, properties: Any) -> dict[Any, Any]:
    raw: Any = getattr(properties, "headers", None)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        parsed.parse_errors.append(f"headers is a {_kind(raw)}, not a table")
        return {"headers": raw}
    if UNDECODABLE_HEADER in raw:
        parsed.parse_errors.append(
            "the AMQP header frame could not be decoded; its raw bytes are kept in the header "
            f"{UNDECODABLE_HEADER} ({raw.get(UNDECODABLE_HEADER + '-error', 'unknown error')})"
        )
    for key in raw:
        if type(key) is not str:
            parsed.parse_errors.append(f"header name {bytes(key)[:80]!r} is not UTF-8 text")
        elif "\x00" in key:
            parsed.parse_errors.append(f"header name {key[:80]!r} contains NUL characters")
    if len(raw) > LARGE_TABLE:
        parsed.parse_errors.append(f"the header table has {len(raw)} entries")
    return raw


def store_headers(parsed: ParsedDeadLetter, table: dict[Any, Any], original_names: dict[str, Any]) -> None:
    headers = jsonsafe.encode(table, problems=parsed.parse_errors)
    parsed.headers = headers
    # The whole death history is also a column of its own, so pages and replays need not dig in the headers.
    key = original_names.get("x-death")
    if key is None or not isinstance(table[key], list):
        return
    entries = headers.get(key) if isinstance(key, str) else None
    if not isinstance(entries, list):
        # The table was stored in its "$map" form (odd keys elsewhere in it): encode the history on its own.
        entries = jsonsafe.encode(table[key])
    parsed.x_death = [entry for entry in entries if isinstance(entry, dict)]


def read_properties(parsed: ParsedDeadLetter, properties: Any, now: dt.datetime) -> None:
    # pika keeps the properties in the instance dict; reading it directly is cheaper than 13 getattr calls.
    values = vars(properties) if type(properties) is pika.BasicProperties else None
    raw: dict[str, Any] = {}
    stored: dict[str, Any] = {}
    for name in PROPERTY_NAMES:
        value = values.get(name) if values is not None else getattr(properties, name, None)
        if value is not None:
            raw[name] = value
            plain = type(value) is int or (type(value) is str and "\x00" not in value)
            stored[name] = value if plain else jsonsafe.encode(value)
    parsed.properties = stored
    parsed.message_id = _column(parsed, "message_id", raw.get("message_id"))
    parsed.correlation_id = _column(parsed, "correlation_id", raw.get("correlation_id"))
    parsed.content_type = _column(parsed, "content_type", raw.get("content_type"))
    parsed.content_encoding = _column(parsed, "content_encoding", raw.get("content_encoding"))
    priority = stored.get("priority")
    if priority is not None:
        if _is_int(priority) and 0 <= priority <= 255:
            parsed.priority = priority
            if priority > 9:
                parsed.parse_errors.append(f"priority {priority} is above 9, the AMQP 0-9-1 maximum")
        else:
            parsed.parse_errors.append(f"priority {str(priority)[:40]!r} is not an integer from 0 to 255")
    timestamp = stored.get("timestamp")
    if timestamp is not None:
        if not _is_int(timestamp):
            parsed.parse_errors.append(f"timestamp property {str(timestamp)[:40]!r} is not a number of seconds")
        elif not EARLIEST_SECONDS <= timestamp <= (now + LATEST_TIMESTAMP_AHEAD).timestamp():
            parsed.parse_errors.append(f"timestamp property {timestamp} is out of range")


def read_x_death(parsed: ParsedDeadLetter, headers: dict[str, Any], now: dt.datetime, names: HeaderNames) -> None:
    raw = headers.get("x-death")
    entries: list[dict[Any, Any]] = []
    if raw is None:
        parsed.parse_errors.append("no x-death header")
    elif type(raw) is not list:
        parsed.parse_errors.append(f"x-death is a {_kind(raw)}, not an array")
    elif not raw:
        parsed.parse_errors.append("x-death is empty")
    else:
        for position, entry in enumerate(raw):
            if type(entry) is dict:
                entries.append(entry)
            else:
                parsed.parse_errors.append(f"x-death[{position}] is a {_kind(entry)}, not a table")

    # The newest entry comes first; it names where the message was last consumed from.
    newest = entries[0] if entries else {}
    queue = _string(parsed, "x-death queue", newest.get("queue"))
    queue = queue or _string(parsed, "x-last-death-queue", headers.get("x-last-death-queue"))
    queue = queue or _string(parsed, "x-first-death-queue", headers.get("x-first-death-queue"))
    if "exchange" in newest:
        exchange = _string(parsed, "x-death exchange", newest["exchange"])
    elif "x-last-death-exchange" in headers:
        exchange = _string(parsed, "x-last-death-exchange", headers["x-last-death-exchange"])
    elif "x-first-death-exchange" in headers and not entries:
        exchange = _string(parsed, "x-first-death-exchange", headers["x-first-death-exchange"])
    else:
        exchange = _string(parsed, "x-original-exchange", headers.get("x-original-exchange"))
    routing_keys = newest.get("routing-keys")
    if routing_keys is None and "x-original-routingkey" in headers:
        routing_keys = [headers["x-original-routingkey"]]
    if routing_keys is not None and type(routing_keys) is not list:
        parsed.parse_errors.append(f"x-death routing-keys is a {_kind(routing_keys)}, not an array")
        routing_keys = [routing_keys]
    reason = _string(parsed, "x-death reason", newest.get("reason"))
    reason = reason or _string(parsed, "x-last-death-reason", headers.get("x-last-death-reason"))
    reason = reason or _string(parsed, "x-first-death-reason", headers.get("x-first-death-reason"))

    parsed.original_queue = _column(parsed, "original queue", queue)
    parsed.original_exchange = _column(parsed, "original exchange", exchange)
    if routing_keys:
        parsed.original_routing_keys = [
            _column(parsed, "routing key", key if isinstance(key, str | bytes) else str(key))
            for key in routing_keys[:32]
        ]
    if reason in DEATH_REASONS:
        parsed.death_reason = reason
    elif reason:
        parsed.parse_errors.append(f"unknown death reason {reason[:64]!r}")

    attempts = 0
    first = last = None
    for position, entry in enumerate(entries):
        count = entry.get("count")
        if _is_int(count) and 0 < count <= INT32_MAX:
            attempts += count
        elif count is not None:
            parsed.parse_errors.append(f"x-death[{position}] count {str(count)[:40]!r} is not a positive integer")
        moment = entry.get("time")
        if isinstance(moment, dt.datetime):
            aware = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
            if EARLIEST_TIMESTAMP <= aware <= now + LATEST_TIMESTAMP_AHEAD:
                first = aware if first is None or aware < first else first
                last = aware if last is None or aware > last else last
            else:
                parsed.parse_errors.append(f"x-death[{position}] time {aware.isoformat()} is out of range")
        elif moment is not None:
            parsed.parse_errors.append(f"x-death[{position}] time {str(moment)[:40]!r} is not a timestamp")
    attempts = attempts or 1
    for name in DELIVERY_ANNOTATIONS:
        delivered = headers.get(name)
        if delivered is None:
            continue
        if _is_int(delivered) and 0 <= delivered < INT32_MAX:
            # A quorum queue counts redeliveries before the death (n redeliveries mean n + 1 attempts);
            # RabbitMQ 4 counts every acquisition.
            attempts = max(attempts, delivered + 1 if name == "x-delivery-count" else delivered)
        else:
            parsed.parse_errors.append(f"{name} {str(delivered)[:40]!r} is not a count")
    parsed.attempt_count = min(attempts, INT32_MAX)
    parsed.last_failed_at = last or now
    parsed.first_failed_at = first or parsed.last_failed_at

    replay_header = names.replay_count
    replay_count = headers.get(names.replay_count_lower)
    if replay_count is not None:
        if _is_int(replay_count) and 0 <= replay_count <= INT32_MAX:
            parsed.replay_count = replay_count
        else:
            parsed.parse_errors.append(f"{replay_header} {str(replay_count)[:40]!r} is not a count")
    replayed_from = headers.get(names.replayed_from)
    if _is_int(replayed_from) and 0 < replayed_from < 2**63:
        parsed.replayed_from = replayed_from


def read_celery(parsed: ParsedDeadLetter, headers: dict[str, Any]) -> None:
    task = headers.get("task")
    task_id = headers.get("id")
    if task is None or task_id is None:
        return
    parsed.task_name = _column(parsed, "Celery task name", _string(parsed, "Celery task", task))
    parsed.task_id = _column(parsed, "Celery task id", _string(parsed, "Celery id", task_id))
    retries = headers.get("retries")
    if _is_int(retries) and 0 <= retries < INT32_MAX:
        parsed.task_retries = retries
        parsed.attempt_count = max(parsed.attempt_count, retries + 1)
    elif retries is not None:
        parsed.parse_errors.append(f"Celery retries {str(retries)[:40]!r} is not a count")
    origin = _string(parsed, "Celery origin", headers.get("origin"))
    if origin and not parsed.host:
        # Celery writes "<pid>@<hostname>"; the host is what an operator recognises.
        parsed.host = _column(parsed, "host", origin.rpartition("@")[2])


ERROR_FIELDS = ("error_type", "error_message", "stack_trace", "host", "app_version")
TEXT_LIMITS = {"error_type": 255, "error_message": 20000, "stack_trace": 100000, "host": 255, "app_version": 64}


def read_error_headers(parsed: ParsedDeadLetter, headers: dict[str, Any], names: HeaderNames) -> None:
    index = names.errors
    found: dict[str, tuple[int, Any]] = {}
    for name, value in headers.items():
        slot = index.get(name)
        # An empty value does not hide a less preferred header that has text.
        if slot is None or value is None or value == "" or value == b"":
            continue
        field_name, rank = slot
        previous = found.get(field_name)
        if previous is None or rank < previous[0]:
            found[field_name] = (rank, value)
    for field_name, (_, value) in found.items():
        what = field_name.replace("_", " ")
        limit = TEXT_LIMITS[field_name]
        if type(value) is str:
            text = value
        elif isinstance(value, bytes):
            text = value.decode("utf-8", "replace")
            if "\ufffd" in text:
                parsed.parse_errors.append(f"{what} is not UTF-8 text")
        else:
            text = jsonsafe.to_text(value, limit=limit + 1)
        # The column keeps what fits; the whole value stays in the stored headers.
        setattr(parsed, field_name, _column(parsed, what, text, limit=limit))
    if not parsed.error_type and parsed.error_message:
        # "ValueError: bad id 42" carries its type in front of the message, as Python and Java print them.
        parsed.error_type, parsed.error_message = leading_error_type(parsed.error_message)


def _column(parsed: ParsedDeadLetter, what: str, value: Any, *, limit: int = 255) -> str:
    """A value for a varchar column: text, without NUL (PostgreSQL refuses it), at most `limit` characters.
    The original stays in the stored headers or properties; the change is noted."""
    if not value:
        return ""
    text = value if type(value) is str else _text(value)
    if len(text) > limit:
        parsed.parse_errors.append(f"{what} is {len(text)} characters long; the column keeps the first {limit}")
        text = text[:limit]
    if "\x00" in text:
        parsed.parse_errors.append(f"{what} contains NUL characters, shown as U+FFFD")
        text = text.replace("\x00", "\ufffd")
    return text


def _string(parsed: ParsedDeadLetter, what: str, value: Any) -> str:
    """A header value that should be text; anything else is noted and shown as text."""
    if type(value) is str:
        return value
    if value is None:
        return ""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
        if "\ufffd" in text:
            parsed.parse_errors.append(f"{what} is not UTF-8 text")
        return text
    parsed.parse_errors.append(f"{what} is a {_kind(value)}, not text")
    return _text(value)[:1000]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool | jsonsafe.RawTimestamp))


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bytes):
        return "byte array"
    if isinstance(value, dt.datetime | jsonsafe.RawTimestamp):
        return "timestamp"
    return type(value).__name__
