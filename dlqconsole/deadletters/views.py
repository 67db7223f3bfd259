"""Pages for browsing and triage: patterns, messages, one message.

Each page answers a normal request with the whole page and an htmx request with the partial it refreshes
(Django's template partials, `template#name`). Writes go through services and are checked for the role here.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit
from uuid import uuid4

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db import OperationalError
from django.db.models import OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import FileResponse, Http404, HttpResponse, HttpResponseBase, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role, require_role
from dlqconsole.core import jsonsafe
from dlqconsole.core.amqp import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP_AHEAD
from dlqconsole.core.views import HtmxHttpRequest, keyset_page, parse_id, partial_template, safe_next
from dlqconsole.deadletters import exports, replays, selectors
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.forms import EditForm, editable_body_bytes
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    FailureReason,
    PatternStatus,
)
from dlqconsole.deadletters.payload import (
    DEATHS_SHOWN,
    HEADER_ROWS_SHOWN,
    PROBLEMS_SHOWN,
    body_as_text,
    death_timeline,
    error_header_names,
    form_size_problem,
    header_rows,
    headers_as_json,
    show_body,
    text_problem,
    unified_diff,
    value_text,
    with_line_endings_of,
)
from dlqconsole.deadletters.services import (
    PatternError,
    SplitPreview,
    assign_pattern,
    merge_patterns,
    merge_warnings,
    set_pattern_status,
    split_pattern,
    split_preview,
    validate_rule,
)
from dlqconsole.deadletters.templatetags.charts import stamp

PAGE_SIZE = 50
# The owner list of a pattern page offers at most this many users (the current owner is always offered).
MAX_OWNER_CHOICES = 200
# The messages page stops a search that runs longer than this (PostgreSQL) and asks for a narrower filter.
PAGE_QUERY_TIMEOUT_MS = 5000


PATTERN_PAGE_SIZE = 50
MAX_PATTERN_PAGE = 1_000_000
# Levels of a chain of merges followed to find where a merged pattern's dead letters are now.
MAX_MERGE_CHAIN = 10
PATTERN_SORTS = {
    "waiting": ("-waiting", "-last_seen_at"),
    "total": ("-total_count", "-last_seen_at"),
    "last_seen": ("-last_seen_at",),
    "first_seen": ("-first_seen_at",),
    "oldest": ("first_seen_at",),
}


# Patterns ------------------------------------------------------------------------------------------------------


def _pattern_queryset(query: QueryDict, *, user_id: int | None) -> tuple[QuerySet[FailurePattern], dict[str, str]]:
    chosen = {
        "status": query.get("status", ""),
        "reason": query.get("reason", ""),
        "queue": query.get("queue", ""),
        "q": query.get("q", "").strip(),
        "owner": query.get("owner", ""),
        "sort": query.get("sort", "waiting") if query.get("sort") in PATTERN_SORTS else "waiting",
    }
    waiting = (
        DeadLetterCount.objects.filter(pattern=OuterRef("pk"), status__in=selectors.WAITING)
        .values("pattern")
        .annotate(total=Sum("count"))
        .values("total")
    )
    patterns = FailurePattern.objects.active().select_related("owner").annotate(waiting=Coalesce(Subquery(waiting), 0))
    if chosen["status"] == "active":
        patterns = patterns.exclude(status__in=[PatternStatus.RESOLVED, PatternStatus.IGNORED])
    elif chosen["status"] in PatternStatus.values:
        patterns = patterns.filter(status=chosen["status"])
    if chosen["reason"] in FailureReason.values:
        patterns = patterns.filter(failure_reason=chosen["reason"])
    if chosen["queue"]:
        in_queue = DeadLetterCount.objects.filter(source_queue=chosen["queue"], count__gt=0).values("pattern_id")
        patterns = patterns.filter(pk__in=in_queue)
    if "\x00" in chosen["q"] + chosen["queue"]:
        patterns = patterns.none()  # stored text never holds a NUL (PostgreSQL refuses one): nothing matches
    elif chosen["q"]:
        patterns = patterns.filter(Q(template__icontains=chosen["q"]) | Q(error_type__icontains=chosen["q"]))
    if chosen["owner"] == "me":
        patterns = patterns.filter(owner_id=user_id)
    elif chosen["owner"] == "none":
        patterns = patterns.filter(owner__isnull=True)
    return patterns.order_by(*PATTERN_SORTS[chosen["sort"]], "-id"), chosen


@require_GET
@vary_on_headers("HX-Request")
def pattern_list(request: HtmxHttpRequest) -> HttpResponse:
    patterns, chosen = _pattern_queryset(request.GET, user_id=request.user.pk)
    try:
        # Bounded so that the offset stays a number the database takes; pages that far out are simply empty.
        page = min(max(int(request.GET.get("page", "1")), 1), MAX_PATTERN_PAGE)
    except ValueError:
        page = 1
    # Patterns number in the hundreds, not millions: a plain offset page is cheap here.
    start = (page - 1) * PATTERN_PAGE_SIZE
    rows = list(patterns[start : start + PATTERN_PAGE_SIZE + 1])
    has_next = len(rows) > PATTERN_PAGE_SIZE
    rows = rows[:PATTERN_PAGE_SIZE]
    ids = [pattern.pk for pattern in rows]
    _, queues = selectors.waiting_by_pattern(ids)
    trends = selectors.pattern_trends(pattern_ids=ids, width=dt.timedelta(hours=1), buckets=24)
    summaries = [
        selectors.PatternSummary(
            pattern=pattern,
            parked=getattr(pattern, "waiting", 0),
            queues=queues.get(pattern.pk, []),
            trend=trends.get(pattern.pk, []),
        )
        for pattern in rows
    ]
    context = {
        "summaries": summaries,
        "chosen": chosen,
        "page": page,
        "has_next": has_next,
        "query_without_page": _query_without(request.GET, "page"),
        "statuses": PatternStatus.choices,
        "reasons": FailureReason.choices,
        "known_queues": _known_queues(),
        "sorts": [(key, key.replace("_", " ")) for key in PATTERN_SORTS],
        "pattern_actions": PATTERN_ACTIONS,
        "back_url": request.get_full_path(),
        **_row_paths(),
    }
    return render(request, partial_template(request, "deadletters/patterns.html", "table"), context)


def _row_paths() -> dict[str, str]:
    """Base paths the patterns table builds its per-row links from (reversing a URL per link is slow)."""
    return {
        "patterns_path": reverse("deadletters:patterns"),
        "messages_path": reverse("deadletters:messages"),
        # The Waiting count links to exactly the dead letters it counts.
        "waiting_query": urlencode({"status": ",".join(selectors.WAITING)}),
        "plan_path": reverse("operations:plan"),
    }


@require_GET
@vary_on_headers("HX-Request")
def pattern_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    pattern = get_object_or_404(FailurePattern.objects.select_related("owner", "merged_into"), pk=pk)
    context = _pattern_page_context(pattern, back_url=request.get_full_path(), split=_split_form())
    return render(request, partial_template(request, "deadletters/pattern_detail.html", "summary"), context)


def _pattern_page_context(pattern: FailurePattern, *, back_url: str, split: dict[str, Any]) -> dict[str, Any]:
    cells = list(
        DeadLetterCount.objects.filter(pattern=pattern, count__gt=0).order_by(
            "source_queue", "status", "failure_reason"
        )
    )
    trend = selectors.pattern_trends(pattern_ids=[pattern.pk], width=dt.timedelta(hours=1), buckets=24)[pattern.pk]
    return {
        "owners": _owner_choices(),
        "pattern": pattern,
        "cells": cells,
        "waiting": sum(cell.count for cell in cells if cell.status in selectors.WAITING),
        "trend": trend,
        "events": list(pattern.events.select_related("actor")[:50]),
        "absorbed": list(pattern.absorbed.all()[:50]),
        # Candidates for a merge into this one: the same error type and reason, most recently seen first.
        "similar": list(
            FailurePattern.objects.active()
            .filter(error_type=pattern.error_type, failure_reason=pattern.failure_reason)
            .exclude(pk=pattern.pk)
            .order_by("-last_seen_at")[:10]
        ),
        "recent": list(
            DeadLetter.objects.filter(pattern=pattern)
            .visible()
            .order_by("-id")
            .only(
                "id",
                "source_queue",
                "error_message",
                "status",
                "ingested_at",
                "failure_reason",
                "death_reason",
                "original_queue",
            )[:10]
        ),
        "pattern_actions": PATTERN_ACTIONS,
        "back_url": back_url,
        "split": split,
    }


# Messages ------------------------------------------------------------------------------------------------------


def _query_without(query: QueryDict, *names: str) -> str:
    kept = query.copy()
    for name in names:
        kept.pop(name, None)
    return kept.urlencode()


def _known_queues() -> list[str]:
    return sorted(set(DeadLetterCount.objects.filter(count__gt=0).values_list("source_queue", flat=True)))


@require_GET
@vary_on_headers("HX-Request")
def message_list(request: HtmxHttpRequest) -> HttpResponse:
    error = ""
    try:
        chosen = DeadLetterFilter.from_querydict(request.GET)
        found = chosen.apply()
        typed = chosen
    except FilterError as problem:
        error = str(problem)
        chosen = DeadLetterFilter()
        found = DeadLetter.objects.none()
        typed = DeadLetterFilter.as_typed(request.GET)  # the form keeps what was typed, the bad value included
    before = parse_id(request.GET.get("before"))
    after = parse_id(request.GET.get("after"))
    columns = (
        "id",
        "source_queue",
        "original_queue",
        "failure_reason",
        "error_type",
        "error_message",
        "status",
        "attempt_count",
        "priority",
        "host",
        "app_version",
        "ingested_at",
        "pattern_id",
        "replay_count",
        "body_size",
    )
    # Keyset pages: newest first; "before" walks to older rows, "after" back to newer ones. Never OFFSET.
    total = None if error else selectors.counted_total(chosen)
    if not error and selectors.counted_matches(chosen) == 0:
        # The counters say nothing matches: no need to scan for it.
        found = DeadLetter.objects.none()
    try:
        with selectors.time_limit(milliseconds=PAGE_QUERY_TIMEOUT_MS):
            rows, more_newer, more_older = keyset_page(
                found, size=PAGE_SIZE, before=before, after=after, columns=columns
            )
    except OperationalError:
        # Text and payload searches scan rows; on a large table a rare match can take long. Say so, do not hang.
        error = (
            f"This search took longer than {PAGE_QUERY_TIMEOUT_MS / 1000:g} s and was stopped. Narrow it with a "
            "queue, a pattern or a time range (since / until)."
        )
        rows, more_newer, more_older = [], False, False
    patterns = FailurePattern.objects.in_bulk({row.pattern_id for row in rows})
    for row in rows:
        row.pattern_cached = patterns.get(row.pattern_id)  # type: ignore[attr-defined]
    base = _query_without(request.GET, "before", "after")
    filter_query = QueryDict(mutable=True)
    for name, value in chosen.to_dict().items():
        if isinstance(value, list):
            filter_query.setlist(name, [str(item) for item in value])
        else:
            filter_query[name] = str(value)
    context = {
        "rows": rows,
        "error": error,
        "total": total,
        "chosen": chosen,
        "typed": typed,
        "filter_query": filter_query.urlencode(),
        "filter_items": list(filter_query.lists()),
        "older_query": f"{base}&before={rows[-1].pk}" if rows and more_older else "",
        "newer_query": f"{base}&after={rows[0].pk}" if rows and more_newer else "",
        "first_query": base,
        # Each row's host filters the list by it (with the other filters kept).
        "host_query": _query_without(request.GET, "before", "after", "host"),
        "reasons": FailureReason.choices,
        "statuses": DeadLetterStatus.choices,
        "known_queues": _known_queues(),
        "filtered_pattern": FailurePattern.objects.filter(pk__in=chosen.pattern).first() if chosen.pattern else None,
        "merged_away": _merged_away(chosen.pattern, query=request.GET),
        "page_size": PAGE_SIZE,
        "only_archived": chosen.status == [DeadLetterStatus.ARCHIVED],
    }
    return render(request, partial_template(request, "deadletters/messages.html", "results"), context)


def _merged_away(pattern_ids: list[int], *, query: QueryDict) -> list[tuple[int, FailurePattern, str]]:
    """For each filtered pattern that was merged away: its number, the pattern that holds its dead letters now
    (the end of the chain of merges) and this page's query with that pattern instead. A link to a merged pattern
    (from an old alert, a ticket, a bookmark) then says where its dead letters went instead of showing none."""
    away = FailurePattern.objects.filter(pk__in=pattern_ids, merged_into__isnull=False)
    merged: dict[int, int] = dict(away.values_list("pk", "merged_into_id"))
    if not merged:
        return []
    # Merges rarely chain: follow every chain a level at a time, one query per level, at most a few.
    into = dict(merged)
    for _ in range(MAX_MERGE_CHAIN):
        unknown = {target for target in into.values() if target not in into}
        further = dict(
            FailurePattern.objects.filter(pk__in=unknown, merged_into__isnull=False).values_list("pk", "merged_into_id")
        )
        if not further:
            break
        into.update(further)
    ends: dict[int, int] = {}
    for pk in merged:
        target, seen = into[pk], {pk}
        while target in into and target not in seen:
            seen.add(target)
            target = into[target]
        ends[pk] = target
    patterns = FailurePattern.objects.in_bulk(set(ends.values()))
    found: list[tuple[int, FailurePattern, str]] = []
    for pk in sorted(ends):
        holder = patterns.get(ends[pk])
        if holder is None:
            continue
        moved = query.copy()
        for name in ("before", "after"):
            moved.pop(name, None)
        moved.setlist("pattern", [str(holder.pk if number == pk else number) for number in pattern_ids])
        found.append((pk, holder, moved.urlencode()))
    return found


@require_GET
@vary_on_headers("HX-Request")
def message_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    dead_letter = get_object_or_404(DeadLetter.objects.select_related("pattern", "previous", "edited_from"), pk=pk)
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
        "ancestors": _ancestors(dead_letter),
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
        "not_editable": _not_editable(dead_letter),
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


def _not_editable(dead_letter: DeadLetter) -> str:
    """Why the edit form cannot take this dead letter ("" when it can), so that the page says so instead of
    offering an Edit and retry that only leads to a refusal (the edit view refuses the same cases)."""
    body = bytes(dead_letter.body)
    if len(body) > editable_body_bytes():
        return "the payload is too large to edit in a form"
    problem = text_problem(body)
    if problem:
        return problem
    return form_size_problem(
        body=body.decode("utf-8"), headers=headers_as_json(dead_letter.headers, leave_out=error_header_names())
    )


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


def _ancestors(dead_letter: DeadLetter, *, limit: int = 20) -> list[DeadLetter]:
    """The records this one was replayed from, nearest first (a bounded walk: links can only point back)."""
    chain: list[DeadLetter] = []
    current = dead_letter.previous
    seen = {dead_letter.pk}
    while current is not None and current.pk not in seen and len(chain) < limit:
        chain.append(current)
        seen.add(current.pk)
        current = current.previous
    return chain


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


# Exports -------------------------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def message_export(request: HtmxHttpRequest) -> HttpResponseBase:
    """Stream the filtered set as CSV or JSON lines; past exports.STREAM_LIMIT rows, offer a background job."""
    query = request.GET if request.method == "GET" else request.POST
    export_format = query.get("format", "csv")
    if export_format not in exports.FORMATS:
        raise Http404("Unknown export format.")
    try:
        chosen = DeadLetterFilter.from_querydict(query)
    except FilterError as problem:
        messages.error(request, str(problem))
        return redirect("deadletters:messages")
    try:
        if request.method == "POST":
            token = exports.start_export(filter=chosen.to_dict(), export_format=export_format, user=request.user)
            return redirect("deadletters:export-status", name=token)
        if exports.is_large(chosen):
            return render(
                request,
                "deadletters/export_large.html",
                {"format": export_format, "filter_items": query.lists(), "limit": exports.STREAM_LIMIT},
            )
        return exports.streaming_response(chosen, export_format=export_format, user=request.user)
    except exports.ExportRefused as refusal:
        messages.error(request, str(refusal))
        # Back to the same filtered set, so the person sees what they were exporting.
        kept = query.copy()
        for name in ("format", "csrfmiddlewaretoken"):
            kept.pop(name, None)
        return redirect(reverse("deadletters:messages") + (f"?{kept.urlencode()}" if kept else ""))


@require_GET
@vary_on_headers("HX-Request")
def export_status(request: HtmxHttpRequest, name: str) -> HttpResponseBase:
    found = exports.find_export(name=name, user=request.user)
    if found is None:
        raise Http404("No such export.")
    if found.state == "ready" and request.GET.get("download"):
        return FileResponse(found.path.open("rb"), as_attachment=True, filename=found.download_name)
    response = render(
        request,
        partial_template(request, "deadletters/export_status.html", "state"),
        {"export": found, "name": name, "concurrency": settings.DLQ_EXPORT_CONCURRENCY},
    )
    if request.htmx and found.state not in ("waiting", "running"):
        response.status_code = HttpResponseStopPolling.status_code
    return response


# Triage (writes go through the pattern services) -----------------------------------------------------------

PATTERN_ACTIONS = [
    (PatternStatus.ACKNOWLEDGED, "Acknowledge"),
    (PatternStatus.RESOLVED, "Resolve"),
    (PatternStatus.IGNORED, "Ignore"),
    (PatternStatus.OPEN, "Reopen"),
]


def _back(request: HtmxHttpRequest, fallback: str) -> str:
    """Where a non-htmx POST returns to: the page it came from when that is a local path."""
    return safe_next(request, request.POST.get("next")) or fallback


def _pattern_fragment(
    request: HtmxHttpRequest, pattern: FailurePattern, *, back_url: str, fragment: str
) -> HttpResponse:
    """After a triage change: the row of the patterns table, or the summary card of the pattern page."""
    if fragment == "summary":
        return pattern_detail_fragment(request, pattern, back_url=back_url)
    counts, queues = selectors.waiting_by_pattern([pattern.pk])
    trend = selectors.pattern_trends(pattern_ids=[pattern.pk], width=dt.timedelta(hours=1), buckets=24)
    row = selectors.PatternSummary(
        pattern=pattern, parked=counts.get(pattern.pk, 0), queues=queues.get(pattern.pk, []), trend=trend[pattern.pk]
    )
    # The table's sort decides which columns a laptop screen shows: the row keeps the table's columns.
    sort = parse_qs(urlsplit(back_url).query).get("sort", [""])[0]
    context = {
        "row": row,
        "pattern_actions": PATTERN_ACTIONS,
        "back_url": back_url,
        "chosen": {"sort": sort if sort in PATTERN_SORTS else "waiting"},
        **_row_paths(),
    }
    return render(request, "deadletters/patterns.html#row", context)


def _owner_choices() -> list[Any]:
    """Who may own a pattern: active users who may act on it (operators and admins), by name."""
    users = get_user_model().objects.filter(is_active=True)
    return list(
        users.filter(Q(is_superuser=True) | Q(groups__name__in=[OPERATOR, ADMIN]))
        .distinct()
        .order_by("username")[:MAX_OWNER_CHOICES]
    )


def _split_form(
    *, name: str = "", regex: str = "", header: str = "", preview: SplitPreview | None = None, problem: str = ""
) -> dict[str, Any]:
    """The split card's fields as typed, and after Preview what the rule takes, shown beside the Split button.
    Only pattern_split fills it: a page's address never runs an expression over the pattern's dead letters (a link
    on another site could make a signed-in operator's browser start a scan of up to 10 s)."""
    return {"name": name, "regex": regex, "header": header, "preview": preview, "problem": problem}


def pattern_detail_fragment(request: HtmxHttpRequest, pattern: FailurePattern, *, back_url: str) -> HttpResponse:
    cells = DeadLetterCount.objects.filter(pattern=pattern, status__in=selectors.WAITING, count__gt=0)
    context = {
        "owners": _owner_choices(),
        "pattern": pattern,
        "waiting": sum(cell.count for cell in cells),
        "trend": selectors.pattern_trends(pattern_ids=[pattern.pk], width=dt.timedelta(hours=1), buckets=24)[
            pattern.pk
        ],
        "pattern_actions": PATTERN_ACTIONS,
        "back_url": back_url,
        "events": list(pattern.events.select_related("actor")[:50]),
        "history_oob": True,
    }
    # The summary card, and the history beside it out of band: the change just made is its newest line.
    summary = render_to_string("deadletters/pattern_detail.html#summary", context, request=request)
    history = render_to_string("deadletters/pattern_detail.html#history", context, request=request)
    return HttpResponse(summary + history)


@require_POST
def pattern_status_change(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, OPERATOR)
    pattern = get_object_or_404(FailurePattern, pk=pk)
    status = request.POST.get("status", "")
    back_url = _back(request, reverse("deadletters:pattern", args=[pattern.pk]))
    try:
        set_pattern_status(pattern=pattern, status=status, actor=request.user)
    except PatternError as problem:
        messages.error(request, str(problem))
        if request.htmx:
            # The row as it is; the error travels with it into the page's flash list.
            return _pattern_fragment(request, pattern, back_url=back_url, fragment=request.POST.get("fragment", "row"))
        return redirect(back_url)
    pattern.refresh_from_db()
    if request.htmx:
        return _pattern_fragment(request, pattern, back_url=back_url, fragment=request.POST.get("fragment", "row"))
    messages.success(request, f"Pattern #{pattern.pk} is now {pattern.get_status_display().lower()}.")
    return redirect(back_url)


@require_POST
def pattern_assign(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, OPERATOR)
    pattern = get_object_or_404(FailurePattern, pk=pk)
    back_url = _back(request, reverse("deadletters:pattern", args=[pattern.pk]))
    owner: Any
    if "owner" in request.POST:
        chosen = request.POST["owner"]
        owner_id = parse_id(chosen)
        owner = get_user_model().objects.filter(pk=owner_id).first() if owner_id is not None else None
        if chosen and owner is None:
            messages.error(request, "That user does not exist.")
            return redirect(back_url)
    else:  # the older form: a tick box "I own this"
        owner = request.user if request.POST.get("take") else None
    if "\x00" in request.POST.get("note", ""):
        messages.error(request, "The note cannot hold a NUL character.")
        return redirect(back_url)
    try:
        assign_pattern(pattern=pattern, owner=owner, note=request.POST.get("note", pattern.note), actor=request.user)
    except PatternError as problem:
        messages.error(request, str(problem))
        return redirect(back_url)
    pattern.refresh_from_db()
    messages.success(request, f"Pattern #{pattern.pk} saved.")  # shown in place after an htmx save too
    if request.htmx:
        return _pattern_fragment(request, pattern, back_url=back_url, fragment="summary")
    return redirect(back_url)


def _pattern_numbers(values: list[str]) -> set[int]:
    """Pattern numbers typed or ticked ('12, #15 31'); ValueError naming the first token that is not one."""
    numbers = set()
    for value in values:
        for token in re.split(r"[\s,;]+", value.strip()):
            token = token.lstrip("#")
            if not token:
                continue
            # A pattern id is a bigint: more digits than that is no pattern (and no database query).
            if not (token.isascii() and token.isdigit()) or len(token) > 18:
                raise ValueError(f"“{token[:40]}” is not a pattern number; nothing was merged.")
            numbers.add(int(token))
    return numbers


@require_http_methods(["GET", "POST"])
def pattern_merge(request: HtmxHttpRequest) -> HttpResponse:
    """Merge patterns: first a preview (full templates, counts, what differs, a choice of target), then the merge.
    Sources come from ticked boxes and from typed pattern numbers ('12, #15 31'). A GET (Back or reload onto the
    preview) goes to the patterns page: the preview is made from what was ticked, which a GET does not carry."""
    require_role(request.user, OPERATOR)
    if request.method == "GET":
        messages.info(request, "Tick the patterns to merge again: a merge preview is not kept.")
        return redirect("deadletters:patterns")
    back_url = _back(request, reverse("deadletters:patterns"))
    try:
        chosen = _pattern_numbers(request.POST.getlist("sources"))
        typed = _pattern_numbers([request.POST.get("target", "")])
        if len(typed) > 1:
            raise ValueError("Merge into one pattern: type a single pattern number as the target.")
        # No target chosen: the ticked pattern with the most dead letters (its template, triage and history stay).
        busiest = (
            FailurePattern.objects.filter(pk__in=chosen).order_by("-total_count", "pk").values_list("pk", flat=True)
        )
        target_id = next(iter(typed)) if typed else busiest.first()
        if target_id is None:
            raise ValueError("Choose the patterns to merge (pattern numbers) and the one to merge them into.")
    except ValueError as problem:
        messages.error(request, str(problem))
        return redirect(back_url)
    target = get_object_or_404(FailurePattern.objects.select_related("merged_into"), pk=target_id)
    sources = list(FailurePattern.objects.filter(pk__in=chosen - {target_id}).order_by("pk"))
    unknown = sorted(chosen - {target_id} - {pattern.pk for pattern in sources})
    if unknown:
        messages.error(request, "No pattern " + ", ".join(f"#{pk}" for pk in unknown) + "; nothing was merged.")
        return redirect(back_url)
    if not sources:
        messages.error(request, "Tick at least one pattern other than the target.")
        return redirect(back_url)
    # The preview's Merge button names the target it was made for: a target chosen on the page since is previewed
    # first (its count and warnings were never shown), not merged into.
    previewed = request.POST.get("previewed", "")
    if request.POST.get("action") != "merge" or (previewed and previewed != str(target.pk)):
        blocked = [pattern for pattern in [target, *sources] if pattern.merged_into_id is not None]
        context = {
            "target": target,
            "sources": sources,
            "moving": sum(pattern.total_count for pattern in sources),
            "warnings": merge_warnings(target=target, sources=sources),
            "blocked": blocked,
            "back_url": back_url,
        }
        return render(request, "deadletters/merge_preview.html", context)
    try:
        moved = merge_patterns(sources=sources, target=target, actor=request.user)
    except PatternError as problem:
        messages.error(request, str(problem))
        return redirect(back_url)
    messages.success(
        request,
        f"Merged {len(sources)} pattern{pluralize(len(sources))} ({moved:,} dead letter{pluralize(moved)}) "
        f"into #{target.pk}.",
    )
    return redirect("deadletters:pattern", pk=target.pk)


# Edit and retry ------------------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def message_edit(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Edit a copy of the payload and headers, see the diff, send it; the original is kept and linked."""
    require_role(request.user, OPERATOR)
    dead_letter = get_object_or_404(DeadLetter.objects.select_related("pattern"), pk=pk)
    raw = bytes(dead_letter.body)
    limit = editable_body_bytes()
    problem = _not_editable(dead_letter)
    original_body = body_as_text(raw) if not problem else None
    original_headers = headers_as_json(dead_letter.headers)
    context: dict[str, Any] = {
        "letter": dead_letter,
        "editable": original_body is not None,
        "limit": limit,
        "not_editable": problem,
    }
    if len(raw) > limit:
        context["too_large"] = len(raw)
    elif problem and not text_problem(raw):
        context["too_large_for_page"] = True
    initial_headers = headers_as_json(dead_letter.headers, leave_out=error_header_names())
    form = EditForm(initial={"body": original_body or "", "headers": initial_headers, "submission": uuid4().hex})
    if request.method == "POST" and original_body is not None:
        # An edit grown past DATA_UPLOAD_MAX_MEMORY_SIZE never gets here: the CSRF check reads the form first and
        # Django answers 400. The form's data-max-bytes stops such a send in the browser, saying why.
        form = EditForm(request.POST)
    context["form"] = form
    if request.method == "GET" or original_body is None:
        return render(request, "deadletters/message_edit.html", context)
    if not form.is_valid():
        return render(request, "deadletters/message_edit.html", context, status=400)
    body = with_line_endings_of(original_body, form.cleaned_data["body"])
    headers: dict[str, Any] = form.cleaned_data["headers"]
    context["json_problem"] = _json_problem(body, content_type=dead_letter.content_type)
    context["body_diff"] = unified_diff(original_body, body, name="payload")
    context["headers_diff"] = unified_diff(original_headers, headers_as_json(headers), name="headers")
    context["unchanged"] = not context["body_diff"] and not context["headers_diff"]
    if request.POST.get("action") != "send":
        return render(request, "deadletters/message_edit.html", context)
    try:
        sent_by = replays.registered().send_edited(
            dead_letter=dead_letter,
            body=body.encode("utf-8"),
            headers=jsonsafe.decode(headers),
            actor=request.user,
            submission=form.cleaned_data["submission"],
        )
    except replays.ReplayRefused as problem:
        form.add_error(None, str(problem))
        return render(request, "deadletters/message_edit.html", context, status=400)
    messages.success(request, "The edited copy was sent; the original is archived (restorable from its page).")
    return redirect(sent_by)


def _json_problem(body: str, *, content_type: str) -> str:
    """Why an edited payload is not JSON although its content type says it is ("" when it is, or when the message
    is not JSON): shown as a warning beside the diff, not a refusal, since the operator may mean it."""
    if "json" not in content_type.lower() or not body.strip():
        return ""
    try:
        json.loads(body)
    except json.JSONDecodeError as error:
        return f"line {error.lineno}, column {error.colno}: {error.msg}"
    except RecursionError:
        return "nested too deeply to read"
    return ""


@require_POST
@vary_on_headers("HX-Request")
def pattern_split(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Split the dead letters matching a rule off into a new pattern: first a preview of how many (the pattern page,
    or its split card for htmx, on this same address), then the split. The preview is a POST like the split: it runs
    the expression over up to SPLIT_PREVIEW_LIMIT dead letters, which no link from another site may start."""
    require_role(request.user, OPERATOR)
    pattern = get_object_or_404(FailurePattern.objects.select_related("owner", "merged_into"), pk=pk)
    name = request.POST.get("name", "").strip()
    regex = request.POST.get("regex", "")
    header = request.POST.get("header", "").strip()
    try:
        if request.POST.get("action") != "split":
            if pattern.merged_into_id is not None:
                raise PatternError(f"Pattern #{pattern.pk} was merged into #{pattern.merged_into_id}; use that one.")
            validate_rule(name=name, regex=regex, header=header)
            preview = split_preview(pattern=pattern, regex=regex, header=header)
            return _split_page(request, pattern, _split_form(name=name, regex=regex, header=header, preview=preview))
        part = split_pattern(pattern=pattern, name=name, regex=regex, header=header, actor=request.user)
    except PatternError as problem:
        # The split card shows the problem beside the fields it is about, and keeps what was typed.
        typed = _split_form(name=name, regex=regex, header=header, problem=str(problem))
        return _split_page(request, pattern, typed)
    messages.success(request, f"Split into pattern #{part.pk}.")
    return redirect("deadletters:pattern", pk=part.pk)


def _split_page(request: HtmxHttpRequest, pattern: FailurePattern, split: dict[str, Any]) -> HttpResponse:
    if request.htmx:
        return render(request, "deadletters/pattern_detail.html#split", {"pattern": pattern, "split": split})
    back_url = reverse("deadletters:pattern", args=[pattern.pk])
    context = _pattern_page_context(pattern, back_url=back_url, split=split)
    return render(request, "deadletters/pattern_detail.html", context)
