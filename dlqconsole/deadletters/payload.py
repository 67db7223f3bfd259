"""How a dead letter's body and headers are shown: JSON pretty-printed, else text, else a hex dump.

Everything returned here is plain text; templates escape it. Nothing is ever rendered as markup.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import zlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from dlqconsole.core import jsonsafe

DEATH_HEADERS = frozenset({"x-death", "x-delivery-count", "x-acquired-count"})


@dataclass(frozen=True)
class ShownBody:
    kind: str  # "json", "text", "hex" or "empty"
    text: str
    truncated: bool
    size: int
    note: str = ""


def show_body(*, body: bytes, content_type: str = "", content_encoding: str = "") -> ShownBody:
    limit = settings.DLQ_BODY_PREVIEW_BYTES
    size = len(body)
    if not body:
        return ShownBody(kind="empty", text="", truncated=False, size=0)
    note = ""
    if content_encoding.lower() in ("gzip", "deflate"):
        inflated = _inflate(body, limit=limit * 4)
        if inflated is not None:
            body = inflated
            note = f"decompressed from {content_encoding}"
    truncated = len(body) > limit
    preview = body[:limit]
    if not truncated:
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            pass
        else:
            if isinstance(parsed, dict | list) or "json" in content_type.lower():
                return ShownBody(
                    kind="json",
                    text=json.dumps(parsed, indent=2, ensure_ascii=False),
                    truncated=False,
                    size=size,
                    note=note,
                )
    try:
        text = preview.decode("utf-8")
    except UnicodeDecodeError as error:
        # A cut in the middle of a character at the preview limit is still text.
        if truncated and error.start >= len(preview) - 3:
            text = preview[: error.start].decode("utf-8")
        else:
            return ShownBody(kind="hex", text=hex_dump(preview), truncated=truncated, size=size, note=note)
    if _mostly_printable(text):
        return ShownBody(kind="text", text=text, truncated=truncated, size=size, note=note)
    return ShownBody(kind="hex", text=hex_dump(preview), truncated=truncated, size=size, note=note)


def hex_dump(data: bytes, *, width: int = 16) -> str:
    lines = []
    for offset in range(0, len(data), width):
        chunk = data[offset : offset + width]
        hex_part = " ".join(f"{byte:02x}" for byte in chunk)
        text_part = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{offset:08x}  {hex_part:<{width * 3}} {text_part}")
    return "\n".join(lines)


def header_rows(headers: Any) -> list[tuple[str, str, str]]:
    """(name, value as text, type) for each header, in the order received; x-death is shown elsewhere."""
    decoded = jsonsafe.decode(headers) if isinstance(headers, dict | list) else headers
    if not isinstance(decoded, dict):
        return [("(headers)", value_text(decoded), type(decoded).__name__)]
    return [
        (str(name), value_text(value), type(value).__name__)
        for name, value in decoded.items()
        if str(name).lower() != "x-death"
    ]


def value_text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + value.hex()
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, str):
        return value
    if isinstance(value, Decimal | int | float | bool) or value is None:
        return json.dumps(value, default=str)
    return json.dumps(value, default=_json_default, ensure_ascii=False, indent=None)


def death_timeline(x_death: Any) -> list[dict[str, Any]]:
    """The x-death entries, oldest first (RabbitMQ keeps the newest first), as plain values."""
    decoded = jsonsafe.decode(x_death) if isinstance(x_death, list | dict) else []
    if not isinstance(decoded, list):
        return []
    entries: list[dict[str, Any]] = []
    for entry in decoded:
        if not isinstance(entry, dict):
            entries.append({"raw": value_text(entry)})
            continue
        entries.append(
            {
                "time": entry.get("time") if isinstance(entry.get("time"), dt.datetime) else None,
                "queue": value_text(entry.get("queue", "")) if entry.get("queue") is not None else "",
                "reason": value_text(entry.get("reason", "")) if entry.get("reason") is not None else "",
                "exchange": value_text(entry.get("exchange", "")) if entry.get("exchange") is not None else "",
                "routing_keys": ", ".join(value_text(key) for key in entry.get("routing-keys") or [])
                if isinstance(entry.get("routing-keys"), list)
                else value_text(entry.get("routing-keys", "")),
                "count": entry.get("count"),
                "extra": {
                    str(key): value_text(value)
                    for key, value in entry.items()
                    if key not in ("time", "queue", "reason", "exchange", "routing-keys", "count")
                },
            }
        )
    entries.reverse()
    return entries


def is_death_header(name: str) -> bool:
    """Headers the broker writes when a message dies; a replay strips them (see DESIGN.md)."""
    lowered = name.lower()
    return lowered in DEATH_HEADERS or lowered.startswith(("x-first-death-", "x-last-death-"))


def headers_as_json(headers: Any, *, leave_out: frozenset[str] = frozenset()) -> str:
    """Headers as editable JSON without the death headers and the names in `leave_out` (lower case), in the
    tagged form of core.jsonsafe, so bytes and timestamps survive an edit."""
    if isinstance(headers, dict):
        headers = {
            key: value
            for key, value in headers.items()
            if not is_death_header(key) and str(key).lower() not in leave_out
        }
    return json.dumps(headers, indent=2, ensure_ascii=False)


def error_header_names() -> frozenset[str]:
    """The headers a failing consumer writes about its failure (type, message, stack trace), lower case."""
    names = [*settings.DLQ_ERROR_TYPE_HEADERS, *settings.DLQ_ERROR_MESSAGE_HEADERS, *settings.DLQ_STACK_TRACE_HEADERS]
    return frozenset(name.lower() for name in names)


def body_as_text(body: bytes) -> str | None:
    """The body as editable text, or None when a form cannot give it back unchanged (see text_problem)."""
    if text_problem(body):
        return None
    return body.decode("utf-8")


def text_problem(body: bytes) -> str:
    """Why a form's textarea cannot carry this body unchanged ("" when it can): it is not UTF-8; it holds NUL,
    which browsers turn into U+FFFD; or it has carriage returns other than CRLF line endings throughout (a form
    sends every line break as CRLF, so only LF-only and CRLF-only bodies can be told apart and kept)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "the payload is not UTF-8 text"
    if "\x00" in text:
        return "the payload holds NUL characters, which a browser form cannot carry"
    if "\r" in text and (text.count("\r") != text.count("\r\n") or text.count("\n") != text.count("\r\n")):
        return "the payload mixes line endings (CR, LF, CRLF), which a browser form would change"
    return ""


