"""What every API view shares: the token that made a change is named on its audit rows, and lists page with keyset
cursors (no offset, no count: the next page of a million rows costs what the first does)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.services import acting_via
from dlqconsole.accounts.tokens import describe


class NewestFirst(CursorPagination):
    """`?cursor=` from the previous page's `next`; `?limit=` rows a page (default 50, at most 500)."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class AuditedMixin:
    """Audit rows written while a token's request runs name the token (`via`)."""

    _audit_scope: ExitStack | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if isinstance(request.auth, ApiToken):
            self._audit_scope = ExitStack()
            self._audit_scope.enter_context(acting_via(describe(request.auth)))

    def finalize_response(self, request: Request, response: Response, *args: Any, **kwargs: Any) -> Response:
        if self._audit_scope is not None:
            self._audit_scope.close()
            self._audit_scope = None
        return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]


class ApiView(AuditedMixin, APIView):
    pass


class ApiViewSet(AuditedMixin, GenericViewSet):  # type: ignore[type-arg]
    pagination_class = NewestFirst
