from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User

from dlqconsole.accounts.models import AuditEntry


def record_audit(
    *,
    actor: AbstractBaseUser | AnonymousUser | None,
    action: str,
    target: str = "",
    filter: dict[str, Any] | None = None,  # noqa: A002  (the audit log's own vocabulary)
    count: int | None = None,
    detail: str = "",
) -> AuditEntry:
    user = actor if isinstance(actor, User) else None
    return AuditEntry.objects.create(
        actor=user,
        actor_name=user.get_username() if user is not None else "system",
        action=action,
        target=target,
        filter=filter or {},
        count=count,
        detail=detail,
    )
