from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.roles import role_of
from dlqconsole.api.base import ApiView


class ApiRoot(ApiView):
    """Where the resources are, and who is asking with which role."""

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        base = request.build_absolute_uri("/api/v1/")
        return Response(
            {
                "user": request.user.get_username(),
                "role": role_of(request.user),
                # What the request authenticated with: a script can learn its token is read-only or expiring
                # before a change is refused. Null for the session of the docs page.
                "token": _token(request.auth),
                "schema": f"{base}openapi.json",
                "docs": f"{base}docs/",
                "resources": {
                    name: f"{base}{name}/"
                    for name in ("queues", "dead-letters", "patterns", "operations", "alerts", "audit")
                },
            }
        )


def _token(token: object) -> dict[str, object] | None:
    if not isinstance(token, ApiToken):
        return None
    return {
        "name": token.name,
        "prefix": f"dlq_{token.prefix}",
        "read_only": token.read_only,
        "expires_at": token.expires_at.isoformat() if token.expires_at else None,
    }
