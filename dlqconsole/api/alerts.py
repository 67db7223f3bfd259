"""The API's alerts resources (urlpatterns, included by api/urls.py): the alerts, newest first, narrowed as the
alerts page narrows them; one alert; and the two changes the page's operators make, acknowledge and silence, through
the same services (alerts/changes.py), each answering with the alert as it is afterwards."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from dlqconsole.alerts import changes
from dlqconsole.alerts.models import Alert, AlertQuerySet
from dlqconsole.api.alerts_serializers import AlertFilterSerializer, AlertSerializer, SilenceSerializer
from dlqconsole.api.base import ApiViewSet, StrictSerializer
from dlqconsole.api.problems import REFUSED, not_found

NOT_FOUND = not_found("alert")


class AlertViewSet(ApiViewSet):
    """Alerts: every role reads them; acknowledging and silencing needs the operator role, as on the pages."""

    serializer_class = AlertSerializer
    query_parameters = {"list": frozenset(AlertFilterSerializer().fields)}

    def get_queryset(self) -> AlertQuerySet:
        return Alert.objects.select_related("rule__broker", "acknowledged_by")

    @extend_schema(
        operation_id="alerts_list",
        summary="List alerts",
        description="Newest first. Without `state`, every alert (the page's current alerts and its history).",
        parameters=[AlertFilterSerializer],
        tags=["alerts"],
    )
    def list(self, request: Request) -> Response:
        chosen = AlertFilterSerializer(data=request.query_params)
        chosen.is_valid(raise_exception=True)
        page = self.paginate_queryset(chosen.narrow(self.get_queryset()))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        operation_id="alerts_get",
        summary="One alert",
        responses={200: AlertSerializer, 404: NOT_FOUND},
        tags=["alerts"],
    )
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(
        operation_id="alerts_acknowledge",
        summary="Acknowledge an alert",
        description="Someone is on it: no more reminders. Only a firing alert can be acknowledged; it still resolves "
        "(with a notice) when the condition clears. Needs the operator role.",
        request=None,
        responses={200: AlertSerializer, 400: REFUSED, 404: NOT_FOUND},
        tags=["alerts"],
    )
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str) -> Response:
        StrictSerializer(data=request.data or {}).is_valid(raise_exception=True)
        alert = self.get_object()
        changes.acknowledge_alert(alert=alert, actor=request.user)
        return self._answer(alert)

    @extend_schema(
        operation_id="alerts_silence",
        summary="Silence an alert",
        description='Send nothing about the alert for a while: `{"for": "2h"}` or `{"until": "2026-11-26T18:00Z"}`; '
        '`{"for": "0"}` lifts the silence. A silenced alert still fires and shows. A resolved alert cannot be '
        "silenced. Needs the operator role.",
        request=SilenceSerializer,
        responses={200: AlertSerializer, 400: REFUSED, 404: NOT_FOUND},
        tags=["alerts"],
    )
    @action(detail=True, methods=["post"])
    def silence(self, request: Request, pk: str) -> Response:
        alert = self.get_object()
        asked = SilenceSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        changes.silence_alert(alert=alert, actor=request.user, until=asked.validated_data["until"])
        return self._answer(alert)

    def _answer(self, alert: Alert) -> Response:
        """The alert as it is after the change, read afresh."""
        return Response(self.get_serializer(self.get_queryset().get(pk=alert.pk)).data)


router = SimpleRouter()
router.register("alerts", AlertViewSet, basename="api-alert")
urlpatterns: list[Any] = router.urls
