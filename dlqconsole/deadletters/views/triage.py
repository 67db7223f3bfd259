"""The writes of the patterns pages, through the pattern services: triage (status, owner, note), merging
patterns and splitting one by a rule. Each answers htmx with the row or card it changed, and a plain POST with a
redirect back."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from dlqconsole.accounts.roles import OPERATOR, require_role
from dlqconsole.core.views import HtmxHttpRequest, safe_next
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.forms import (
    PatternAssignForm,
    PatternMergeForm,
    PatternSplitForm,
    PatternStatusForm,
    error_text,
)
from dlqconsole.deadletters.models import DeadLetterCount, FailurePattern
from dlqconsole.deadletters.rule_services import split_pattern, split_preview, validate_rule
from dlqconsole.deadletters.services import (
    PatternError,
    assign_pattern,
    merge_patterns,
    merge_warnings,
    set_pattern_status,
)
from dlqconsole.deadletters.views.patterns import (
    PATTERN_ACTIONS,
    PATTERN_SORTS,
    owner_choices,
    pattern_page_context,
    row_paths,
    split_form,
)

# The split card's fields, kept as typed when the card comes back with a problem.
SPLIT_FIELDS = ("name", "regex", "header")


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
        **row_paths(),
    }
    return render(request, "deadletters/patterns.html#row", context)


def pattern_detail_fragment(request: HtmxHttpRequest, pattern: FailurePattern, *, back_url: str) -> HttpResponse:
    cells = DeadLetterCount.objects.filter(pattern=pattern, status__in=selectors.WAITING, count__gt=0)
    context = {
        "owners": owner_choices(),
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
    form = PatternStatusForm(request.POST)
    back_url = _back(request, reverse("deadletters:pattern", args=[pattern.pk]))
    problem = "" if form.is_valid() else error_text(form)
    fragment = form.cleaned_data.get("fragment") or "row"
    if not problem:
        try:
            set_pattern_status(pattern=pattern, status=form.cleaned_data["status"], actor=request.user)
        except PatternError as refusal:
            problem = str(refusal)
    if problem:
        messages.error(request, problem)
        if request.htmx:
            # The row as it is; the error travels with it into the page's flash list.
            return _pattern_fragment(request, pattern, back_url=back_url, fragment=fragment)
        return redirect(back_url)
    pattern.refresh_from_db()
    if request.htmx:
        return _pattern_fragment(request, pattern, back_url=back_url, fragment=fragment)
    messages.success(request, f"Pattern #{pattern.pk} is now {pattern.get_status_display().lower()}.")
    return redirect(back_url)


@require_POST
def pattern_assign(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, OPERATOR)
    pattern = get_object_or_404(FailurePattern, pk=pk)
    form = PatternAssignForm(request.POST, user=request.user)
    back_url = _back(request, reverse("deadletters:pattern", args=[pattern.pk]))
    problem = "" if form.is_valid() else error_text(form)
    if not problem:
        try:
            assign_pattern(
                pattern=pattern,
                owner=form.cleaned_data["owner"],
                note=form.cleaned_data["note"],
                actor=request.user,
            )
        except PatternError as refusal:
            problem = str(refusal)
    if problem:
        messages.error(request, problem)
        if request.htmx:
            # The card as it is; the error travels with it into the page's flash list.
            return _pattern_fragment(request, pattern, back_url=back_url, fragment="summary")
        return redirect(back_url)
    pattern.refresh_from_db()
    messages.success(request, f"Pattern #{pattern.pk} saved.")  # shown in place after an htmx save too
    if request.htmx:
        return _pattern_fragment(request, pattern, back_url=back_url, fragment="summary")
    return redirect(back_url)


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
    form = PatternMergeForm(request.POST)
    if not form.is_valid():
        messages.error(request, error_text(form))
        return redirect(back_url)
    chosen: set[int] = form.cleaned_data["sources"]
    # No target chosen: the ticked pattern with the most dead letters (its template, triage and history stay).
    busiest = FailurePattern.objects.filter(pk__in=chosen).order_by("-total_count", "pk").values_list("pk", flat=True)
    typed: int | None = form.cleaned_data["target"]
    target_id = typed if typed is not None else busiest.first()
    if target_id is None:
        messages.error(request, "Choose the patterns to merge (pattern numbers) and the one to merge them into.")
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
    previewed = form.cleaned_data["previewed"]
    if form.cleaned_data["action"] != "merge" or (previewed is not None and previewed != target.pk):
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


@require_POST
@vary_on_headers("HX-Request")
def pattern_split(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Split the dead letters matching a rule off into a new pattern: first a preview of how many (the pattern page,
    or its split card for htmx, on this same address), then the split. The preview is a POST like the split: it runs
    the expression over up to SPLIT_PREVIEW_LIMIT dead letters, which no link from another site may start."""
    require_role(request.user, OPERATOR)
    pattern = get_object_or_404(FailurePattern.objects.select_related("owner", "merged_into"), pk=pk)
    form = PatternSplitForm(request.POST)
    if not form.is_valid():
        # The card keeps what was typed, a field the form refused as it came.
        name, regex, header = (str(form.cleaned_data.get(field, form.data.get(field, ""))) for field in SPLIT_FIELDS)
        typed = split_form(name=name, regex=regex, header=header, problem=error_text(form))
        return _split_page(request, pattern, typed)
    name, regex, header = form.cleaned_data["name"], form.cleaned_data["regex"], form.cleaned_data["header"]
    try:
        if form.cleaned_data["action"] != "split":
            if pattern.merged_into_id is not None:
                raise PatternError(f"Pattern #{pattern.pk} was merged into #{pattern.merged_into_id}; use that one.")
            validate_rule(name=name, regex=regex, header=header)
            preview = split_preview(pattern=pattern, regex=regex, header=header)
            return _split_page(request, pattern, split_form(name=name, regex=regex, header=header, preview=preview))
        part = split_pattern(pattern=pattern, name=name, regex=regex, header=header, actor=request.user)
    except PatternError as problem:
        # The split card shows the problem beside the fields it is about, and keeps what was typed.
        typed = split_form(name=name, regex=regex, header=header, problem=str(problem))
        return _split_page(request, pattern, typed)
    messages.success(request, f"Split into pattern #{part.pk}.")
    return redirect("deadletters:pattern", pk=part.pk)


def _split_page(request: HtmxHttpRequest, pattern: FailurePattern, split: dict[str, Any]) -> HttpResponse:
    if request.htmx:
        return render(request, "deadletters/pattern_detail.html#split", {"pattern": pattern, "split": split})
    back_url = reverse("deadletters:pattern", args=[pattern.pk])
    context = pattern_page_context(pattern, back_url=back_url, split=split)
    return render(request, "deadletters/pattern_detail.html", context)
