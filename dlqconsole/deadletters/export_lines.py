"""The dead letters of an export, read in bounded pieces and written as CSV or JSON lines (exports.py runs them).

Reads are keyset chunks of at most CHUNK ids, whose rows are then fetched in batches of at most BATCH_ROWS rows and
BATCH_BYTES of bodies (a single larger body is a batch of its own), each read under a statement timeout
(DLQ_EXPORT_READ_TIMEOUT_SECONDS, on PostgreSQL). A read that times out ends the lines with an `export_error` line
saying so, rather than hanging. A body goes out in pieces of PIECE characters spliced between the other cells, so
memory holds about one body at a time, however large the bodies and however many rows.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import csv
import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, transaction

from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import DeadLetter

logger = logging.getLogger(__name__)

# Ids (and body sizes) read per keyset step; the rows themselves are read in smaller batches.
CHUNK = 1000
# A batch of full rows: at most this many, whose bodies add up to at most BATCH_BYTES. Headers and properties
# are bounded by AMQP's frame size (128 KB by default), so the rows of a batch stay within a few megabytes.
BATCH_ROWS = 100
BATCH_BYTES = 4 * 1024 * 1024
# A large body is written this many characters at a time, so a row never needs its body in memory twice over.
PIECE = 1024 * 1024
# The first cell (CSV) or key (JSON lines) of the line that ends an export which stopped early.
ERROR_MARKER = "export_error"
# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout.
QUERY_CANCELED = "57014"
COLUMNS = (
    "id",
    "ingested_at",
    "status",
    "source_queue",
    "original_queue",
    "original_exchange",
    "original_routing_keys",
    "death_reason",
    "failure_reason",
    "error_type",
    "error_message",
    "attempt_count",
    "first_failed_at",
    "last_failed_at",
    "host",
    "app_version",
    "message_id",
    "correlation_id",
    "priority",
    "content_type",
    "content_encoding",
    "task_name",
    "task_id",
    "pattern_id",
    "replay_count",
    "body_size",
    "body_encoding",
    "body",
    "headers",
    "properties",
    "x_death",
)
# A spreadsheet runs a cell starting with one of these as a formula; dead letters carry text from anywhere.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


# Reading ---------------------------------------------------------------------------------------------------------


class Reader:
    """Every matching dead letter, newest first: keyset chunks of ids (no OFFSET, no server-side cursor), their rows
    in batches bounded by rows and body bytes, each read under the statement timeout.

    A read that times out ends the iteration early with `stopped` saying so; `count` is how many were read.
    `renew` is called after each batch (the export's leases).
    """

    def __init__(self, chosen: DeadLetterFilter, *, renew: Callable[[], None] | None = None) -> None:
        self.chosen = chosen
        self.renew = renew or (lambda: None)
        self.count = 0
        self.stopped = ""

    def __iter__(self) -> Iterator[DeadLetter]:
        found = self.chosen.apply().order_by("-id")
        last: int | None = None
        try:
            while True:
                page = found.filter(pk__lt=last) if last is not None else found
                with _read_timeout():
                    sizes = list(page.values_list("pk", "body_size")[:CHUNK])
                if not sizes:
                    return
                for batch in _batches(sizes):
                    with _read_timeout():
                        rows = list(DeadLetter.objects.filter(pk__in=batch).order_by("-id"))
                    self.renew()
                    while rows:
                        self.count += 1
                        # Handed over, not kept: once written, a row (and its body) is nobody's.
                        yield rows.pop(0)
                last = sizes[-1][0]
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) != QUERY_CANCELED:
                raise
            timeout = settings.DLQ_EXPORT_READ_TIMEOUT_SECONDS
            self.stopped = (
                f"Reading the database took longer than {timeout:g} s after {self.count} dead letters, so the export "
                "stopped there; a narrower filter reads less."
            )
            logger.warning("export stopped after %s dead letters: a read took longer than %g s", self.count, timeout)


def _batches(sizes: list[tuple[int, int]]) -> Iterator[list[int]]:
    """The ids in batches of at most BATCH_ROWS whose body sizes add up to at most BATCH_BYTES (at least one id)."""
    batch: list[int] = []
    total = 0
    for pk, size in sizes:
        if batch and (len(batch) >= BATCH_ROWS or total + size > BATCH_BYTES):
            yield batch
            batch, total = [], 0
        batch.append(pk)
        total += size
    if batch:
        yield batch


@contextlib.contextmanager
def _read_timeout() -> Iterator[None]:
    """One read under DLQ_EXPORT_READ_TIMEOUT_SECONDS: PostgreSQL's statement_timeout, for its own transaction
    only. Other databases have no such timeout."""
    if connection.vendor != "postgresql":
        yield
        return
    milliseconds = max(1, round(settings.DLQ_EXPORT_READ_TIMEOUT_SECONDS * 1000))
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(milliseconds)])
        yield


# Writing ---------------------------------------------------------------------------------------------------------


def fields(letter: DeadLetter, *, body_encoding: str) -> dict[str, Any]:
    """Every column of a dead letter but its body, which goes out in pieces (body_pieces)."""
    values: dict[str, Any] = {name: getattr(letter, name, None) for name in COLUMNS if name != "body"}
    values.update(
        ingested_at=_iso(letter.ingested_at),
        first_failed_at=_iso(letter.first_failed_at),
        last_failed_at=_iso(letter.last_failed_at),
        body_encoding=body_encoding,
    )
    return values


def body_encoding(body: bytes) -> str:
    """ "utf-8" when the body is valid UTF-8, else "base64"; checked a piece at a time, never decoded whole."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    try:
        for start in range(0, len(view), PIECE):
            decoder.decode(view[start : start + PIECE])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return "base64"
    return "utf-8"


def body_pieces(body: bytes, *, encoding: str) -> Iterator[str]:
    """The body as text in pieces of about PIECE characters: decoded UTF-8, or base64 (whole groups of three bytes
    a piece, so the pieces join into the body's base64)."""
    view = memoryview(body)
    if encoding == "base64":
        step = PIECE // 4 * 3
        for start in range(0, len(view), step):
            yield base64.b64encode(view[start : start + step]).decode()
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, len(view), PIECE):
        yield decoder.decode(view[start : start + PIECE])
    yield decoder.decode(b"", final=True)


