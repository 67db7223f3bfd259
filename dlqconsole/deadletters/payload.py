"""How a dead letter's body and headers are shown: JSON laid out, else text, else a hex dump.

Everything returned here is plain text; templates escape it. Nothing is ever rendered as markup.

Rendering is bounded, as dead letters are untrusted: anyone who may publish to a vhost can put any body and headers
in a DLQ, and no page may grow with them. A page shows the body's first DLQ_BODY_PREVIEW_BYTES; JSON is laid out only
when it is nested at most JSON_MAX_DEPTH levels and its laid-out form stays within four times the preview, and is
otherwise shown as text, as it was sent; a header value shows its first VALUE_CHARS_SHOWN characters, the page its
first HEADER_ROWS_SHOWN headers, the newest DEATHS_SHOWN x-death entries and the first PROBLEMS_SHOWN parse
problems; the admin's raw JSON fields their first RAW_JSON_CHARS_SHOWN characters. Each cut says what it left out,
and the page links to the raw body and to the whole record. Escaping for HTML makes text up to six times longer
(an apostrophe becomes `&#x27;`); the limits leave room for that, so that no page exceeds 5 MB whatever the dead
letter holds (tests/deadletters/test_hostile_rendering.py).
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.template.defaultfilters import filesizeformat

from dlqconsole.core import jsonsafe
from dlqconsole.core.amqp import is_death_header

# A body nested deeper is shown as text: laid out, each level indents every line inside it by two more spaces.
JSON_MAX_DEPTH = 100
# One header or property value, and one header name (AMQP names are at most 255 bytes).
VALUE_CHARS_SHOWN = 1000
NAME_CHARS_SHOWN = 255
HEADER_ROWS_SHOWN = 100
# The newest entries of the death history, and of each entry its first fields besides the usual ones.
DEATHS_SHOWN = 20
DEATH_FIELDS_SHOWN = 10
DEATH_VALUE_CHARS_SHOWN = 200
DEATH_FIELDS = frozenset({"time", "queue", "reason", "exchange", "routing-keys", "count"})
PROBLEMS_SHOWN = 50
# Each of the admin's raw JSON fields (headers, properties, x-death, parse errors).
RAW_JSON_CHARS_SHOWN = 64 * 1024
# Each diff of the edit page (payload, headers): its first lines and characters.
DIFF_LINES_SHOWN = 2000
DIFF_CHARS_SHOWN = 100_000
# The edit page's text fields as HTML, escaped: the payload's, and the headers'.
FORM_BODY_HTML_BYTES = 2 * 1024 * 1024
FORM_HEADERS_HTML_BYTES = 512 * 1024

KIND_NAMES = {"json": "JSON", "text": "UTF-8 text", "hex": "binary, hex dump", "empty": "empty body"}


@dataclass(frozen=True)
class ShownBody:
    kind: str  # "json", "text", "hex" or "empty"
    text: str
    truncated: bool
    size: int
    note: str = ""
    # Why a JSON body is shown as text rather than laid out ("" when it is not JSON, or laid out).
    shown_as_text: str = ""
    # The bytes of the body (decompressed, when it was) that the text shows, when truncated.
    shown_bytes: int = 0
    inflated: bool = False

    @property
    def description(self) -> str:
        """What is shown, in words: "JSON, shown as text: nested deeper than 100 levels", "binary, hex dump,
        first 64.0 KB of 20.0 MB shown"."""
        parts = ["JSON" if self.shown_as_text else KIND_NAMES[self.kind]]
        if self.note:
            parts.append(self.note)
        if self.shown_as_text:
            parts.append(f"shown as text: {self.shown_as_text}")
        if self.truncated:
            whole = "the decompressed body" if self.inflated else filesizeformat(self.size)
            parts.append(f"first {filesizeformat(self.shown_bytes)} of {whole} shown")
        return ", ".join(parts)


@dataclass(frozen=True)
class ShownValue:
    text: str
    # What was left out, in words ("first 1,000 of 1,048,576 characters shown"); "" when nothing was.
    cut: str = ""

    def __str__(self) -> str:
        return f"{self.text} … [{self.cut}]" if self.cut else self.text


@dataclass(frozen=True)
class HeaderRow:
    name: str
    value: str
    kind: str
    cut: str = ""


def laid_out_limit() -> int:
    """The most characters a body's JSON takes laid out; a larger one is shown as text, as sent."""
    return 4 * settings.DLQ_BODY_PREVIEW_BYTES


