from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User

from dlqconsole.accounts.models import AuditEntry

# PostgreSQL refuses a NUL in text and jsonb; a payload search may hold one (bodies are bytes). The audit row is
# for reading, so a NUL is written as the symbol for it.
NUL_SYMBOL = "\u2400"


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", NUL_SYMBOL)
    if isinstance(value, list | tuple):
        return [_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    return value


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
        target=_without_nul(target),
        filter=_without_nul(filter or {}),
        count=count,
        detail=_without_nul(detail),
    )
