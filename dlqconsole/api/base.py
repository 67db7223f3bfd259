"""What every API view shares: the token that made a change is named on its audit rows, and lists page with keyset
cursors (no offset, no count: the next page of a million rows costs what the first does)."""

from __future__ import annotations

import re
from contextlib import ExitStack
from typing import Any

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.services import acting_via
from dlqconsole.accounts.tokens import describe

# A cursor's position: the id of the row a page ends at (the ordering is by id), at most a bigint's 19 digits.
POSITION = re.compile(r"-?[0-9]{1,19}")


class NewestFirst(CursorPagination):
    """`?cursor=` from the previous page's `next`; `?limit=` rows a page (default 50, at most 500)."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        """`?limit=` as asked, up to 500; a limit that is no whole number from 1 up is refused, not read as 50."""
        asked = request.query_params.get(self.page_size_query_param)
        if asked is None:
            return self.page_size
        if not asked.isascii() or not asked.isdigit() or int(asked) < 1:
            raise ValidationError({"limit": [f"A whole number from 1 to {self.max_page_size}, not {asked[:20]!r}."]})
        return min(int(asked), self.max_page_size)

    def decode_cursor(self, request: Request) -> Cursor | None:
        """The cursor, or 404 for one the console did not make. A cursor is base64 that anyone can write: DRF checks
        its offset and direction but passes the position to the query as it is, where text that is no id (or one
        of thousands of digits) fails as a server error."""
        cursor = super().decode_cursor(request)
        if cursor is None:
            return None
        # Every cursor the console writes holds a position; one without (base64 of any text decodes to an empty
        # query) would read as the first page.
        if cursor.position is None or not POSITION.fullmatch(str(cursor.position)):
            raise NotFound(self.invalid_cursor_message)
        return cursor


# Audit rows written while a token's request runs name the token (`via`). The scope opens once the token is known
# and closes when the request ends, however it ends (an unexpected error included), so the next request served by
# the same thread never inherits it. (Comments, not docstrings, on the view bases: drf-spectacular takes the first
# docstring of a view's classes as its description in the schema.)
class AuditedMixin:
    _audit_scope: ExitStack | None = None

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        with ExitStack() as scope:
            self._audit_scope = scope
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if isinstance(request.auth, ApiToken) and self._audit_scope is not None:
            self._audit_scope.enter_context(acting_via(describe(request.auth)))


class StrictSerializer(serializers.Serializer):  # type: ignore[type-arg]
    """A request body whose fields are all known: a misspelt one (`"rat": "1/1s"`, `"stauts": ...`) is refused
    with the fields it takes, instead of the change going ahead without it."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and (unknown := sorted(set(data) - set(self.fields))):
            takes = ", ".join(self.fields) or "no fields"
            raise ValidationError({name[:64]: [f"Not a field of this request; it takes {takes}."] for name in unknown})
        return super().to_internal_value(data)


# An id no row has, put into a route once to find where ids go in its URL.
LINK_PLACEHOLDER = 987654321987654321


class Links(serializers.Serializer):  # type: ignore[type-arg]
    """Where an object is: `url` in the API and `page` in the console, both absolute, named alike on every
    resource. A subclass names the two routes (`api_route`, `page_route`). Each URL is the route's with the id put
    in: reversing a URL per row costs more than the rest of a list's row."""

    api_route = ""
    page_route = ""
    url = serializers.SerializerMethodField(help_text="This object in the API.")
    page = serializers.SerializerMethodField(help_text="Its page in the console.")

    def link(self, name: str, pk: int) -> str:
        """The absolute URL of route `name` for the id `pk`."""
        templates: dict[str, tuple[str, str]] = self.__dict__.setdefault("_link_templates", {})
        if name not in templates:
            path = reverse(name, args=[LINK_PLACEHOLDER])
            request = self.context.get("request")
            url = request.build_absolute_uri(path) if request is not None else path
            before, _, after = url.rpartition(str(LINK_PLACEHOLDER))
            templates[name] = (before, after)
        before, after = templates[name]
        return f"{before}{pk}{after}"

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, instance: Any) -> str:
        return self.link(self.api_route, instance.pk)

    @extend_schema_field(OpenApiTypes.URI)
    def get_page(self, instance: Any) -> str:
        return self.link(self.page_route, instance.pk)


# Paging parameters every list takes; `format` is DRF's, which answers 404 to any format but JSON.
PAGING_PARAMETERS = frozenset({"cursor", "limit", "format"})


def known_parameters(query: Any, allowed: frozenset[str]) -> None:
    """ValidationError naming the first query parameter that is none of `allowed`."""
    unknown = sorted(set(query) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "no parameters"
        raise ValidationError({unknown[0][:64]: [f"Not a parameter of this resource; it takes {takes}."]})


# A query parameter a view does not know is refused (400), so a misspelt filter never selects everything: each
# view names what each of its actions takes (`query_parameters`, by action; lists take the paging ones too). The
# check runs after authentication and the role check, so a stranger learns nothing from it.
class KnownParametersMixin:
    query_parameters: dict[str, frozenset[str]] = {}

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        action = getattr(self, "action", None) or (request.method or "").lower()
        allowed = self.query_parameters.get(action, frozenset())
        known_parameters(request.query_params, allowed | PAGING_PARAMETERS if action == "list" else allowed)


class ApiView(KnownParametersMixin, AuditedMixin, APIView):
    pass


class ApiViewSet(KnownParametersMixin, AuditedMixin, GenericViewSet):  # type: ignore[type-arg]
    pagination_class = NewestFirst
