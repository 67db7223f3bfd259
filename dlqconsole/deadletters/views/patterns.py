"""The patterns pages: the list of failure patterns with its filters and sorts, and one pattern's page (its
counts, trend, history, recent dead letters and the candidates for a merge). Their writes are in triage.py."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from dlqconsole.accounts.roles import ADMIN, OPERATOR
from dlqconsole.core.views import HtmxHttpRequest, partial_template
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.explain import explain
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern, FailureReason, PatternStatus
from dlqconsole.deadletters.pattern_filters import PATTERN_SORTS, matching_patterns
from dlqconsole.deadletters.rule_services import SplitPreview
from dlqconsole.deadletters.views.listing import known_queues, query_without

# The owner list of a pattern page offers at most this many users (the current owner is always offered).
MAX_OWNER_CHOICES = 200

PATTERN_PAGE_SIZE = 50
MAX_PATTERN_PAGE = 1_000_000

# The triage buttons of a pattern's row and page.
PATTERN_ACTIONS = [
    (PatternStatus.ACKNOWLEDGED, "Acknowledge"),
    (PatternStatus.RESOLVED, "Resolve"),
    (PatternStatus.IGNORED, "Ignore"),
    (PatternStatus.OPEN, "Reopen"),
]


@require_GET
@vary_on_headers("HX-Request")
def pattern_list(request: HtmxHttpRequest) -> HttpResponse:
    patterns, chosen = matching_patterns(request.GET, user_id=request.user.pk)
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
        "query_without_page": query_without(request.GET, "page"),
        "statuses": PatternStatus.choices,
        "reasons": FailureReason.choices,
        "known_queues": known_queues(),
        "brokers": sorted(selectors.broker_names().values()),
        "sorts": [(key, key.replace("_", " ")) for key in PATTERN_SORTS],
        "pattern_actions": PATTERN_ACTIONS,
        "back_url": request.get_full_path(),
        **row_paths(),
    }
    return render(request, partial_template(request, "deadletters/patterns.html", "table"), context)


def row_paths() -> dict[str, str]:
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
    context = pattern_page_context(pattern, back_url=request.get_full_path(), split=split_form())
    return render(request, partial_template(request, "deadletters/pattern_detail.html", "summary"), context)


def pattern_page_context(pattern: FailurePattern, *, back_url: str, split: dict[str, Any]) -> dict[str, Any]:
    cells = list(
        DeadLetterCount.objects.filter(pattern=pattern, count__gt=0)
        .select_related("broker")
        .order_by("broker__name", "source_queue", "status", "failure_reason")
    )
    # One pattern spans brokers: what waits on each, when there are several.
    by_broker: dict[str, int] = {}
    for cell in cells:
        if cell.status in selectors.WAITING:
            by_broker[cell.broker.name] = by_broker.get(cell.broker.name, 0) + cell.count
    trend = selectors.pattern_trends(pattern_ids=[pattern.pk], width=dt.timedelta(hours=1), buckets=24)[pattern.pk]
    return {
        "owners": owner_choices(),
        "pattern": pattern,
        "cells": cells,
        "waiting": sum(cell.count for cell in cells if cell.status in selectors.WAITING),
        "waiting_by_broker": sorted(by_broker.items()),
        "several_brokers": len({cell.broker_id for cell in cells}) > 1 or len(selectors.broker_names()) > 1,
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
        # Read only when the page shows it: an htmx refresh of the summary renders without it.
        "inside": SimpleLazyObject(lambda: explain(pattern)),
        "pattern_actions": PATTERN_ACTIONS,
        "back_url": back_url,
        "split": split,
    }


def owner_choices() -> list[Any]:
    """Who may own a pattern: active users who may act on it (operators and admins), by name."""
    users = get_user_model().objects.filter(is_active=True)
    return list(
        users.filter(Q(is_superuser=True) | Q(groups__name__in=[OPERATOR, ADMIN]))
        .distinct()
        .order_by("username")[:MAX_OWNER_CHOICES]
    )


def split_form(
    *, name: str = "", regex: str = "", header: str = "", preview: SplitPreview | None = None, problem: str = ""
) -> dict[str, Any]:
    """The split card's fields as typed, and after Preview what the rule takes, shown beside the Split button.
    Only pattern_split fills it: a page's address never runs an expression over the pattern's dead letters (a link
    on another site could make a signed-in operator's browser start a scan of up to 10 s)."""
    return {"name": name, "regex": regex, "header": header, "preview": preview, "problem": problem}
