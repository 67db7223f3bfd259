"""Parse a dead-lettered AMQP message into the fields of a DeadLetter row.

`parse_envelope` never raises: whatever the broker hands over (binary bodies, headers of the wrong type,
nonsense timestamps, hostile strings) is stored as is, and every problem met is recorded in `parse_errors`.

Which headers fill which fields is told in headers.py, where they are read.

The body is stored as raw bytes; it is only checked against what the properties claim (JSON that does not
parse, text that is not UTF-8, a compressed encoding without its magic bytes, an unknown encoding).

`install_tolerant_decoding` (amqp_decoding.py) makes pika itself survive frames it cannot decode.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dlqconsole.core.amqp import DELIVERY_ANNOTATIONS
from dlqconsole.deadletters.classify import classify
from dlqconsole.deadletters.models import PERMANENT_REASONS, DeathReason, FailureReason
from dlqconsole.ingest.headers import (
    HeaderNames,
    header_names,
    header_table,
    lowered_names,
    read_celery,
    read_error_headers,
    read_properties,
    read_x_death,
    store_headers,
)

BROKER_FAILURE_REASON = {
    DeathReason.REJECTED: FailureReason.REJECTED,
    DeathReason.EXPIRED: FailureReason.EXPIRED,
    DeathReason.MAXLEN: FailureReason.MAXLEN,
    DeathReason.DELIVERY_LIMIT: FailureReason.DELIVERY_LIMIT,
}
# Encodings a body may legitimately declare (Celery writes "utf-8" and "binary").
KNOWN_CONTENT_ENCODINGS = frozenset(
    {
        "",
        "utf-8",
        "utf8",
        "us-ascii",
        "ascii",
        "latin-1",
        "iso-8859-1",
        "binary",
        "7bit",
        "8bit",
        "identity",
        "gzip",
        "x-gzip",
        "deflate",
        "zlib",
        "br",
        "zstd",
        "lz4",
        "snappy",
        "base64",
    }
)
COMPRESSED_MAGIC = {"gzip": b"\x1f\x8b", "x-gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}
# Bodies are checked against their content type only up to this size (a 20 MB JSON parse per message would
# cost more than the rest of ingest); larger ones are stored unchecked.
BODY_CHECK_LIMIT = 1024 * 1024


@dataclass(slots=True)
class ParsedDeadLetter:
    source_queue: str
    body: bytes
    # The broker it came from; None: the broker `default` (ingest_batch fills it in).
    broker_id: int | None = None
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
    # The JSON text of `headers` and `properties` as parse_envelope serialised them for the dedupe key, reused
    # by ingest so that each is serialised once. Empty when the dicts were built by hand; whoever changes the
    # dicts after parsing must clear these.
    headers_json: str = field(default="", repr=False)
    properties_json: str = field(default="", repr=False)
    # The broker's redelivered flag: only a redelivered copy whose hash is stored already is a duplicate; a first
    # delivery is always stored (a further occurrence of identical content is linked by identical_to).
    redelivered: bool = False
    identical_to: int | None = None
    # Cut at DLQ_MAX_BODY_BYTES: `body` holds the first part, `body_size` the size delivered.
    body_truncated: bool = False
    body_size: int = 0

    @property
    def content_hash(self) -> str:
        """The hash of everything delivered; dedupe_key is this, or this and an occurrence suffix."""
        return self.dedupe_key[:64]


def parse_envelope(
    *,
    source_queue: str,
    body: bytes,
    properties: Any,
    now: dt.datetime,
    redelivered: bool = False,
    broker_id: int | None = None,
    broker_scope: str = "",
) -> ParsedDeadLetter:
    """Turn one delivery (pika BasicProperties and body) into a ParsedDeadLetter. Never raises.

    `redelivered` is the broker's flag on the delivery (see ParsedDeadLetter.redelivered). `broker_scope` sets the
    dead letters of one broker's queue apart from those of the same queue name on another broker in the dedupe
    key: empty for the broker `default` (whose keys are as before brokers existed), else `broker_scope(id)`."""
    names = header_names()
    try:
        # All steps at once: the common case, and the cheap one (this runs for every ingested message).
        parsed, lowered = _parse(source_queue, body, properties, now, names, guarded=False)
    except Exception:  # noqa: BLE001  (some step failed: do it again step by step, recording what failed)
        try:
            parsed, lowered = _parse(source_queue, body, properties, now, names, guarded=True)
        except Exception as error:  # noqa: BLE001  (the header table itself is unusable: keep the body)
            parsed, lowered = ParsedDeadLetter(source_queue=source_queue, body=bytes(body)), {}
            parsed.parse_errors.append(f"the envelope could not be read: {type(error).__name__}: {error}"[:500])
    parsed.properties_json = _dumps(parsed.properties)
    parsed.headers_json = _dumps(parsed.headers)
    identity = parsed.headers_json
    if not DELIVERY_ANNOTATIONS.isdisjoint(lowered):
        identity = _dumps(
            {key: value for key, value in parsed.headers.items() if key.lower() not in DELIVERY_ANNOTATIONS}
        )
    parsed.dedupe_key = _identity_hash(broker_scope + source_queue, parsed.properties_json, identity, parsed.body)
    parsed.redelivered = redelivered
    parsed.broker_id = broker_id
    parsed.body_size = len(parsed.body)
    if parsed.body_size > names.max_body:
        _cut_body(parsed, names.max_body)
    return parsed


def _cut_body(parsed: ParsedDeadLetter, limit: int) -> None:
    """Keep the first `limit` bytes of a body over DLQ_MAX_BODY_BYTES, with its size and hash in parse_errors.

    Its identity (the dedupe key) is the whole body's. Such a dead letter cannot be replayed: the message sent
    would not be the one that died."""
    digest = hashlib.sha256(parsed.body).hexdigest()
    parsed.parse_errors.append(
        f"the body is {parsed.body_size:,} bytes, over DLQ_MAX_BODY_BYTES ({limit:,}): the first {limit:,} bytes are "
        f"kept (sha256 of the whole body {digest}); it cannot be replayed"
    )
    parsed.body = parsed.body[:limit]
    parsed.body_truncated = True


def _parse(
    source_queue: str, body: bytes, properties: Any, now: dt.datetime, names: HeaderNames, *, guarded: bool
) -> tuple[ParsedDeadLetter, dict[str, Any]]:
    """The parsed letter and the header table with lower-cased names."""
    parsed = ParsedDeadLetter(source_queue=source_queue, body=bytes(body))
    table = header_table(parsed, properties)
    lowered, original_names = lowered_names(table)
    if not guarded:
        read_properties(parsed, properties, now)
        read_x_death(parsed, lowered, now, names)
        read_celery(parsed, lowered)
        read_error_headers(parsed, lowered, names)
        _check_body(parsed)
        _classify(parsed)
        store_headers(parsed, table, original_names)
        return parsed, lowered
    _guard(parsed, "properties", read_properties, parsed, properties, now)
    _guard(parsed, "x-death", read_x_death, parsed, lowered, now, names)
    _guard(parsed, "celery headers", read_celery, parsed, lowered)
    _guard(parsed, "error headers", read_error_headers, parsed, lowered, names)
    _guard(parsed, "body", _check_body, parsed)
    _guard(parsed, "classification", _classify, parsed)
    _guard(parsed, "headers", store_headers, parsed, table, original_names)
    return parsed, lowered


def broker_scope(broker_id: int, *, default: bool) -> str:
    """What a dead letter's dedupe key adds before its queue's name: nothing for the broker `default`."""
    return "" if default else f"broker:{broker_id}\x00"


def dedupe_key(
    *, source_queue: str, body: bytes, properties: dict[str, Any], headers: Any, broker_scope: str = ""
) -> str:
    """A hash of everything the broker delivered (the queue, properties, headers and body in their stored
    JSON form). A redelivered copy (or a duplicate from at-least-once dead-lettering) hashes the same; the same
    message dying again has a new x-death count or time, and a replayed one carries a higher replay count, so
    it hashes differently. parse_envelope leaves out the delivery annotations of the queue we consume from."""
    return _identity_hash(broker_scope + source_queue, _dumps(properties), _dumps(headers), body)


def _identity_hash(source_queue: str, properties_json: str, headers_json: str, body: bytes) -> str:
    digest = hashlib.sha256(source_queue.encode("utf-8", "replace"))
    digest.update(b"\x00")
    digest.update(properties_json.encode("utf-8", "replace"))
    digest.update(b"\x00")
    digest.update(headers_json.encode("utf-8", "replace"))
    digest.update(b"\x00")
    digest.update(body)
    return digest.hexdigest()


# Sorted keys: the text is part of the dedupe key, so it must not depend on the order headers came in (a broker
# that re-encodes a redelivered message must not make it a new dead letter). Text as it is, not as \u escapes
# (a third cheaper). One encoder for all calls (json.dumps with options builds a new one each time).
_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode


def _guard(parsed: ParsedDeadLetter, what: str, step: Any, *args: Any) -> None:
    try:
        step(*args)
    except Exception as error:  # noqa: BLE001  (record the problem, keep the message)
        parsed.parse_errors.append(f"{what}: {type(error).__name__}: {error}"[:500])


def _check_body(parsed: ParsedDeadLetter) -> None:
    body = parsed.body
    if not body:
        parsed.parse_errors.append("the body is empty")
        return
    if parsed.content_type == "application/json" and parsed.content_encoding in ("", "utf-8") and len(body) < 65536:
        # The usual case, checked the short way; anything wrong is described by the long way below.
        try:
            json.loads(body.decode())
            return
        except (ValueError, RecursionError):
            pass
    encoding = parsed.content_encoding.strip().lower()
    if encoding not in KNOWN_CONTENT_ENCODINGS:
        parsed.parse_errors.append(f"unknown content encoding {parsed.content_encoding[:64]!r}")
        return
    magic = COMPRESSED_MAGIC.get(encoding)
    if magic is not None and not body.startswith(magic):
        parsed.parse_errors.append(f"the body does not start like {encoding} data")
        return
    if encoding in ("gzip", "x-gzip", "deflate", "zlib", "br", "zstd", "lz4", "snappy", "base64"):
        return
    media_type, _, parameters = parsed.content_type.partition(";")
    media_type = media_type.strip().lower()
    is_json = media_type == "application/json" or media_type.endswith("+json")
    if not (is_json or media_type.startswith("text/")) or len(body) > BODY_CHECK_LIMIT:
        return
    charset = parameters.lower().partition("charset=")[2].strip().strip('"') or "utf-8"
    try:
        text = body.decode(charset)
    except LookupError:
        parsed.parse_errors.append(f"unknown charset {charset[:40]!r}")
        return
    except UnicodeDecodeError as error:
        parsed.parse_errors.append(f"the body is not {charset} text ({error.reason} at byte {error.start})")
        return
    if is_json:
        try:
            json.loads(text)
        except RecursionError:
            parsed.parse_errors.append("the JSON body is nested too deeply to parse")
        except ValueError as error:
            parsed.parse_errors.append(f"the body is not valid JSON: {str(error)[:200]}")


def _classify(parsed: ParsedDeadLetter) -> None:
    classified = classify(error_type=parsed.error_type, message=parsed.error_message, stack_trace=parsed.stack_trace)
    if classified is None:
        classified = BROKER_FAILURE_REASON.get(DeathReason(parsed.death_reason), FailureReason.UNKNOWN)
    parsed.failure_reason = classified
    parsed.transient = classified not in PERMANENT_REASONS
