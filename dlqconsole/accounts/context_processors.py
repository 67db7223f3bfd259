from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest

from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role


def roles(request: HttpRequest) -> dict[str, bool]:
    """Lets templates hide controls a user may not use (the server checks again on every POST)."""
    # A request refused before the authentication middleware ran (a bad Host header) has no user: its error page
    # renders as for someone signed out.
    user = getattr(request, "user", None) or AnonymousUser()
    return {"is_operator": has_role(user, OPERATOR), "is_admin": has_role(user, ADMIN)}