def show_body(*, body: bytes, content_type: str = "", content_encoding: str = "") -> ShownBody:
    limit = settings.DLQ_BODY_PREVIEW_BYTES
    size = len(body)
    if not body:
        return ShownBody(kind="empty", text="", truncated=False, size=0)
    note = ""
    inflated = False
    if content_encoding.lower() in ("gzip", "deflate"):
        # One byte past the preview tells whether the decompressed body is longer than it.
        decompressed = _inflate(body, limit=limit + 1)
        if decompressed is not None:
            body, note, inflated = decompressed, f"decompressed from {content_encoding}", True
    truncated = len(body) > limit
    preview = body[:limit]
    shown_as_text = ""
    if not truncated:
        laid_out, shown_as_text = _laid_out_body(body, content_type=content_type)
        if laid_out is not None:
            return ShownBody(kind="json", text=laid_out, truncated=False, size=size, note=note)
    as_text = ShownBody(
        kind="text",
        text="",
        truncated=truncated,
        size=size,
        note=note,
        shown_as_text=shown_as_text,
        shown_bytes=len(preview),
        inflated=inflated,
    )
    try:
        text = preview.decode("utf-8")
    except UnicodeDecodeError as error:
        # A cut in the middle of a character at the preview limit is still text.
        if not (truncated and error.start >= len(preview) - 3):
            return replace(as_text, kind="hex", text=hex_dump(preview))
        text = preview[: error.start].decode("utf-8")
        as_text = replace(as_text, shown_bytes=error.start)
    if _mostly_printable(text):
        return replace(as_text, text=text)
    return replace(as_text, kind="hex", text=hex_dump(preview[: as_text.shown_bytes]))


def _laid_out_body(body: bytes, *, content_type: str) -> tuple[str | None, str]:
    """The body as laid-out JSON, or None and why not ("" when it is not JSON at all)."""
    try:
        parsed = json.loads(body)
    except RecursionError:
        # Deeper than the parser's own stack allows: far past JSON_MAX_DEPTH.
        return None, f"nested deeper than {JSON_MAX_DEPTH} levels"
    except ValueError:
        return None, ""
    if not (isinstance(parsed, dict | list) or "json" in content_type.lower()):
        return None, ""
    return laid_out_json(parsed, max_chars=laid_out_limit())


def laid_out_json(value: Any, *, max_chars: int) -> tuple[str | None, str]:
    """JSON values laid out with an indentation of two spaces a level, or None and why not: nested deeper than
    JSON_MAX_DEPTH levels, or longer than `max_chars` laid out (the writing stops there: 64 KB of deeply nested
    arrays lays out into tens of megabytes)."""
    if _deeper_than(value, JSON_MAX_DEPTH):
        return None, f"nested deeper than {JSON_MAX_DEPTH} levels"
    pieces: list[str] = []
    length = 0
    for piece in _LAY_OUT.iterencode(value):
        length += len(piece)
        if length > max_chars:
            return None, f"laid out with indentation it would be more than {max_chars:,} characters"
        pieces.append(piece)
    return _printable("".join(pieces)), ""


_LAY_OUT = json.JSONEncoder(indent=2, ensure_ascii=False, default=str)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels, found without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def hex_dump(data: bytes, *, width: int = 16) -> str:
    lines = []
    for offset in range(0, len(data), width):
        chunk = data[offset : offset + width]
        hex_part = " ".join(f"{byte:02x}" for byte in chunk)
        text_part = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{offset:08x}  {hex_part:<{width * 3}} {text_part}")
    return "\n".join(lines)


def header_rows(headers: Any) -> list[HeaderRow]:
    """Each header (name, value as text, type, what was cut), in the order received; x-death is shown elsewhere."""
    try:
        decoded = jsonsafe.decode(headers) if isinstance(headers, dict | list) else headers
    except jsonsafe.TooDeep as problem:
        shown = show_value(headers)
        return [HeaderRow("(headers)", shown.text, "table", _joined(f"shown as stored: {problem}", shown.cut))]
    if not isinstance(decoded, dict):
        shown = show_value(decoded)
        return [HeaderRow("(headers)", shown.text, type(decoded).__name__, shown.cut)]
    rows = []
    for name, value in decoded.items():
        if str(name).lower() == "x-death":
            continue
        shown = show_value(value)
        rows.append(HeaderRow(_printable(str(name)[:NAME_CHARS_SHOWN]), shown.text, type(value).__name__, shown.cut))
    return rows


def show_value(value: Any, *, limit: int = VALUE_CHARS_SHOWN) -> ShownValue:
    """A header or property value as text, at most `limit` characters of it: text as it is, bytes as UTF-8 text
    (else hex), times in ISO 8601, tables and arrays as one line of JSON."""
    if isinstance(value, dict | list | tuple):
        return _cut(_one_line(value), limit=limit)
    return _cut(iter([_scalar_text(value)]), limit=limit)


