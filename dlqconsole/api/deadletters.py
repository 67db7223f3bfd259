"""/api/v1/dead-letters/: the dead letters a filter selects, newest first a keyset page at a time (the messages
page's filters, parsed by the same DeadLetterFilter), and one dead letter whole with its body and the chain of
records of the same message."""

from __future__ import annotations

from typing import Any

from django.db import OperationalError
from django.db.models import QuerySet
from django.db.models.functions import Left
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from dlqconsole.api.base import ApiViewSet
from dlqconsole.api.deadletter_serializers import (
    ERROR_EXCERPT_CHARS,
    ROW_COLUMNS,
    BodyQuerySerializer,
    DeadLetterRowSerializer,
    DeadLetterSerializer,
    LinkedDeadLetterSerializer,
    filter_parameters,
)
from dlqconsole.api.problems import REFUSED, not_found
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter

# A list query that runs longer is stopped (PostgreSQL) and answered 400, as the messages page stops its own.
QUERY_TIMEOUT_MS = 5000
# How far the chain of records a dead letter was replayed from is followed, and how many of each kind of later
# record are listed (as its page does).
MAX_ANCESTORS = 20
MAX_LINKED = 50
# Query parameters the list takes besides the filter's fields; any other is refused (a mistyped filter would
# otherwise select everything).
LINK_COLUMNS = ("id", "status", "ingested_at")


@extend_schema_view(
    list=extend_schema(
        operation_id="list_dead_letters",
        summary="List dead letters",
        description="Newest first, a keyset page at a time (`next` and `previous` are cursors; no counts, no "
        "offsets). Filters are those of the messages page; without a status filter, archived dead letters are left "
        "out. The error message of a row is cut to its first "
        f"{ERROR_EXCERPT_CHARS} characters.",
        parameters=filter_parameters(),
        responses={200: DeadLetterRowSerializer(many=True), 400: REFUSED},
    ),
    retrieve=extend_schema(
        operation_id="get_dead_letter",
        summary="Get one dead letter",
        description="Everything stored of one dead letter: headers, properties, death history, stack trace, parse "
        "problems, the body, and the records of the same message (replayed from, replayed into, edited, "
        "identical).",
        parameters=[BodyQuerySerializer],
        responses={200: DeadLetterSerializer, 400: REFUSED, 404: not_found("dead letter")},
    ),
)
class DeadLetterViewSet(ApiViewSet):
    queryset = DeadLetter.objects.all()
    serializer_class = DeadLetterRowSerializer
    lookup_value_regex = r"[0-9]{1,18}"
    query_parameters = {"list": frozenset(DeadLetterFilter.FIELDS), "retrieve": frozenset({"body"})}

    def list(self, request: Request) -> Response:
        chosen = DeadLetterFilter.from_querydict(request.query_params)
        found: QuerySet[DeadLetter] = chosen.apply()
        if selectors.counted_matches(chosen) == 0:
            found = DeadLetter.objects.none()  # the counters say nothing matches: no need to scan for it
        rows = (
            found.select_related("broker")
            .only(*ROW_COLUMNS)
            .annotate(error_excerpt=Left("error_message", ERROR_EXCERPT_CHARS + 1))
        )
        try:
            with selectors.time_limit(milliseconds=QUERY_TIMEOUT_MS):
                page = self.paginate_queryset(rows)
        except OperationalError:
            raise FilterError(
                f"This search took longer than {QUERY_TIMEOUT_MS / 1000:g} s and was stopped. Narrow it with a queue, "
                "a pattern or a time range (since / until)."
            ) from None
        serializer = DeadLetterRowSerializer(page, many=True, context=self.get_serializer_context())
        return self.get_paginated_response(serializer.data)

    def retrieve(self, request: Request, pk: str) -> Response:
        asked = BodyQuerySerializer(data=request.query_params)
        asked.is_valid(raise_exception=True)
        letter = DeadLetter.objects.select_related("broker", "pattern").filter(pk=int(pk)).first()
        if letter is None:
            raise NotFound(f"No dead letter #{pk}.")
        context = {**self.get_serializer_context(), "body": asked.validated_data["body"], "chain": self._chain(letter)}
        return Response(DeadLetterSerializer(letter, context=context).data)

    def _chain(self, letter: DeadLetter) -> dict[str, Any]:
        """The records of the same message, each as a link: what it was replayed from (nearest first), what was
        replayed from it and died again, its edits and what it was edited from, and its identical copies."""
        context = self.get_serializer_context()

        def links(rows: Any) -> list[Any]:
            return LinkedDeadLetterSerializer(list(rows), many=True, context=context).data  # type: ignore[no-any-return]

        def one(pk: int | None) -> Any:
            row = DeadLetter.objects.filter(pk=pk).only(*LINK_COLUMNS).first() if pk else None
            return LinkedDeadLetterSerializer(row, context=context).data if row is not None else None

        ancestors = selectors.ancestors(letter, columns=LINK_COLUMNS, limit=MAX_ANCESTORS)
        return {
            "previous": links(ancestors[:1])[0] if ancestors else None,
            "ancestors": links(ancestors),
            "boomerangs": links(letter.boomerangs.order_by("id").only(*LINK_COLUMNS)[:MAX_LINKED]),
            "edited_from": one(letter.edited_from_id),
            "edits": links(letter.edits.order_by("id").only(*LINK_COLUMNS)[:MAX_LINKED]),
            "identical_to": one(letter.identical_to_id),
            "identical_copies": links(
                DeadLetter.objects.filter(identical_to=letter).order_by("id").only(*LINK_COLUMNS)[:MAX_LINKED]
            ),
        }


router = SimpleRouter()
router.register("dead-letters", DeadLetterViewSet, basename="api-dead-letter")
urlpatterns: list[Any] = list(router.urls)
