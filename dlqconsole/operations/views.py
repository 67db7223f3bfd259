"""Pages for bulk recovery: plan an operation from a filter, confirm it, watch it run, steer it, see history;
retry one message straight from its page.

The views parse input, check the role, call one operations service and answer with the page, or with the
fragment htmx asked for. Purge needs the admin role; every other kind the operator role.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db.models import Sum
from django.http import Http404, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import OPERATOR, require_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.core.views import HtmxHttpRequest, keyset_page, parse_id, partial_template
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern
from dlqconsole.deadletters.templatetags.charts import percent
from dlqconsole.operations import history, planning, purged, services
from dlqconsole.operations.breaker_views import breaker_context
from dlqconsole.operations.canary import refresh_came_back
from dlqconsole.operations.forms import PlanForm
from dlqconsole.operations.item_sql import WHY_IT_DIED, CameBack, boomerangs
from dlqconsole.operations.message_retry import retry_dead_letter
from dlqconsole.operations.models import (
    ACTIVE_STATUSES,
    Operation,
    OperationKind,
    OperationStatus,
    eligible_statuses,
    share_text,
)
from dlqconsole.operations.shed_views import SHED_FIELDS
from dlqconsole.operations.worker_watch import watch_worker

HISTORY_PAGE_SIZE = 50
# Each reason its replays came back for links to the messages page of those boomerangs, by id, up to this many.
CAME_BACK_LINK_IDS = 100
# A planned purge links to the messages export of its filter; past this length its address would be refused by
# servers and proxies (gunicorn takes 4,094 bytes a request line), so the page offers a form that posts it instead.
MAX_EXPORT_QUERY = 2000
# The token a message page gives its Retry button: one per page load, so a double click retries once.
SUBMISSION = re.compile(r"^[0-9a-f]{32}$")

PLANNABLE_KINDS = (
    OperationKind.RETRY,
    OperationKind.MOVE,
    OperationKind.ARCHIVE,
    OperationKind.RESTORE,
    OperationKind.PURGE,
)
RATE_CHOICES = [("", "no limit"), ("10/1s", "10 per second"), ("50/1s", "50 per second"), ("200/1s", "200 per second")]
CANARY_CHOICES = [0, 1, 5, 10, 50, 100]


def require_kind_role(user: Any, kind: str) -> None:
    """Purge destroys messages for good: admins only. The other kinds recover them: operators."""
    require_role(user, services.required_role(kind))


def _filter_from(query: QueryDict) -> DeadLetterFilter:
    """The filter of a plan: the ticked rows, or everything matching the filter when scope is "all"."""
    chosen = DeadLetterFilter.from_querydict(query)
    if query.get("scope") == "all":
        chosen.ids = []
    elif query.get("scope") == "selected" and not chosen.ids:
        raise FilterError("Tick at least one message, or choose all matching this filter.")
    return chosen


# Ticked dead letters are counted for the estimate up to this many; beyond, the plan counts them.
ESTIMATE_MAX_IDS = 10_000


def estimate(chosen: DeadLetterFilter, *, kind: str) -> int | None:
    """How many dead letters the operation would take: from the counters when the filter only names counted
    fields (pattern, source queue, reason, status), by their ids when rows were ticked; None when only the plan
    itself can tell."""
    used = set(chosen.to_dict())
    statuses = eligible_statuses(kind, chosen.status)
    if used <= {"ids", "status"} and chosen.ids:
        # Ticked rows: a primary-key probe each, cheap for the few thousand a page can tick.
        if len(chosen.ids) > ESTIMATE_MAX_IDS:
            return None
        return DeadLetter.objects.filter(pk__in=chosen.ids, status__in=statuses).count()
    if not used <= {"pattern", "broker", "queue", "reason", "status"}:
        return None
    cells = DeadLetterCount.objects.filter(status__in=statuses)
    if chosen.pattern:
        cells = cells.filter(pattern_id__in=chosen.pattern)
    if chosen.reason:
        cells = cells.filter(failure_reason__in=chosen.reason)
    if chosen.broker:
        cells = cells.filter(broker__name__in=chosen.broker)
    if chosen.queue:
        # The counters know source queues only; a filter naming an original queue cannot be estimated here.
        known = DeadLetterCount.objects.filter(source_queue__in=chosen.queue).values_list("source_queue", flat=True)
        if set(known) != set(chosen.queue):
            return None
        cells = cells.filter(source_queue__in=chosen.queue)
    return int(cells.aggregate(total=Sum("count"))["total"] or 0)


@require_http_methods(["GET", "POST"])
def operation_plan(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the choices for a new operation over a filter. POST: freeze the plan and show it for confirmation."""
    query = request.GET if request.method == "GET" else request.POST
    kind = query.get("kind", "")
    if kind not in PLANNABLE_KINDS:
        messages.error(request, "Choose what to do: retry, move, archive, restore or purge.")
        return redirect("deadletters:messages")
    require_kind_role(request.user, kind)
    error = ""
    try:
        chosen = _filter_from(query)
    except FilterError as problem:
        error = str(problem)
        chosen = DeadLetterFilter()
    if chosen.is_empty() and not error:
        error = "An operation needs a filter; an empty one would touch every dead letter."
    planned_estimate = estimate(chosen, kind=kind) if not error else None
    plan_size = _plan_size(planned_estimate, query.get("limit", ""))
    context = {
        "kind": kind,
        "kind_label": OperationKind(kind).label,
        "chosen": chosen,
        "filter_items": _filter_items(chosen),
        "filter_shown": _filter_shown(chosen),
        "estimate": planned_estimate,
        "patterns": FailurePattern.objects.filter(pk__in=chosen.pattern[:20]) if chosen.pattern else [],
        "rate_choices": RATE_CHOICES,
        # A move may go to another broker: the choice is offered where there is more than one.
        "brokers": _broker_choices() if kind == OperationKind.MOVE else [],
        "plan_size": plan_size,
        "canary_choices": canary_choices(plan_size, chosen=query.get("canary_size", "0")),
        "values": {
            # A first look at the plan starts from the default rate; a rate cleared on purpose stays cleared.
            "rate": query.get("rate", settings.DLQ_DEFAULT_REPLAY_RATE),
            "canary_size": query.get("canary_size", "0"),
            "target_queue": query.get("target_queue", ""),
            "target_exchange": query.get("target_exchange", ""),
            "target_routing_key": query.get("target_routing_key", ""),
            "target_broker": query.get("target_broker", ""),
            "limit": query.get("limit", ""),
        },
        "error": error,
    }
    if request.method == "GET" or error:
        return render(
            request, "operations/plan.html", context, status=400 if error and request.method == "POST" else 200
        )
    form = PlanForm(query)
    if not form.is_valid():
        context["error"] = form.problem()
        return render(request, "operations/plan.html", context, status=400)
    try:
        operation = planning.plan_operation(kind=kind, filter=chosen.to_dict(), actor=request.user, **form.cleaned_data)
    except (services.OperationError, FilterError) as problem:
        context["error"] = str(problem)
        return render(request, "operations/plan.html", context, status=400)
    return redirect("operations:detail", pk=operation.pk)


