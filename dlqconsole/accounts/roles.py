"""Roles: viewer (read), operator (recover messages), admin (destructive and configuration changes).

A role is a Django group; superusers hold every role. Roles are cumulative: an admin is also an operator.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
_RANK = {VIEWER: 0, OPERATOR: 1, ADMIN: 2}


def role_of(user: AbstractBaseUser | AnonymousUser) -> str | None:
    if not user.is_authenticated or not user.is_active:
        return None
    if getattr(user, "is_superuser", False):
        return ADMIN
    cached = getattr(user, "_dlq_role", "")
    if cached != "":
        return cached
    role = role_group(user.groups.values_list("name", flat=True)) or VIEWER  # type: ignore[attr-defined]
    user._dlq_role = role  # type: ignore[union-attr,attr-defined]
    return role


def role_group(group_names: Iterable[str]) -> str | None:
    """The highest role among these group names; None when none is a role (such a user reads as a viewer)."""
    names = set(group_names)
    return next((name for name in reversed(ROLES) if name in names), None)


def has_role(user: AbstractBaseUser | AnonymousUser, role: str) -> bool:
    current = role_of(user)
    return current is not None and _RANK[current] >= _RANK[role]


def require_role(user: AbstractBaseUser | AnonymousUser, role: str) -> None:
    """Raise PermissionDenied (a 403) unless the user holds the role."""
    if not has_role(user, role):
        raise PermissionDenied(f"This needs the {role} role.")
