"""Roles on the server, as on the pages: reading needs the viewer role, a change the view's `change_role`
(operator unless the view says otherwise; a view may name a role per action in `change_roles`). The check runs
before the object is looked up, so a viewer's token gets 403 on every change, whatever it names. Services check
again where the role depends on what is asked (a purge needs the admin role). A read-only token changes nothing."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from dlqconsole.accounts.roles import OPERATOR, VIEWER, has_role


def required_role(request: Request, view: Any) -> str:
    if request.method in SAFE_METHODS:
        return VIEWER
    per_action: dict[str, str] = getattr(view, "change_roles", {})
    return per_action.get(getattr(view, "action", None) or "", getattr(view, "change_role", OPERATOR))


class RolePermission(BasePermission):
    message = "This needs a role."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False  # DRF answers 401 with the authentication scheme
        role = required_role(request, view)
        if role != VIEWER and getattr(request.auth, "read_only", False):
            self.message = "This API token is read-only."
            return False
        if has_role(request.user, role):
            return True
        self.message = f"This needs the {role} role."
        return False