def _broker_choices() -> list[str]:
    """The names of the brokers a move may go to, when there is more than one (else the page asks nothing)."""
    names = [broker.name for broker in registry.brokers()]
    return names if len(names) > 1 else []


def _plan_size(estimate: int | None, limit: str) -> int | None:
    """About how many messages the plan will take: the estimate, capped by the limit; None when unknown."""
    if estimate is None:
        return None
    limit = limit.strip()
    if limit.isascii() and limit.isdigit() and int(limit) > 0:
        return min(estimate, int(limit))
    return estimate


def canary_choices(plan_size: int | None, *, chosen: str = "") -> list[dict[str, Any]]:
    """The canary sizes offered, each saying what share of the plan it is when the plan's size is known; one not
    smaller than the plan is offered disabled (the plan would refuse it: it would replay everything unwatched)."""
    choices = []
    for size in CANARY_CHOICES:
        label, disabled = "no canary", False
        if size:
            label = f"first {size}, then wait"
            if plan_size:
                if size >= plan_size:
                    label = f"first {size}: not smaller than the plan (about {plan_size:,})"
                    disabled = str(size) != chosen
                else:
                    label += f" ({share_text(size, plan_size)} of about {plan_size:,})"
        choices.append({"size": size, "label": label, "disabled": disabled})
    return choices


