from __future__ import annotations

from django.http import HttpRequest

from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role


def roles(request: HttpRequest) -> dict[str, bool]:
    """Lets templates hide controls a user may not use (the server checks again on every POST)."""
    user = request.user
    return {"is_operator": has_role(user, OPERATOR), "is_admin": has_role(user, ADMIN)}