def with_line_endings_of(original: str, edited: str) -> str:
    """The edited text (line breaks as LF) with the original's line endings: CRLF when it used CRLF."""
    return edited.replace("\n", "\r\n") if "\r\n" in original else edited


def _inflate(body: bytes, *, limit: int) -> bytes | None:
    # Bounded: a small hostile body must not inflate into gigabytes in the web process.
    try:
        inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
        return inflater.decompress(body, limit)
    except zlib.error:
        return None


def _mostly_printable(text: str) -> bool:
    if not text:
        return True
    control = sum(1 for char in text if ord(char) < 32 and char not in "\n\r\t")
    return control <= len(text) // 100


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value_text(value)
    return str(value)


def _formatted_json(text: str) -> str | None:
    """A JSON object or array laid out one member per line, or None when the text is not one."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # a deeply nested payload is diffed as text, as the detail page shows it
        return None


def unified_diff(before: str, after: str, *, name: str) -> list[tuple[str, str]]:
    """(kind, line) pairs of a unified diff, kind one of add, del, hunk, same; empty when nothing changed.

    Two JSON documents are compared laid out one member per line, so a change in a one-line payload shows as the
    member that changed rather than as the whole line (the text sent is the one typed, unchanged)."""
    if before != after:
        formatted = _formatted_json(before), _formatted_json(after)
        if formatted[0] is not None and formatted[1] is not None:
            before, after = formatted[0], formatted[1]
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), fromfile=f"{name} (original)", tofile=f"{name} (edited)", lineterm=""
    )
    shown = []
    for line in lines:
        if line.startswith(("---", "+++")):
            continue
        kind = (
            "hunk"
            if line.startswith("@@")
            else "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "same"
        )
        shown.append((kind, line))
    return shown