def _filter_shown(chosen: DeadLetterFilter, *, most: int = 20) -> list[tuple[str, str]]:
    """The filter as the plan form shows it: one line per field, a long list of ids cut short."""
    shown = []
    for name, value in chosen.to_dict().items():
        values = [str(item) for item in value] if isinstance(value, list) else [str(value)]
        text = ", ".join(values[:most])
        if len(values) > most:
            text += f" … and {len(values) - most:,} more"
        shown.append((name, text))
    return shown


def _filter_items(chosen: DeadLetterFilter) -> list[tuple[str, str]]:
    items = []
    for name, value in chosen.to_dict().items():
        for item in value if isinstance(value, list) else [value]:
            items.append((name, str(item)))
    return items


@require_GET
@vary_on_headers("HX-Request")
def operations_list(request: HtmxHttpRequest) -> HttpResponse:
    operations = Operation.objects.select_related("created_by", "target_broker").order_by("-id")
    status = request.GET.get("status", "")
    kind = request.GET.get("kind", "")
    names = sorted(selectors.broker_names().values())
    broker = request.GET.get("broker", "")
    operations = history.filtered(operations, status=status, kind=kind, broker=broker if broker in names else "")
    rows, _, more = keyset_page(operations, size=HISTORY_PAGE_SIZE, before=parse_id(request.GET.get("before")))
    kept = request.GET.copy()
    kept.pop("before", None)
    context = {
        "operations": rows,
        "older_query": f"{kept.urlencode()}&before={rows[-1].pk}" if more and rows else "",
        "status": status,
        "kind": kind,
        "broker": broker,
        "brokers": names if len(names) > 1 else [],
        "statuses": OperationStatus.choices,
        "kinds": OperationKind.choices,
        # Refresh while a worker moves one on; planned and paused ones wait for a person, not for a refresh.
        "running": any(operation.status in ACTIVE_STATUSES for operation in rows),
        **breaker_context(request),
    }
    return render(request, partial_template(request, "operations/list.html", "table"), context)


@require_GET
@vary_on_headers("HX-Request")
def operation_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    operation = get_object_or_404(Operation.objects.select_related("created_by", "target_broker"), pk=pk)
    # What came back after no worker runs it any more (a paused canary's other messages, say) is counted here.
    refresh_came_back(operation=operation, on_read=True)
    context = _detail_context(operation)
    if request.htmx:
        response = render(request, "operations/detail.html#progress", context)
        if context["settled"]:
            # 286 tells htmx to stop polling; the final state is still swapped in. A cancelled operation whose
            # worker still settles its in-flight messages is polled on until its numbers are final.
            response.status_code = HttpResponseStopPolling.status_code
        return response
    return render(request, "operations/detail.html", context)


def _figures(operation: Operation) -> dict[str, Any]:
    """What happened to its messages, each counted once (history.figures), with the share done and the bar."""
    counted = history.figures(operation)
    return {
        **asdict(counted),
        "done_percent": percent(counted.done, operation.total),
        "bar": operation.bar(not_attempted=counted.not_attempted),
    }


