"""The patterns page's filter and sorts, shared by the page and the API's pattern list."""

from __future__ import annotations

from django.db.models import OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import QueryDict

from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.models import DeadLetterCount, FailurePattern, FailureReason, PatternStatus

PATTERN_SORTS = {
    "waiting": ("-waiting", "-last_seen_at"),
    "total": ("-total_count", "-last_seen_at"),
    "last_seen": ("-last_seen_at",),
    "first_seen": ("-first_seen_at",),
    "oldest": ("first_seen_at",),
}


def matching_patterns(query: QueryDict, *, user_id: int | None) -> tuple[QuerySet[FailurePattern], dict[str, str]]:
    """The patterns the patterns page's filter selects (`status`, `reason`, `queue`, `broker`, `q`, `owner`, `sort`),
    each annotated with how many of its dead letters wait, in the chosen order; and the filter as read."""
    chosen = {
        "status": query.get("status", ""),
        "reason": query.get("reason", ""),
        "queue": query.get("queue", ""),
        "broker": query.get("broker", ""),
        "q": query.get("q", "").strip(),
        "owner": query.get("owner", ""),
        "sort": query.get("sort", "waiting") if query.get("sort") in PATTERN_SORTS else "waiting",
    }
    # A broker chosen: patterns count and sort by what waits on that broker (patterns span brokers).
    cells = DeadLetterCount.objects.all()
    if chosen["broker"]:
        cells = cells.filter(broker__name=chosen["broker"])
    waiting = (
        cells.filter(pattern=OuterRef("pk"), status__in=selectors.WAITING)
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
    if chosen["queue"] or chosen["broker"]:
        in_queue = cells.filter(count__gt=0)
        if chosen["queue"]:
            in_queue = in_queue.filter(source_queue=chosen["queue"])
        patterns = patterns.filter(pk__in=in_queue.values("pattern_id"))
    if "\x00" in chosen["q"] + chosen["queue"] + chosen["broker"]:
        patterns = patterns.none()  # stored text never holds a NUL (PostgreSQL refuses one): nothing matches
    elif chosen["q"]:
        patterns = patterns.filter(Q(template__icontains=chosen["q"]) | Q(error_type__icontains=chosen["q"]))
    if chosen["owner"] == "me":
        patterns = patterns.filter(owner_id=user_id)
    elif chosen["owner"] == "none":
        patterns = patterns.filter(owner__isnull=True)
    return patterns.order_by(*PATTERN_SORTS[chosen["sort"]], "-id"), chosen
