"""The API's audit resources (urlpatterns, included by api/urls.py): the audit log, newest first, with the audit
page's filter (accounts/audit_filters.py: the same parameters select the same rows) and its rule that only admins
read the sign-in rows."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from dlqconsole.accounts.audit_filters import filter_entries, visible_entries
from dlqconsole.accounts.models import AuditEntry
from dlqconsole.api.base import ApiViewSet


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.SerializerMethodField(help_text='Who did it: a user name, or "system".')
    filter = serializers.JSONField(read_only=True, help_text="The filter the action acted on, as it was given.")

    class Meta:
        model = AuditEntry
        fields = ["id", "created_at", "actor", "action", "target", "filter", "count", "detail", "via"]
        read_only_fields = fields
        extra_kwargs = {
            "target": {"help_text": 'What the action was about: "operation:12", "pattern #3", "alert:7".'},
            "count": {"help_text": "How many messages (or alerts) it acted on, where that applies."},
            "via": {
                "help_text": 'How the change came, when not through the pages or the CLI: "API token ci (dlq_...)".'
            },
        }

    @extend_schema_field(OpenApiTypes.STR)
    def get_actor(self, entry: AuditEntry) -> str:
        if entry.actor_name:
            return entry.actor_name
        return entry.actor.get_username() if entry.actor is not None else "system"


class AuditFilterSerializer(serializers.Serializer):
    """The audit page's filter, parameter for parameter (every one optional; together they narrow)."""

    actor = serializers.CharField(required=False, help_text="A user name, exactly (any case).")
    action = serializers.CharField(required=False, help_text="Any part of the action: `operation.retry`, `alert`.")
    target = serializers.CharField(
        required=False,
        help_text='"pattern:3", "pattern #3" and "pattern 3" find both spellings (a pattern also finds the rows of '
        "the operations whose filter named it); other text is searched for in the target.",
    )
    since = serializers.CharField(required=False, help_text="From this ISO date or moment, or an age: 30m, 2h, 7d.")
    until = serializers.CharField(required=False, help_text="Up to this ISO date or moment, or an age.")


class AuditViewSet(ApiViewSet):
    """The audit log: every role reads it; only admins see the sign-in rows (`accounts.login*`)."""

    serializer_class = AuditEntrySerializer
    query_parameters = {"list": frozenset({"actor", "action", "target", "since", "until"})}

    @extend_schema(
        operation_id="audit_list",
        summary="List audit entries",
        description="Who did what, when, with which filter, on how many messages; newest first. The sign-in rows "
        "(`accounts.login*`) are listed to admins only.",
        parameters=[AuditFilterSerializer],
        tags=["audit"],
    )
    def list(self, request: Request) -> Response:
        entries, problems = filter_entries(request.query_params, visible_entries(request.user))
        if problems:
            raise exceptions.ValidationError({name: [problem] for name, problem in problems.items()})
        page = self.paginate_queryset(entries)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)


router = SimpleRouter()
router.register("audit", AuditViewSet, basename="api-audit")
urlpatterns: list[Any] = router.urls
