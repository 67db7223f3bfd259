"""The error answers the schema names beside each 200, in the one shape errors.py gives every error."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ProblemSerializer(serializers.Serializer):  # type: ignore[type-arg]
    detail = serializers.CharField(help_text="What went wrong, in words fit to show.")
    code = serializers.CharField(
        help_text='"refused" (the console said no), "invalid" (a field), "not_found", "permission_denied", '
        '"not_authenticated", "authentication_failed", "throttled", "too_large", "bad_request"...'
    )
    errors = serializers.DictField(required=False, help_text="Per field, for code invalid.")


def problem(text: str) -> OpenApiResponse:
    return OpenApiResponse(ProblemSerializer, description=text)


def not_found(what: str) -> OpenApiResponse:
    return problem(f"No such {what}.")


REFUSED = problem("A value it cannot use, or a change it cannot make; `detail` says why.")
FORBIDDEN = problem("The role this needs is not yours, or the token is read-only; `detail` names the role.")