def csv_lines(letters: Reader) -> Iterator[str]:
    """CSV, each body written between the other cells in pieces, quoted by hand as RFC 4180 (and the csv module)
    quote: csv.writer would hold a 16 MB body several times over (its record buffer takes four bytes a character)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def row(cells: list[str]) -> str:
        writer.writerow(cells)
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    def pieces(letter: DeadLetter) -> Iterator[str]:
        body = bytes(letter.body)
        encoding = body_encoding(body)
        if encoding == "utf-8" and b"\x00" in body:
            # A NUL inside a CSV cell breaks spreadsheets and many CSV readers: such a body goes as base64, as a
            # body that is not UTF-8 does (the body_encoding column says which).
            encoding = "base64"
        values = fields(letter, body_encoding=encoding)
        cells = [_cell(values[name]) for name in COLUMNS if name != "body"]
        at = COLUMNS.index("body")
        yield row(cells[:at]).removesuffix("\r\n") + ',"'
        for index, piece in enumerate(body_pieces(body, encoding=encoding)):
            yield ("'" + piece if index == 0 and piece.startswith(FORMULA_START) else piece).replace('"', '""')
        yield '",' + row(cells[at:])

    yield row(list(COLUMNS))
    for letter in letters:
        size = len(letter.body)
        line = pieces(letter)
        # Let go of the row: while the next one is read, only its pieces still being written hold it.
        del letter
        yield from _joined(line, size=size)
    if letters.stopped:
        yield row([ERROR_MARKER, letters.stopped])


def jsonl_lines(letters: Reader) -> Iterator[str]:
    """JSON lines, each body's JSON string written in pieces between the other keys."""

    def pieces(letter: DeadLetter) -> Iterator[str]:
        body = bytes(letter.body)
        encoding = body_encoding(body)
        values = fields(letter, body_encoding=encoding)
        at = COLUMNS.index("body")
        before = json.dumps({name: values[name] for name in COLUMNS[:at]}, ensure_ascii=False, default=str)
        after = json.dumps({name: values[name] for name in COLUMNS[at + 1 :]}, ensure_ascii=False, default=str)
        yield before.removesuffix("}") + ', "body": "'
        # Each piece is escaped on its own: JSON escapes character by character, so the pieces join correctly.
        for piece in body_pieces(body, encoding=encoding):
            yield json.dumps(piece, ensure_ascii=False)[1:-1]
        yield '", ' + after.removeprefix("{") + "\n"

    for letter in letters:
        size = len(letter.body)
        line = pieces(letter)
        del letter
        yield from _joined(line, size=size)
    if letters.stopped:
        yield json.dumps({ERROR_MARKER: letters.stopped}, ensure_ascii=False) + "\n"


def _joined(pieces: Iterator[str], *, size: int) -> Iterator[str]:
    """A row as one string when its body is small (one write each), piece by piece when it is large."""
    if size <= PIECE:
        yield "".join(pieces)
    else:
        yield from pieces


def lines(letters: Reader, *, export_format: str) -> Iterator[str]:
    return csv_lines(letters) if export_format == "csv" else jsonl_lines(letters)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else str(value)
    if isinstance(value, str) and text.startswith(FORMULA_START):
        return "'" + text
    return text


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
