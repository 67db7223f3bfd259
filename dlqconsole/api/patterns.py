"""/api/v1/patterns/: failure patterns with the patterns page's filters, one pattern with its counts and history,
and their triage (status, owner, note), merging and splitting, through the services the pages use (so each writes
the same history and audit rows, the audit rows naming the token)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.http import QueryDict
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from dlqconsole.accounts.roles import OPERATOR
from dlqconsole.api.base import ApiViewSet
from dlqconsole.api.pattern_serializers import (
    PATTERN_ORDERS,
    MergeResultSerializer,
    MergeSerializer,
    PatternDetailSerializer,
    PatternFilterSerializer,
    PatternSerializer,
    SplitResultSerializer,
    SplitSerializer,
    TriageSerializer,
)
from dlqconsole.api.problems import FORBIDDEN, REFUSED, not_found
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.models import DeadLetterCount, DeadLetterStatus, FailurePattern
from dlqconsole.deadletters.pattern_filters import matching_patterns
from dlqconsole.deadletters.rule_services import split_pattern, split_preview, validate_rule
from dlqconsole.deadletters.services import (
    PatternError,
    assign_pattern,
    merge_patterns,
    merge_warnings,
    set_pattern_note,
    set_pattern_status,
)

FILTER_PARAMETERS = frozenset(PatternFilterSerializer().fields)
MAX_EVENTS = 50
MAX_ABSORBED = 50


def pattern_context(patterns: Iterable[FailurePattern], *, detail: bool = False) -> dict[str, Any]:
    """What the pattern serializers read besides the rows: the queues each waits in, how many wait, and for a
    detail its counts per status and broker, trend, history and the patterns merged into it (from the counters,
    never a count of dead letters)."""
    chosen = list(patterns)
    ids = [pattern.pk for pattern in chosen]
    waiting, queues = selectors.waiting_by_pattern(ids)
    context: dict[str, Any] = {"waiting": waiting, "queues": queues}
    if not detail:
        return context
    counts: dict[int, dict[str, int]] = {pk: dict.fromkeys(DeadLetterStatus.values, 0) for pk in ids}
    by_broker: dict[int, dict[str, int]] = defaultdict(dict)
    cells = DeadLetterCount.objects.filter(pattern_id__in=ids, count__gt=0)
    for pattern_id, broker, status, count in cells.values_list("pattern_id", "broker__name", "status", "count"):
        counts[pattern_id][status] = counts[pattern_id].get(status, 0) + count
        if status in selectors.WAITING:
            by_broker[pattern_id][broker] = by_broker[pattern_id].get(broker, 0) + count
    trends = selectors.pattern_trends(pattern_ids=ids, width=dt.timedelta(hours=1), buckets=24)
    context["details"] = {
        pattern.pk: {
            "counts": counts[pattern.pk],
            "waiting_by_broker": dict(sorted(by_broker[pattern.pk].items())),
            "trend": trends.get(pattern.pk, []),
            "events": list(pattern.events.select_related("actor")[:MAX_EVENTS]),
            "absorbed": list(pattern.absorbed.order_by("id").values_list("id", flat=True)[:MAX_ABSORBED]),
        }
        for pattern in chosen
    }
    return context


@extend_schema_view(
    list=extend_schema(
        operation_id="list_patterns",
        summary="List failure patterns",
        description="Newest first, a keyset page at a time. Patterns merged into another are left out (their "
        "own URL still answers, with merged_into). The filters are the patterns page's.",
        parameters=[PatternFilterSerializer],
        responses={200: PatternSerializer(many=True), 400: REFUSED},
    ),
    retrieve=extend_schema(
        operation_id="get_pattern",
        summary="Get one failure pattern",
        description="With its dead letters per status, what waits on each broker, its arrivals over the last day, "
        "its history and the patterns merged into it.",
        responses={200: PatternDetailSerializer, 404: not_found("pattern")},
    ),
    triage=extend_schema(
        operation_id="triage_pattern",
        summary="Triage a pattern: status, owner, note",
        description="Any of status, owner and note (operator role); what is left out stays as it is. All or "
        "nothing: a refused owner leaves the status unchanged too. Written to the pattern's history and the audit "
        "log.",
        request=TriageSerializer,
        responses={200: PatternDetailSerializer, 400: REFUSED, 403: FORBIDDEN, 404: not_found("pattern")},
    ),
    merge=extend_schema(
        operation_id="merge_patterns",
        summary="Merge patterns into one",
        description="The sources' dead letters, counts and fingerprints move to the target, and later arrivals "
        "with their fingerprints are filed there (operator role). With preview, only what it would do.",
        request=MergeSerializer,
        responses={200: MergeResultSerializer, 400: REFUSED, 403: FORBIDDEN},
    ),
    split=extend_schema(
        operation_id="split_pattern",
        summary="Split a pattern by a rule",
        description="The dead letters matching the rule move to a new pattern named after it, and the rule stays, "
        "so later arrivals that match go there too (operator role). With preview, only how many it would take.",
        request=SplitSerializer,
        responses={200: SplitResultSerializer, 400: REFUSED, 403: FORBIDDEN, 404: not_found("pattern")},
    ),
)
class PatternViewSet(ApiViewSet):
    queryset = FailurePattern.objects.all()
    serializer_class = PatternSerializer
    lookup_value_regex = r"[0-9]{1,18}"
    change_roles = {"triage": OPERATOR, "merge": OPERATOR, "split": OPERATOR}
    query_parameters = {"list": FILTER_PARAMETERS}

    def list(self, request: Request) -> Response:
        # An empty value is no filter, as on the page (a script may send every parameter, most of them empty).
        asked = PatternFilterSerializer(data={name: value for name, value in request.query_params.items() if value})
        asked.is_valid(raise_exception=True)
        chosen: dict[str, str] = dict(asked.validated_data)
        owner = chosen.get("owner", "")
        query = QueryDict(mutable=True)
        query.update({name: value for name, value in chosen.items() if name != "owner" or value in ("me", "none")})
        # The patterns page's own query: the page and the API filter alike (the API checked the values first).
        found, _ = matching_patterns(query, user_id=request.user.pk)
        self.paginator.ordering = PATTERN_ORDERS[chosen.get("sort") or "newest"]
        if owner and owner not in ("me", "none"):
            found = found.filter(owner__username=owner)
        page = self.paginate_queryset(found) or []
        context = {**self.get_serializer_context(), **pattern_context(page)}
        return self.get_paginated_response(PatternSerializer(page, many=True, context=context).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(self._detail(self._pattern(pk)))

    @action(detail=True, methods=["post"])
    def triage(self, request: Request, pk: str) -> Response:
        pattern = self._pattern(pk)
        asked = TriageSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        change = asked.validated_data
        with transaction.atomic():
            if "status" in change:
                pattern = set_pattern_status(pattern=pattern, status=change["status"], actor=request.user)
            if "owner" in change:
                pattern = assign_pattern(
                    pattern=pattern, owner=change["owner"], note=change.get("note"), actor=request.user
                )
            elif "note" in change:
                pattern = set_pattern_note(pattern=pattern, note=change["note"], actor=request.user)
        return Response(self._detail(self._pattern(pk)))

    @action(detail=False, methods=["post"])
    def merge(self, request: Request) -> Response:
        asked = MergeSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        target_id: int = asked.validated_data["target"]
        chosen = set(asked.validated_data["sources"]) - {target_id}
        target = FailurePattern.objects.select_related("owner", "merged_into").filter(pk=target_id).first()
        if target is None:
            raise PatternError(f"No pattern #{target_id}; nothing was merged.")
        if not chosen:
            raise PatternError("Name at least one pattern other than the target.")
        sources = list(FailurePattern.objects.select_related("owner").filter(pk__in=chosen).order_by("pk"))
        unknown = sorted(chosen - {pattern.pk for pattern in sources})
        if unknown:
            raise PatternError("No pattern " + ", ".join(f"#{pk}" for pk in unknown) + "; nothing was merged.")
        warnings = merge_warnings(target=target, sources=sources)
        moving = sum(pattern.total_count for pattern in sources)
        moved = None
        if not asked.validated_data["preview"]:
            moved = merge_patterns(sources=sources, target=target, actor=request.user)
            target = self._pattern(str(target_id))
            sources = list(FailurePattern.objects.select_related("owner").filter(pk__in=chosen).order_by("pk"))
        context = {**self.get_serializer_context(), **pattern_context([target, *sources], detail=True)}
        result = {
            "merged": moved is not None,
            "target": target,
            "sources": sources,
            "moved": moved,
            "moving": moving,
            "warnings": warnings,
        }
        return Response(MergeResultSerializer(result, context=context).data)

    @action(detail=True, methods=["post"])
    def split(self, request: Request, pk: str) -> Response:
        pattern = self._pattern(pk)
        asked = SplitSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        name, regex, header = (asked.validated_data[field] for field in ("name", "regex", "header"))
        if asked.validated_data["preview"]:
            if pattern.merged_into_id is not None:
                raise PatternError(f"Pattern #{pattern.pk} was merged into #{pattern.merged_into_id}; use that one.")
            validate_rule(name=name, regex=regex, header=header)
            found = split_preview(pattern=pattern, regex=regex, header=header)
            preview = {
                "matching": found.matching,
                "examined": found.examined,
                "exact": found.exact,
                "splits": found.splits,
                "examples": [{"id": pk, "error_message": message} for pk, message in found.examples],
            }
            result: dict[str, Any] = {"split": False, "pattern": pattern, "part": None, "preview": preview}
            shown = [pattern]
        else:
            part = split_pattern(pattern=pattern, name=name, regex=regex, header=header, actor=request.user)
            pattern, part = self._pattern(pk), self._pattern(str(part.pk))
            result = {"split": True, "pattern": pattern, "part": part, "preview": None}
            shown = [pattern, part]
        context = {**self.get_serializer_context(), **pattern_context(shown, detail=True)}
        return Response(SplitResultSerializer(result, context=context).data)

    def _pattern(self, pk: str) -> FailurePattern:
        pattern = FailurePattern.objects.select_related("owner", "merged_into").filter(pk=int(pk)).first()
        if pattern is None:
            raise NotFound(f"No pattern #{pk}.")
        return pattern

    def _detail(self, pattern: FailurePattern) -> Any:
        context = {**self.get_serializer_context(), **pattern_context([pattern], detail=True)}
        return PatternDetailSerializer(pattern, context=context).data


router = SimpleRouter()
router.register("patterns", PatternViewSet, basename="api-pattern")
urlpatterns: list[Any] = list(router.urls)