def _replan_url(operation: Operation) -> str:
    """The plan page again, with this plan's kind, filter, target and rate: a fresh snapshot of the same filter (for
    a shed, the shed page with its queue and flags)."""
    query = QueryDict(mutable=True)
    if operation.kind == OperationKind.SHED:
        for name in SHED_FIELDS:
            value = operation.rate if name == "rate" else operation.shed_plan.get(name)
            if value:
                query[name] = str(value)
        return f"{reverse('operations:shed')}?{query.urlencode()}"
    query["kind"] = operation.kind
    for name, value in (operation.filter or {}).items():
        query.setlist(name, [str(item) for item in value] if isinstance(value, list) else [str(value)])
    for name in ("target_queue", "target_exchange", "target_routing_key", "rate"):
        if getattr(operation, name):
            query[name] = getattr(operation, name)
    if operation.target_broker is not None:
        query["target_broker"] = operation.target_broker.name
    return f"{reverse('operations:plan')}?{query.urlencode()}"


def _shed_messages_url(operation: Operation) -> str:
    """The messages page showing the dead letters a shed made (its queue, reason SHED, archived)."""
    if operation.kind != OperationKind.SHED:
        return ""
    query = _filter_query(operation)
    query["status"] = "archived"
    return f"{reverse('deadletters:messages')}?{query.urlencode()}"


def _filter_query(operation: Operation) -> QueryDict:
    """The operation's filter as the messages page's query (a list field repeats its name)."""
    query = QueryDict(mutable=True)
    for name, value in (operation.filter or {}).items():
        query.setlist(name, [str(item) for item in value] if isinstance(value, list) else [str(value)])
    return query


def _purge_export(operation: Operation) -> dict[str, Any] | None:
    """For a planned purge: the messages export of exactly its filter, offered before the count is typed, so what
    will be deleted can be kept. Links when the address is short enough, else the fields of a form that posts it
    (a background export)."""
    if operation.kind != OperationKind.PURGE or operation.status != OperationStatus.PLANNED:
        return None
    query = _filter_query(operation)
    if len(query.urlencode()) > MAX_EXPORT_QUERY:
        return {"fields": [(name, value) for name, values in query.lists() for value in values]}
    base = reverse("deadletters:export")
    links = {}
    for export_format in ("csv", "jsonl"):
        with_format = QueryDict(mutable=True)
        with_format["format"] = export_format
        for name, values in query.lists():
            with_format.setlist(name, values)
        links[export_format] = f"{base}?{with_format.urlencode()}"
    return links


def _purge_record(operation: Operation) -> str:
    """Whether a started purge's list of what it deleted is kept ("kept"), was deleted with its audit row
    ("gone"), or there is none to speak of ("")."""
    if operation.kind != OperationKind.PURGE or operation.started_at is None:
        return ""
    if purged.has_record(operation):
        return "kept"
    return "gone" if operation.succeeded else ""


def _came_back(operation: Operation) -> list[dict[str, Any]]:
    """Why its replays came back, a row per failure reason (commonest first), each with a link to the messages
    page showing those boomerangs (the first CAME_BACK_LINK_IDS of them) while its items are kept."""
    came_back = CameBack.of(operation)
    ids: dict[str, list[int]] = {reason: [] for reason in came_back.reasons}
    if came_back.count and operation.started_at is not None and operation.items_removed_at is None:
        # Unordered: an ORDER BY id with a LIMIT may lead PostgreSQL to walk the whole table in id order.
        found = boomerangs(operation=operation).order_by().annotate(why=WHY_IT_DIED).values_list("pk", "why")
        for pk, reason in sorted(found[: CAME_BACK_LINK_IDS * max(1, len(ids))]):
            if len(ids.setdefault(reason, [])) < CAME_BACK_LINK_IDS:
                ids[reason].append(pk)
    base = reverse("deadletters:messages")
    return [
        {
            "reason": reason,
            "words": words,
            "count": count,
            "link": f"{base}?ids={','.join(map(str, ids[reason]))}" if ids.get(reason) else "",
            "linked": len(ids.get(reason) or []),
        }
        for reason, words, count in came_back.rows
    ]