def value_text(value: Any, *, limit: int = VALUE_CHARS_SHOWN) -> str:
    """show_value in one string, the cut (if any) said at its end."""
    return str(show_value(value, limit=limit))


def _scalar_text(value: Any) -> str:
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
    return str(value)


def _json_scalar(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float | bool) or value is None:
        return json.dumps(value)
    if isinstance(value, bytes):
        return json.dumps(_scalar_text(value), ensure_ascii=False)
    return json.dumps(str(value), ensure_ascii=False)


_NO_KEY = object()


def _one_line(value: Any) -> Iterator[str]:
    """The value as one line of JSON, piece by piece and without recursion (a table may nest deeper than Python's
    stack); the caller stops reading once it has enough."""
    stack: list[tuple[Iterator[tuple[Any, Any]], str]] = []
    members: Iterator[tuple[Any, Any]] = iter([(_NO_KEY, value)])
    closer = ""
    first = True
    while True:
        member = next(members, None)
        if member is None:
            yield closer
            if not stack:
                return
            members, closer = stack.pop()
            first = False
            continue
        key, item = member
        if not first:
            yield ", "
        first = False
        if key is not _NO_KEY:
            yield _json_scalar(key if isinstance(key, str) else _scalar_text(key)) + ": "
        if isinstance(item, dict):
            stack.append((members, closer))
            members, closer, first = iter(item.items()), "}", True
            yield "{"
        elif isinstance(item, list | tuple):
            stack.append((members, closer))
            members, closer, first = ((_NO_KEY, inner) for inner in item), "]", True
            yield "["
        else:
            yield _json_scalar(item)


def _cut(pieces: Iterator[str], *, limit: int) -> ShownValue:
    """The first `limit` characters of the pieces, and what was left out (all of them are counted)."""
    kept: list[str] = []
    length = 0
    for piece in pieces:
        if length < limit:
            kept.append(piece[: limit - length])
        length += len(piece)
    text = _printable("".join(kept))
    if length <= limit:
        return ShownValue(text)
    return ShownValue(text, cut=f"first {limit:,} of {length:,} characters shown")


