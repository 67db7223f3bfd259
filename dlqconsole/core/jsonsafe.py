"""Lossless JSON for AMQP header tables and properties.

pika decodes field tables into str, bytes, int, float, bool, None, Decimal, datetime, lists and dicts.
JSON (and PostgreSQL's jsonb, which also refuses NUL characters) cannot hold all of them, so values that JSON
cannot carry as is are tagged: {"$bytes": base64}, {"$str": base64 of UTF-8} for text containing NUL,
{"$ts": epoch seconds}, {"$dec": "1.50"}, and {"$map": [[key, value], ...]} for a table whose keys would be
mistaken for a tag or contain NUL. `decode` turns the tagged form back into the values pika publishes.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from decimal import Decimal
from typing import Any

TAGS = frozenset({"$bytes", "$str", "$ts", "$dec", "$map", "$float"})


def encode(value: Any, *, depth: int = 0, max_depth: int = 64) -> Any:
    if depth > max_depth:
        # A hostile, absurdly deep table: keep what we can show rather than recursing without end.
        return {"$str": base64.b64encode(repr(value)[:10000].encode()).decode()}
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": repr(value)}
    if isinstance(value, str):
        if "\x00" in value:
            return {"$str": base64.b64encode(value.encode("utf-8", "surrogatepass")).decode()}
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if _has_surrogates(value) else value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return {"$ts": int(aware.timestamp())}
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, list | tuple):
        return [encode(item, depth=depth + 1, max_depth=max_depth) for item in value]
    if isinstance(value, dict):
        keys = [_key_text(key) for key in value]
        if any(key in TAGS or "\x00" in key for key in keys):
            return {
                "$map": [
                    [encode(key), encode(item, depth=depth + 1, max_depth=max_depth)]
                    for key, item in zip(keys, value.values(), strict=True)
                ]
            }
        return {
            key: encode(item, depth=depth + 1, max_depth=max_depth)
            for key, item in zip(keys, value.values(), strict=True)
        }
    return {"$str": base64.b64encode(repr(value).encode()).decode()}


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$bytes":
            return base64.b64decode(inner)
        if tag == "$str":
            return base64.b64decode(inner).decode("utf-8", "surrogatepass")
        if tag == "$ts":
            return dt.datetime.fromtimestamp(inner, tz=dt.UTC)
        if tag == "$dec":
            return Decimal(inner)
        if tag == "$float":
            return float(inner)
        if tag == "$map":
            return {decode(key): decode(item) for key, item in inner}
    return {key: decode(item) for key, item in value.items()}


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


def _key_text(key: Any) -> str:
    if isinstance(key, bytes):
        return key.decode("utf-8", "replace")
    return str(key)


def _has_surrogates(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
