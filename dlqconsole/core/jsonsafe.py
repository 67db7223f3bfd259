"""Lossless JSON for AMQP header tables and properties.

pika decodes field tables into str, bytes, int, float, bool, None, Decimal, datetime, lists and dicts.
JSON (and PostgreSQL's jsonb, which also refuses NUL characters) cannot hold all of them, so values that JSON
cannot carry as is are tagged: {"$bytes": base64}, {"$str": base64 of UTF-8} for text containing NUL,
{"$ts": epoch seconds}, {"$dec": "1.50"}, {"$float": "nan"} for non-finite floats, and
{"$map": [[key, value], ...]} for a table whose keys would be mistaken for a tag, contain NUL or are not text.
`decode` turns the tagged form back into the values pika publishes.

`encode` never raises on what a broker can deliver; when it has to give something up (a table nested deeper
than `max_depth`, a value of a type it does not know) it keeps a readable form and, when given a `problems`
list, says so there. `decode` reads at most MAX_DECODE_DEPTH levels and raises TooDeep past them, a clear error
rather than a RecursionError at whatever depth the caller's stack happens to allow.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from decimal import Decimal
from typing import Any

TAGS = frozenset({"$bytes", "$str", "$ts", "$dec", "$map", "$float"})
# Levels of JSON (arrays and objects) decode reads. encode writes at most 64 levels of tables and arrays, each at
# most three levels of JSON in the "$map" form ({"$map": [[key, value]]}), so what ingest stored always fits; the
# bound keeps decode's recursion well inside Python's default limit of 1,000 frames, wherever it is called from.
MAX_DECODE_DEPTH = 400


class TooDeep(ValueError):
    """Stored JSON nested deeper than MAX_DECODE_DEPTH levels (never written by encode)."""


class RawTimestamp(int):
    """An AMQP timestamp (seconds since the epoch) that Python's datetime cannot represent (beyond year 9999)."""


class UndecodableField(bytes):
    """The raw bytes of a field-table entry the AMQP decoder could not read (an unknown field type)."""


def encode(value: Any, *, depth: int = 0, max_depth: int = 64, problems: list[str] | None = None) -> Any:
    kind = type(value)
    # The common types first: this runs for every header value of every ingested message.
    if kind is str:
        if "\x00" in value:
            return {"$str": base64.b64encode(value.encode("utf-8", "surrogatepass")).decode()}
        if value.isascii() or not _has_surrogates(value):
            return value
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if value is None or kind is int or kind is bool:
        return value
    if kind is dict:
        return _encode_table(value, depth=depth, max_depth=max_depth, problems=problems)
    if kind is list or kind is tuple:
        if depth >= max_depth:
            return _too_deep(value, problems)
        return [encode(item, depth=depth + 1, max_depth=max_depth, problems=problems) for item in value]
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return {"$ts": int(aware.timestamp())}
    if isinstance(value, RawTimestamp):
        if problems is not None:
            problems.append(f"timestamp {int(value)} is beyond the year 9999; kept as a number")
        return {"$ts": int(value)}
    if isinstance(value, UndecodableField):
        if problems is not None:
            problems.append(f"a header field of an unknown AMQP type could not be decoded; {len(value)} raw bytes kept")
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, bool | int):
        return int(value) if not isinstance(value, bool) else value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": repr(value)}
    if isinstance(value, str):
        return encode(str(value), depth=depth, max_depth=max_depth, problems=problems)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, dict):
        return _encode_table(dict(value), depth=depth, max_depth=max_depth, problems=problems)
    if isinstance(value, list | tuple):
        return encode(list(value), depth=depth, max_depth=max_depth, problems=problems)
    if problems is not None:
        problems.append(f"a value of type {type(value).__name__} was stored as its text")
    return {"$str": base64.b64encode(repr(value)[:10000].encode("utf-8", "replace")).decode()}


def _encode_table(value: dict[Any, Any], *, depth: int, max_depth: int, problems: list[str] | None) -> Any:
    if depth >= max_depth:
        return _too_deep(value, problems)
    encoded: dict[str, Any] = {}
    # One pass with the common values inlined (this runs for every header of every ingested message); a key
    # that is not plain text sends the whole table to the "$map" form below.
    for key, item in value.items():
        if type(key) is not str or key in TAGS or "\x00" in key:
            break
        kind = type(item)
        if kind is str:
            if "\x00" not in item and item.isascii():
                encoded[key] = item
                continue
        elif item is None or kind is int or kind is bool:
            encoded[key] = item
            continue
        encoded[key] = encode(item, depth=depth + 1, max_depth=max_depth, problems=problems)
    else:
        return encoded
    return {
        "$map": [
            [encode(key), encode(item, depth=depth + 1, max_depth=max_depth, problems=problems)]
            for key, item in value.items()
        ]
    }


def _too_deep(value: Any, problems: list[str] | None) -> Any:
    # A hostile, absurdly deep table: keep a readable form rather than recursing without end.
    if problems is not None:
        problems.append("a header table is nested deeper than 64 levels; the deeper part is stored as text")
    return {"$str": base64.b64encode(_short_repr(value).encode("utf-8", "replace")).decode()}


def _short_repr(value: Any) -> str:
    try:
        return repr(value)[:10000]
    except RecursionError:
        return "<too deeply nested to show>"


def decode(value: Any, *, depth: int = 0) -> Any:
    if not isinstance(value, list | dict):
        return value
    if depth >= MAX_DECODE_DEPTH:
        raise TooDeep(f"nested deeper than {MAX_DECODE_DEPTH} levels")
    if isinstance(value, list):
        return [decode(item, depth=depth + 1) for item in value]
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$bytes":
            return base64.b64decode(inner)
        if tag == "$str":
            return base64.b64decode(inner).decode("utf-8", "surrogatepass")
        if tag == "$ts":
            try:
                return dt.datetime.fromtimestamp(inner, tz=dt.UTC)
            except (OverflowError, OSError, ValueError):
                return RawTimestamp(inner)
        if tag == "$dec":
            return Decimal(inner)
        if tag == "$float":
            return float(inner)
        if tag == "$map":
            # The pairs list and each pair are levels of their own.
            return {_hashable(decode(key, depth=depth + 3)): decode(item, depth=depth + 3) for key, item in inner}
    return {key: decode(item, depth=depth + 1) for key, item in value.items()}


def to_text(value: Any, *, limit: int = 10000) -> str:
    """A header value as plain text, for parsing error messages and showing them."""
    value = decode(value) if isinstance(value, dict | list) else value
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:limit]
    if isinstance(value, str):
        return value[:limit]
    return str(value)[:limit]


def _hashable(key: Any) -> Any:
    # A key stored as a table or array (never written by us, but the stored JSON may have been edited).
    return key if isinstance(key, str | bytes | int | float | bool | None) else repr(key)


def _has_surrogates(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
