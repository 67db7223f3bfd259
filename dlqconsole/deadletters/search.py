"""The text a dead letter is found by: its error type, its error message (or, with none, the name grouping gives
the failure, which its pattern's template and the messages list show: "maxlen from orders"), and the first
DLQ_SEARCH_BODY_BYTES of its body decoded as UTF-8 (bytes that are not UTF-8 become U+FFFD), case-folded, one field
per line.

Stored in DeadLetter.search_text when the row is written, so that a substring search is one LIKE over one column,
which a trigram index (pg_trgm, GIN) answers on PostgreSQL without reading the rows. The body itself stays stored
byte for byte; this column is only ever searched, never shown. NULL means not computed yet (rows stored before the
column existed): the search reads those rows the slow way, and beat fills them in batches (search_fill.py).

Both sides are case-folded in Python (str.casefold: "Straße" finds "STRASSE", "ÜNÏCODE" finds "ünïcode"), never by
the database, so the column and the term always agree. What folding does not equate stays apart: a dotless "i" and
a dotted "İ" (Turkish), a letter and the same letter with a combining accent (no Unicode normalisation)."""

from __future__ import annotations

import re
from typing import Protocol

from django.conf import settings

# Trigrams: a shorter term has none, and no index can find it without reading every row.
MIN_SEARCH_CHARS = 3
# pg_trgm makes trigrams of runs of letters and digits only: a term needs one run of 3 (`---` or `a.b` has none).
INDEXABLE = re.compile(rf"[^\W_]{{{MIN_SEARCH_CHARS},}}")


class Failure(Protocol):
    """What names a failure that carries no error text: ingest's ParsedDeadLetter, or a stored DeadLetter."""

    source_queue: str
    original_queue: str
    death_reason: str
    task_name: str


def fallback_name(letter: Failure) -> str:
    """The name of a failure with no error text (grouping's template for it, shown as its error)."""
    if letter.task_name:
        return f"Celery task {letter.task_name} failed ({letter.death_reason})"
    return f"{letter.death_reason} from {letter.original_queue or letter.source_queue}"


def search_text(error_type: str, error_message: str, body: bytes | memoryview, *, fallback: str = "") -> str:
    """The search text; `fallback` (fallback_name) stands for an empty error message."""
    error_message = error_message or fallback
    head = bytes(body[: settings.DLQ_SEARCH_BODY_BYTES]).decode("utf-8", "replace")
    # PostgreSQL text cannot hold a NUL. It becomes U+FFFD, as undecodable bytes do (a term never holds one), so
    # that the text on either side of it does not run together into words the body never had.
    return f"{error_type}\n{error_message}\n{head}".replace("\x00", "\ufffd").casefold()


def search_term(text: str) -> str:
    """The term as the column holds its text: case-folded, so LIKE (not ILIKE, which a trigram index also serves,
    but Django spells icontains as UPPER(...) LIKE UPPER(...), which it cannot) finds it."""
    return text.casefold()
