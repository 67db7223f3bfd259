"""One dead letter's page: its failure, bounded body, headers, properties, death history, copies and the actions
open to the user; and its raw body as a download."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.http import HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role
from dlqconsole.core import jsonsafe
from dlqconsole.core.amqp import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP_AHEAD
from dlqconsole.core.views import HtmxHttpRequest, partial_template
from dlqconsole.deadletters import replays, selectors
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.deadletters.payload import (
    DEATHS_SHOWN,
    HEADER_ROWS_SHOWN,
    PROBLEMS_SHOWN,
    death_timeline,
    header_rows,
    show_body,
    value_text,
)
from dlqconsole.deadletters.templatetags.charts import stamp
from dlqconsole.deadletters.views.message_edit import not_editable


@require_GET
@vary_on_headers("HX-Request")
def message_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    dead_letter = get_object_or_404(
        DeadLetter.objects.select_related("pattern", "previous", "edited_from", "broker"), pk=pk
    )
    body = bytes(dead_letter.body)
    headers = _header_rows(dead_letter)
    problems = dead_letter.parse_errors if isinstance(dead_letter.parse_errors, list) else [dead_letter.parse_errors]
    # What the page shows is bounded (payload.py); where it cuts, it links to the raw body and the whole record.
    context = {
        "letter": dead_letter,
        "shown": show_body(
            body=body, content_type=dead_letter.content_type, content_encoding=dead_letter.content_encoding
        ),
        "headers": headers[:HEADER_ROWS_SHOWN],
        "headers_total": len(headers),
        "properties": _property_rows(dead_letter.properties, now=timezone.now()),
        "timeline": death_timeline(dead_letter.x_death),
        "deaths_total": len(dead_letter.x_death) if isinstance(dead_letter.x_death, list) else 0,
        "deaths_shown": DEATHS_SHOWN,
        "problems": [value_text(problem) for problem in problems[:PROBLEMS_SHOWN]],
        "record_url": _record_url(dead_letter),
        "ancestors": selectors.ancestors(dead_letter),
        "boomerangs": list(
            dead_letter.boomerangs.order_by("id").only("id", "status", "ingested_at", "error_message")[:50]
        ),
        "edits": list(dead_letter.edits.order_by("id").only("id", "status", "ingested_at")[:50]),
        # Identical in every byte, delivered separately (see ingest/services.py): the first, or the further ones.
        "identical_first": DeadLetter.objects.filter(pk=dead_letter.identical_to_id).only("id", "status").first()
        if dead_letter.identical_to_id
        else None,
        "identical_copies": list(
            DeadLetter.objects.filter(identical_to=dead_letter).order_by("id").only("id", "status")[:50]
        ),
        "kinds": _actions_for(request, dead_letter),
        "not_editable": not_editable(dead_letter),
        # The operation history and the Retry button: the operations app's (see deadletters/replays.py).
        **replays.registered().page_context(request, dead_letter),
    }
    return render(request, partial_template(request, "deadletters/message_detail.html", "history"), context)


def _record_url(dead_letter: DeadLetter) -> str:
    """The whole record (every header, the whole death history, the body) as one line of JSON: the export of
    this one dead letter."""
    query = QueryDict(mutable=True)
    query.update({"ids": str(dead_letter.pk), "status": dead_letter.status, "format": "jsonl"})
    return f"{reverse('deadletters:export')}?{query.urlencode()}"


@dataclass(frozen=True)
class FieldRow:
    """A header or property as the detail page shows it: the value as text, and what to say about it."""

    name: str
    value: str
    kind: str
    # A time to show as a date (the value itself then stays beside it, small).
    moment: dt.datetime | None = None
    note: str = ""
    # An anchor on this page where the value is shown instead (x-death: the death history).
    shown_at: str = ""
    # What of the value was left out ("first 1,000 of 1,048,576 characters shown").
    cut: str = ""


def _header_rows(dead_letter: DeadLetter) -> list[FieldRow]:
    """The headers in order of name, ignoring case, so x-death, x-first-death-* and x-last-death-* sit where a
    reader looks for them; x-death itself is a pointer to the death history, where its entries are shown."""
    rows = [
        FieldRow(name=row.name, value=row.value, kind=row.kind, cut=row.cut) for row in header_rows(dead_letter.headers)
    ]
    trace = _stack_trace_header(rows) if dead_letter.stack_trace else None
    if trace is not None:
        lines = len(dead_letter.stack_trace.splitlines())
        rows[trace] = replace(
            rows[trace],
            value=f"the stack trace ({lines} {'line' if lines == 1 else 'lines'}), shown above under Failure",
            shown_at="stack-trace",
            cut="",
        )
    if dead_letter.x_death:
        entries = len(dead_letter.x_death) if isinstance(dead_letter.x_death, list) else 1
        rows.append(
            FieldRow(
                name="x-death",
                value=f"{entries} {'entry' if entries == 1 else 'entries'}, shown in the death history",
                kind="array",
                shown_at="death-history",
            )
        )
    return sorted(rows, key=lambda row: (row.name.casefold(), row.name))


def _stack_trace_header(rows: list[FieldRow]) -> int | None:
    """Which row holds the stack trace the Failure card shows: the first of DLQ_STACK_TRACE_HEADERS that has a
    value, as ingest chose it (names compared without regard to case)."""
    ranks: dict[str, int] = {}
    for rank, name in enumerate(settings.DLQ_STACK_TRACE_HEADERS):
        ranks.setdefault(name.lower(), rank)
    found = [
        (ranks[row.name.lower()], index) for index, row in enumerate(rows) if row.name.lower() in ranks and row.value
    ]
    return min(found)[1] if found else None


def _property_rows(properties: Any, *, now: dt.datetime) -> list[FieldRow]:
    rows = []
    for row in header_rows(properties):
        if row.name == "timestamp":
            rows.append(
                _timestamp_row(jsonsafe.decode(properties).get("timestamp"), value=row.value, kind=row.kind, now=now)
            )
        else:
            rows.append(FieldRow(name=row.name, value=row.value, kind=row.kind, cut=row.cut))
    return rows


def _timestamp_row(seconds: Any, *, value: str, kind: str, now: dt.datetime) -> FieldRow:
    """The AMQP timestamp property (seconds since the epoch) as a date; a nonsense one (negative, huge, not a
    number) stays a number, with a note saying why."""
    row = FieldRow(name="timestamp", value=value, kind=kind)
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        return replace(row, note="not a number of seconds")
    try:
        moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return replace(row, note="not a time: beyond any calendar date")
    if not EARLIEST_TIMESTAMP <= moment <= now + LATEST_TIMESTAMP_AHEAD:
        return replace(row, note=f"not a plausible time (it would be {stamp(moment)})")
    return replace(row, moment=moment)


def _actions_for(request: HtmxHttpRequest, dead_letter: DeadLetter) -> list[tuple[str, str]]:
    """The operation kinds this user may start on this message (the plan page checks again)."""
    kinds: list[tuple[str, str]] = []
    if has_role(request.user, OPERATOR):
        if dead_letter.status == DeadLetterStatus.ARCHIVED:
            kinds.append(("restore", "Restore"))
        else:
            # Retry is a button of its own (_quick_retry); the plan page stays for the other kinds.
            kinds += [("move", "Move"), ("archive", "Archive")]
    if has_role(request.user, ADMIN):
        kinds.append(("purge", "Purge"))
    return kinds


@require_GET
def message_body(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The raw body as a download; never rendered by the browser (attachment, octet-stream, nosniff)."""
    dead_letter = get_object_or_404(DeadLetter.objects.only("id", "body"), pk=pk)
    response = HttpResponse(bytes(dead_letter.body), content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="dead-letter-{dead_letter.pk}.bin"'
    return response