def _detail_context(operation: Operation) -> dict[str, Any]:
    breakdown = operation.breakdown or {}
    planned = operation.status == OperationStatus.PLANNED
    unreplayable_count = sum(int(count) for count in (operation.unreplayable_reasons or {}).values())
    return {
        "operation": operation,
        "figures": _figures(operation),
        "came_back": _came_back(operation) if operation.publishes else [],
        # No worker has taken it yet, or how long ago its worker wrote.
        "worker": watch_worker(operation),
        # A shed's skipped messages are those it gave back to the queue, as meant.
        "skipped_word": "left in the queue" if operation.kind == OperationKind.SHED else "skipped",
        "shed_messages_url": _shed_messages_url(operation),
        "replan_url": _replan_url(operation) if planned else "",
        # An old snapshot: Start asks for a tick (checked on the server too).
        "stale_plan": planned and timezone.now() - operation.created_at > services.STALE_PLAN_AGE,
        # timesince says "0 minutes" under a minute.
        "fresh_plan": planned and timezone.now() - operation.created_at < dt.timedelta(minutes=1),
        "filter_text": "; ".join(
            f"{name} = {', '.join(map(str, value)) if isinstance(value, list) else value}"
            for name, value in (operation.filter or {}).items()
        ),
        "finished": operation.is_finished,
        # Final numbers: finished, and nothing in flight left to settle (a cancel settles them a moment later).
        "settled": operation.is_finished and not operation.in_flight,
        "queues": sorted((breakdown.get("queue") or {}).items(), key=lambda item: -int(item[1])),
        "patterns": list(breakdown.get("pattern") or []),
        "destinations": sorted((breakdown.get("destination") or {}).items(), key=lambda item: -int(item[1])),
        "brokers": operation.broker_counts if operation.names_brokers else [],
        "unreplayable": sorted((operation.unreplayable_reasons or {}).items(), key=lambda item: -int(item[1])),
        "unreplayable_count": unreplayable_count,
        # Start could only mark every message failed: the button is disabled (and the server refuses it).
        "nothing_replayable": operation.nothing_replayable,
        # Nothing matched in a state the kind acts on: Start is disabled (and the server refuses it).
        "empty_plan": planned and operation.total == 0,
        "rate_choices": RATE_CHOICES,
        "purge_export": _purge_export(operation),
        "purge_record": _purge_record(operation),
        "audit_days": settings.DLQ_AUDIT_RETENTION_DAYS,
        # Once retention removed the items, their summary keeps the commonest errors (with counts) instead.
        "failed_items": (
            []
            if operation.items_summary is not None
            else list(operation.items.filter(status="failed").order_by("id")[:20])
        ),
        "summary_errors": (operation.items_summary or {}).get("errors") or [],
        "finished_retention_days": settings.DLQ_FINISHED_RETENTION_DAYS,
        # Who stopped it, so that a cancel never reads as something the system did on its own.
        "cancelled_by": (
            AuditEntry.objects.filter(action="operation.cancel", target=f"operation:{operation.pk}")
            .order_by("-pk")
            .first()
            if operation.status == OperationStatus.CANCELLED
            else None
        ),
    }


def _control_response(request: HtmxHttpRequest, operation: Operation, done: str) -> HttpResponse:
    operation.refresh_from_db()
    if request.htmx:
        # A control's reply replaces the feedback region (the polls keep it): the action succeeded, so an error
        # left by an earlier one goes.
        return render(request, "operations/detail.html#progress", {**_detail_context(operation), "control_reply": True})
    messages.success(request, done)
    return redirect("operations:detail", pk=operation.pk)


def _control_error(
    request: HtmxHttpRequest, operation: Operation, problem: Exception, *, typed: dict[str, str] | None = None
) -> HttpResponse:
    """A refused control, as 409 (htmx swaps it in). The reason goes into the feedback region, which the polls keep
    (hx-preserve), so it stays until the next action or until dismissed. Without htmx the whole page is rendered
    with the reason and what was typed in its field."""
    operation.refresh_from_db()
    context = _detail_context(operation)
    context["control_error"] = str(problem)
    context["typed"] = typed or {}
    context["control_reply"] = True
    if request.htmx:
        return render(request, "operations/detail.html#progress", context, status=409)
    return render(request, "operations/detail.html", context, status=409)


