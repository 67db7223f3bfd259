"""The API's operations resource: list and read operations, plan one from a dead-letter filter, then start, pause,
resume, cancel it or change its rate, through the services the pages and the `dlq` command use.

Reading needs the viewer role, every change the operator role; a purge's plan and start need the admin role, which
the services check (403). A plan is made and answered, never started: the start is its own request, and a purge's
start must send the number of messages the plan holds (`confirm_count`), as its page asks for it typed in. Every
audit row the services write names the token.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from dlqconsole.api.base import ApiViewSet, StrictSerializer
from dlqconsole.api.operation_serializers import (
    STALE_MINUTES,
    OperationListQuerySerializer,
    OperationPauseSerializer,
    OperationPlanSerializer,
    OperationRateSerializer,
    OperationSerializer,
    OperationStartSerializer,
)
from dlqconsole.api.problems import REFUSED, not_found, problem
from dlqconsole.operations import history, planning, services
from dlqconsole.operations.canary import refresh_came_back
from dlqconsole.operations.models import PUBLISHING_KINDS, Operation
from dlqconsole.operations.services import OperationError

FORBIDDEN = problem("The role is missing: viewers change nothing, and a purge needs the admin role.")
NOT_FOUND = not_found("operation")


# The operation services speak of the page's controls ("tick the box", "type 15"); the API's fields are named instead.
PAGE_WORDS = (
    (re.compile(r"Tick the box to start it anyway"), 'Send "stale_confirmed": true to start it anyway'),
    (re.compile(r"type (\d+) \(the number of messages\)"), r'send "confirm_count": \1 (the number of messages)'),
    (re.compile(r"you typed (.*), but (.*)\. Type (\d+) to confirm\."), r"confirm_count was \1, but \2. Send \3."),
)


def in_api_words(message: str, *, total: int) -> str:
    for page, api in PAGE_WORDS:
        message = page.sub(api, message)
    return message


def _control(summary: str, operation_id: str, request: Any = None, description: str = "") -> Any:
    return extend_schema(
        summary=summary,
        description=description,
        operation_id=operation_id,
        request=request,
        responses={200: OperationSerializer, 400: REFUSED, 403: FORBIDDEN, 404: NOT_FOUND},
    )


@extend_schema_view(
    list=extend_schema(
        summary="List operations, newest first",
        description="Filtered as the operations page filters them; pages by cursor (`next`, `previous`).",
        operation_id="operations_list",
        parameters=[OperationListQuerySerializer],
        responses={200: OperationSerializer(many=True), 400: REFUSED},
    ),
    retrieve=extend_schema(
        summary="An operation: plan, breakdown, warnings, progress and time left",
        description="Poll it while the operation runs: `progress.settled` turns true when its numbers are final.",
        operation_id="operations_retrieve",
        responses={200: OperationSerializer, 404: NOT_FOUND},
    ),
)
class OperationViewSet(ApiViewSet):
    """Bulk recovery operations: each over a frozen set of dead letters, planned, then started, run by workers at
    its rate, and steered while it runs. Every change is in the audit log, naming the token."""

    queryset = Operation.objects.select_related("created_by", "target_broker")
    serializer_class = OperationSerializer
    query_parameters = {"list": frozenset(OperationListQuerySerializer().fields)}

    def list(self, request: Request) -> Response:
        query = OperationListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        operations = history.filtered(self.get_queryset(), **query.validated_data)
        page = self.paginate_queryset(operations) or []
        context = {**self.get_serializer_context(), "not_attempted": history.not_attempted_counts(page)}
        return self.get_paginated_response(OperationSerializer(page, many=True, context=context).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        operation = self.get_object()
        # What came back after no worker runs it any more (a paused canary's other messages, say) is counted here.
        refresh_came_back(operation=operation, on_read=True)
        return self._answer(operation)

    @extend_schema(
        summary="Plan an operation (not started)",
        description="Freezes the dead letters the filter matches now and describes them: count, breakdown by "
        "broker, queue, pattern and destination, what cannot be replayed and why, and the warnings its page shows "
        "before Start. Nothing runs until it is started.",
        operation_id="operations_plan",
        request=OperationPlanSerializer,
        # The docs page's "Try it out" starts from this body, not from every filter field filled with "string".
        examples=[
            OpenApiExample(
                "Retry a pattern at 50 a second",
                value={"kind": "retry", "filter": {"pattern": [12], "queue": ["orders.dlq"]}, "rate": "50/1s"},
                request_only=True,
            ),
            OpenApiExample(
                "Move one request's dead letters to another queue",
                value={"kind": "move", "filter": {"correlation_id": ["9f1c2e"]}, "target_queue": "orders.repair"},
                request_only=True,
            ),
        ],
        responses={201: OperationSerializer, 400: REFUSED, 403: FORBIDDEN},
    )
    def create(self, request: Request) -> Response:
        asked = OperationPlanSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        values = asked.validated_data
        kind = values["kind"]
        services.check_role(request.user, kind)
        chosen = {name: value for name, value in values["filter"].items() if value not in ("", [])}
        if not chosen:
            raise OperationError("An operation needs a filter; an empty one would touch every dead letter.")
        default_rate = settings.DLQ_DEFAULT_REPLAY_RATE if kind in PUBLISHING_KINDS else ""
        operation = planning.plan_operation(
            kind=kind,
            filter=chosen,
            actor=request.user,
            limit=values.get("limit"),
            rate=values.get("rate", default_rate),
            canary_size=values["canary"],
            canary_wait_seconds=values.get("canary_wait"),
            target_queue=values["target_queue"],
            target_exchange=values["target_exchange"],
            target_routing_key=values["routing_key"],
            target_broker=values["target_broker"],
        )
        return self._answer(operation, status.HTTP_201_CREATED)

    @_control(
        "Start a planned operation",
        "operations_start",
        OperationStartSerializer,
        description="A purge starts only with `confirm_count`, the number of messages its plan holds; a plan none "
        "of whose messages can be replayed, an empty plan, and a plan older than "
        f"{STALE_MINUTES} minutes without `stale_confirmed` are refused.",
    )
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str) -> Response:
        operation = self.get_object()
        asked = OperationStartSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        count = asked.validated_data.get("confirm_count")
        purge = operation.kind in services.TYPED_KINDS
        if not purge and count is not None and count != operation.total:
            services.check_role(request.user, operation.kind)
            raise OperationError(
                f"Nothing was started: confirm_count is {count}, but this plan holds {operation.total:,} messages."
            )
        try:
            operation = services.start_operation(
                operation=operation,
                actor=request.user,
                typed_count=("" if count is None else str(count)) if purge else None,
                require_replayable=True,
                stale_confirmed=asked.validated_data["stale_confirmed"],
            )
        except OperationError as problem:
            raise OperationError(in_api_words(str(problem), total=operation.total)) from None
        return self._answer(operation)

    @_control(
        "Pause a running operation",
        "operations_pause",
        OperationPauseSerializer,
        description="The worker stops after the messages in flight; `reason` is shown with the pause.",
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        operation = self.get_object()
        asked = OperationPauseSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        reason = asked.validated_data["reason"]
        return self._answer(services.pause_operation(operation=operation, actor=request.user, reason=reason))

    @_control(
        "Resume a paused operation",
        "operations_resume",
        description="A canary not yet judged goes on where it stopped; the share of returns that pauses the "
        "operation is measured afresh.",
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        operation = self.get_object()
        StrictSerializer(data=request.data or {}).is_valid(raise_exception=True)
        return self._answer(services.resume_operation(operation=operation, actor=request.user))

    @_control(
        "Cancel an operation, or discard a plan",
        "operations_cancel",
        description="What was done stays done; the rest is skipped and its dead letters stay as they are.",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        operation = self.get_object()
        StrictSerializer(data=request.data or {}).is_valid(raise_exception=True)
        return self._answer(services.cancel_operation(operation=operation, actor=request.user))

    @_control(
        "Change the rate of an unfinished retry or move",
        "operations_rate",
        OperationRateSerializer,
        description="A running worker applies it within a couple of seconds.",
    )
    @action(detail=True, methods=["post"])
    def rate(self, request: Request, pk: str) -> Response:
        operation = self.get_object()
        asked = OperationRateSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        rate = asked.validated_data["rate"]
        return self._answer(services.change_rate(operation=operation, rate=rate, actor=request.user))

    def get_object(self) -> Operation:
        """The operation, once the caller's role may steer its kind (a purge needs the admin role): a refusal of the
        role comes before any complaint about the body."""
        operation: Operation = super().get_object()
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            services.check_role(self.request.user, operation.kind)
        return operation

    def _answer(self, operation: Operation, code: int = status.HTTP_200_OK) -> Response:
        """The operation as it is now (a service's change included), read afresh with its broker and planner."""
        fresh = self.get_queryset().get(pk=operation.pk)
        return Response(OperationSerializer(fresh, context=self.get_serializer_context()).data, status=code)


router = SimpleRouter()
router.register("operations", OperationViewSet, basename="api-operations")
urlpatterns: list[Any] = list(router.urls)
