"""The messages page: the dead letters a filter selects, a keyset page at a time, and their export as CSV or JSON
lines (streamed, or written by a background job past exports.STREAM_LIMIT rows)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.db import OperationalError
from django.http import FileResponse, Http404, HttpResponse, HttpResponseBase, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from dlqconsole.core.views import HtmxHttpRequest, keyset_page, parse_id, partial_template
from dlqconsole.deadletters import exports, selectors
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailurePattern, FailureReason
from dlqconsole.deadletters.views.listing import known_queues, query_without

PAGE_SIZE = 50

# The messages page stops a search that runs longer than this (PostgreSQL) and asks for a narrower filter.
PAGE_QUERY_TIMEOUT_MS = 5000

# Levels of a chain of merges followed to find where a merged pattern's dead letters are now.
MAX_MERGE_CHAIN = 10


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
        "broker_id",
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
    brokers = selectors.broker_names()
    for row in rows:
        row.pattern_cached = patterns.get(row.pattern_id)  # type: ignore[attr-defined]
        row.broker_name = brokers.get(row.broker_id or 0, "")  # type: ignore[attr-defined]
    base = query_without(request.GET, "before", "after")
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
        "host_query": query_without(request.GET, "before", "after", "host"),
        "reasons": FailureReason.choices,
        "statuses": DeadLetterStatus.choices,
        "known_queues": known_queues(),
        "brokers": sorted(brokers.values()),
        "several_brokers": len(brokers) > 1,
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