def _control(request: HtmxHttpRequest, pk: int, action: Callable[..., Operation], done: str) -> HttpResponse:
    """Start, pause, resume or cancel: the role for the operation's kind, the service call, the response."""
    operation = get_object_or_404(Operation, pk=pk)
    require_kind_role(request.user, operation.kind)
    try:
        action(operation=operation, actor=request.user)
    except services.OperationError as problem:
        return _control_error(request, operation, problem)
    return _control_response(request, operation, done)


@require_GET
def operation_purged(request: HtmxHttpRequest, pk: int) -> StreamingHttpResponse:
    """The dead letters a purge deleted, as CSV (operators and admins), streamed in keyset pages, for as long as
    the purge's audit row lives."""
    require_role(request.user, OPERATOR)
    operation = get_object_or_404(Operation, pk=pk, kind=OperationKind.PURGE)
    if not purged.has_record(operation):
        raise Http404("No list of the dead letters this purge deleted is kept.")
    record_audit(
        actor=request.user,
        action="export",
        target=f"operation:{operation.pk}",
        detail="the dead letters this purge deleted, as CSV",
    )
    response = StreamingHttpResponse(purged.csv_lines(operation), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="purge-{operation.pk}-deleted.csv"'
    return response


@require_POST
def operation_start(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Start a planned operation. A purge deletes for good, so its form asks for the number of messages typed
    in; the service refuses a wrong or missing one. A plan none of whose messages can be replayed is refused
    too (its Start button is disabled; this is the server's own check), and a plan older than STALE_PLAN_AGE starts
    only with its "start it anyway" box ticked."""
    operation = get_object_or_404(Operation, pk=pk)
    require_kind_role(request.user, operation.kind)
    typed = request.POST.get("typed_count", "") if operation.kind in services.TYPED_KINDS else None
    try:
        services.start_operation(
            operation=operation,
            actor=request.user,
            typed_count=typed,
            require_replayable=True,
            stale_confirmed=request.POST.get("stale_confirmed") == "yes",
        )
    except services.OperationError as problem:
        return _control_error(request, operation, problem, typed={"typed_count": typed or ""})
    return _control_response(request, operation, "Started.")


@require_POST
def operation_pause(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    return _control(request, pk, services.pause_operation, "Paused.")


@require_POST
def operation_resume(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    return _control(request, pk, services.resume_operation, "Resumed.")


@require_POST
def operation_cancel(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    planned = Operation.objects.filter(pk=pk, status=OperationStatus.PLANNED).exists()
    return _control(request, pk, services.cancel_operation, "Plan discarded." if planned else "Cancelled.")


@require_POST
def operation_rate(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    operation = get_object_or_404(Operation, pk=pk)
    require_kind_role(request.user, operation.kind)
    rate = request.POST.get("rate", "").strip()
    try:
        services.change_rate(operation=operation, rate=rate, actor=request.user)
    except services.OperationError as problem:
        return _control_error(request, operation, problem, typed={"rate": rate})
    return _control_response(request, operation, f"Rate set to {rate or 'no limit'}.")


@require_POST
def message_retry(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Retry one dead letter from its page: plan a retry of just this message and start it, then show the
    operation. The form carries a submission token (sent twice, it retries once) and the status the page showed
    (a message that changed since, replayed by someone else for instance, is not retried unseen)."""
    require_kind_role(request.user, OperationKind.RETRY)
    submission = request.POST.get("submission", "")
    if not SUBMISSION.match(submission):
        return HttpResponse("The form is missing its submission token; reload the page.", status=400)
    dead_letter = get_object_or_404(DeadLetter, pk=pk)
    try:
        operation = retry_dead_letter(
            dead_letter=dead_letter, actor=request.user, submission=submission, seen_status=request.POST.get("status")
        )
    except services.OperationError as problem:
        messages.warning(request, f"Dead letter #{pk}: nothing was retried; {problem}.")
        return redirect("deadletters:message", pk=pk)
    messages.success(request, f"Retrying dead letter #{pk}.")
    return redirect("operations:detail", pk=operation.pk)