def _joined(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def _printable(text: str) -> str:
    """The text, with lone surrogates (which UTF-8 cannot carry, so a page holding one could not be sent) written
    as the escapes JSON would use for them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def show_json(value: Any, *, limit: int = RAW_JSON_CHARS_SHOWN) -> ShownValue:
    """Stored JSON (headers, properties, x-death in core.jsonsafe's tagged form) laid out, when it is nested at
    most JSON_MAX_DEPTH levels and takes at most `limit` characters so; else on one line, cut at `limit`."""
    laid_out, reason = laid_out_json(value, max_chars=limit)
    if laid_out is not None:
        return ShownValue(laid_out)
    shown = _cut(_one_line(value), limit=limit)
    return ShownValue(shown.text, cut=_joined(f"shown on one line: {reason}", shown.cut))


@dataclass(frozen=True)
class DeathEntry:
    time: dt.datetime | None = None
    queue: str = ""
    reason: str = ""
    exchange: str = ""
    routing_keys: str = ""
    count: Any = None
    extra: dict[str, str] = field(default_factory=dict)
    # Fields left out of `extra` (beyond DEATH_FIELDS_SHOWN).
    more_fields: int = 0
    # An entry that is not a table, as text.
    raw: str = ""


def death_timeline(x_death: Any) -> list[DeathEntry]:
    """The newest DEATHS_SHOWN x-death entries, oldest first (RabbitMQ keeps the newest first), as plain values."""
    if not isinstance(x_death, list):
        return []
    try:
        decoded = jsonsafe.decode(x_death[:DEATHS_SHOWN])
    except jsonsafe.TooDeep as problem:
        return [DeathEntry(raw=f"{value_text(x_death[:DEATHS_SHOWN])} ({problem})")]
    entries = [_death_entry(entry) for entry in decoded]
    entries.reverse()
    return entries


def _death_entry(entry: Any) -> DeathEntry:
    def text(value: Any) -> str:
        return "" if value is None else value_text(value, limit=DEATH_VALUE_CHARS_SHOWN)

    if not isinstance(entry, dict):
        return DeathEntry(raw=text(entry))
    keys = entry.get("routing-keys")
    extra = [(str(key), value) for key, value in entry.items() if key not in DEATH_FIELDS]
    return DeathEntry(
        time=entry.get("time") if isinstance(entry.get("time"), dt.datetime) else None,
        queue=text(entry.get("queue")),
        reason=text(entry.get("reason")),
        exchange=text(entry.get("exchange")),
        routing_keys=str(_cut(_listed(keys), limit=DEATH_VALUE_CHARS_SHOWN)) if isinstance(keys, list) else text(keys),
        count=entry.get("count") if isinstance(entry.get("count"), int) else text(entry.get("count")),
        extra={_printable(key[:NAME_CHARS_SHOWN]): text(value) for key, value in extra[:DEATH_FIELDS_SHOWN]},
        more_fields=max(0, len(extra) - DEATH_FIELDS_SHOWN),
    )


def _listed(values: list[Any]) -> Iterator[str]:
    for index, value in enumerate(values):
        if index:
            yield ", "
        yield _scalar_text(value)


def headers_as_json(headers: Any, *, leave_out: frozenset[str] = frozenset()) -> str:
    """Headers as editable JSON without the death headers and the names in `leave_out` (lower case), in the
    tagged form of core.jsonsafe, so bytes and timestamps survive an edit. Laid out when that takes at most
    FORM_HEADERS_HTML_BYTES characters, else on one line (form_size_problem says when they are too large for a form)."""
    if isinstance(headers, dict):
        headers = {
            key: value
            for key, value in headers.items()
            if not is_death_header(key) and str(key).lower() not in leave_out
        }
    laid_out, _ = laid_out_json(headers, max_chars=FORM_HEADERS_HTML_BYTES)
    return laid_out if laid_out is not None else json.dumps(headers, ensure_ascii=False)


def html_bytes(text: str) -> int:
    """The bytes `text` takes in a page once escaped (Django escapes & < > " and ')."""
    escaped = 4 * text.count("&") + 3 * (text.count("<") + text.count(">")) + 5 * (text.count('"') + text.count("'"))
    return len(text.encode("utf-8", "surrogatepass")) + escaped


def form_size_problem(*, body: str, headers: str) -> str:
    """Why the edit page cannot carry this text in its fields ("" when it can): escaped for HTML, a payload of
    quotes or angle brackets takes up to six times its size."""
    body_bytes = html_bytes(body)
    if body_bytes > FORM_BODY_HTML_BYTES:
        return (
            f"the payload is too large to edit in a form: escaped for the page it takes {filesizeformat(body_bytes)}, "
            f"and at most {filesizeformat(FORM_BODY_HTML_BYTES)} fit"
        )
    headers_bytes = html_bytes(headers)
    if headers_bytes > FORM_HEADERS_HTML_BYTES:
        return (
            f"the headers are too large to edit in a form: escaped for the page they take "
            f"{filesizeformat(headers_bytes)}, and at most {filesizeformat(FORM_HEADERS_HTML_BYTES)} fit"
        )
    return ""


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


def _formatted_json(text: str) -> str | None:
    """A JSON object or array laid out one member per line, or None when the text is not one, or is one that the
    detail page shows as text (nested too deeply, or too large laid out): it is then diffed as text."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    laid_out, _ = laid_out_json(parsed, max_chars=laid_out_limit())
    return laid_out


def unified_diff(before: str, after: str, *, name: str) -> list[tuple[str, str]]:
    """(kind, line) pairs of a unified diff, kind one of add, del, hunk, same; empty when nothing changed. Past
    DIFF_LINES_SHOWN lines or DIFF_CHARS_SHOWN characters the diff stops with a last pair of kind "cut" saying so.

    Two JSON documents are compared laid out one member per line, so a change in a one-line payload shows as the
    member that changed rather than as the whole line (the text sent is the one typed, unchanged)."""
    if before != after:
        formatted = _formatted_json(before), _formatted_json(after)
        if formatted[0] is not None and formatted[1] is not None:
            before, after = formatted[0], formatted[1]
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), fromfile=f"{name} (original)", tofile=f"{name} (edited)", lineterm=""
    )
    shown: list[tuple[str, str]] = []
    length = 0
    for line in lines:
        if line.startswith(("---", "+++")):
            continue
        length += len(line)
        if length > DIFF_CHARS_SHOWN or len(shown) == DIFF_LINES_SHOWN:
            shown.append(
                (
                    "cut",
                    f"… the rest is left out: the diff is longer than {DIFF_LINES_SHOWN:,} lines "
                    f"or {DIFF_CHARS_SHOWN:,} characters",
                )
            )
            break
        kind = (
            "hunk"
            if line.startswith("@@")
            else "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "same"
        )
        shown.append((kind, _printable(line)))
    return shown
