"""Errors as JSON: `{"detail": "...", "code": "..."}`, and for bad fields `{"detail": ..., "errors": {field: [..]}}`.

The services' own refusals (a bad filter, an operation that cannot pause, a pattern that cannot merge) are 400
with their message; Django's PermissionDenied is 403 with the role it needs. What Django refuses while a view reads
the request (a body over DATA_UPLOAD_MAX_MEMORY_SIZE, more than DATA_UPLOAD_MAX_NUMBER_FIELDS parameters) is 400
here rather than Django's error page, still logged as Django logs it. URLs under /api/ that match nothing and
unexpected failures are JSON too (`not_found`, `server_error`, used by the top-level handlers)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from dlqconsole.accounts.tokens import TokenError
from dlqconsole.alerts.errors import AlertError
from dlqconsole.deadletters.filters import FilterError
from dlqconsole.deadletters.services import PatternError
from dlqconsole.operations.services import OperationError

REFUSALS: tuple[type[Exception], ...] = (FilterError, PatternError, OperationError, TokenError, AlertError)


class RequestRefused(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "bad_request"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, REFUSALS):
        exc = exceptions.ValidationError({"detail": str(exc)}, code="refused")
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError({"detail": " ".join(exc.messages)}, code="invalid")
    elif isinstance(exc, SuspiciousOperation):
        exc = _refused_request(exc, context)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a 500: server_error answers it
    response.data = _shaped(response.data, exc)
    return response


def _refused_request(exc: SuspiciousOperation, context: dict[str, Any]) -> RequestRefused:
    """Django's refusal of the request as a JSON 400, logged to django.security.<its name> as Django's own handler
    logs it (without the traceback: the log's filter keeps tracebacks for 5xx)."""
    request = context.get("request")
    logging.getLogger(f"django.security.{type(exc).__name__}").error(
        str(exc), extra={"status_code": 400, "request": getattr(request, "_request", request)}
    )
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return RequestRefused(f"The body is larger than {limit:,} bytes; nothing was read.", code="too_large")
    return RequestRefused(f"The request was refused: {exc}", code="bad_request")


def _shaped(data: Any, exc: Exception) -> dict[str, Any]:
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        if isinstance(data, dict) and set(data) == {"detail"}:
            detail = data["detail"]
            return {"detail": detail[0] if isinstance(detail, list) else str(detail), "code": "refused"}
        first = _first_message(data)
        return {"detail": first, "code": "invalid", "errors": data}
    if isinstance(data, dict) and "detail" in data:
        return {"detail": str(data["detail"]), "code": getattr(data["detail"], "code", code)}
    return {"detail": _first_message(data), "code": code}


def _first_message(data: Any) -> str:
    if isinstance(data, dict):
        for name, value in data.items():
            message = _first_message(value)
            if name in ("detail", "non_field_errors") or message.startswith(f"{name}:"):
                return message
            return f"{name}: {message}"
        return "Invalid input."
    if isinstance(data, list):
        return _first_message(data[0]) if data else "Invalid input."
    return str(data)


def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        {"detail": f"No API resource at {request.path}; see /api/v1/docs/.", "code": "not_found"},
        status=status.HTTP_404_NOT_FOUND,
    )


def server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        {"detail": "The server failed to answer; the error is in its log.", "code": "server_error"},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        {"detail": "The request was refused as malformed; nothing was done.", "code": "bad_request"},
        status=status.HTTP_400_BAD_REQUEST,
    )
