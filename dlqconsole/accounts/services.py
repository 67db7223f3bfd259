from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, User
from django.db import transaction
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import ROLES

# PostgreSQL refuses a NUL in text and jsonb; a payload search may hold one (bodies are bytes). The audit row is
# for reading, so a NUL is written as the symbol for it.
NUL_SYMBOL = "\u2400"

# How the changes of the current request come, for their audit rows ("API token deploy-bot (dlq_3f9a0c1e)"); set
# by the API around each request, empty for the pages, the CLI and the workers.
_via: ContextVar[str] = ContextVar("dlq_audit_via", default="")


@contextmanager
def acting_via(description: str) -> Iterator[None]:
    """Every audit row written inside names `description` as the way the change came."""
    reset = _via.set(description[:128])
    try:
        yield
    finally:
        _via.reset(reset)


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
    now: dt.datetime | None = None,
) -> AuditEntry:
    user = actor if isinstance(actor, User) else None
    return AuditEntry.objects.create(
        created_at=now or timezone.now(),
        actor=user,
        actor_name=user.get_username() if user is not None else "system",
        action=action,
        target=_without_nul(target),
        filter=_without_nul(filter or {}),
        count=count,
        detail=_without_nul(detail),
        via=_via.get(),
    )


def set_role(*, user: User, role: str) -> None:
    """Make `role` the user's one role group; groups that are no role stay. The caller writes the audit row (the
    admin's user form does, naming the new role)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    with transaction.atomic():
        user.groups.remove(*Group.objects.filter(name__in=ROLES).exclude(name=role))
        user.groups.add(Group.objects.get_or_create(name=role)[0])


def delete_expired_audit_entries(*, now: dt.datetime | None = None, batch_size: int = 1000) -> int:
    """Delete audit rows created more than DLQ_AUDIT_RETENTION_DAYS ago, oldest first, a batch per transaction;
    each batch writes its own row (how many went, up to when) in that transaction, so a run cut short leaves a
    record of every batch it committed. What other apps keep for an audit row (a purge's list of the dead letters
    it deleted) goes with it. Returns how many rows went."""
    now = now or timezone.now()
    days = settings.DLQ_AUDIT_RETENTION_DAYS
    cutoff = now - dt.timedelta(days=days)
    until = f"{cutoff.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"
    expired = AuditEntry.objects.filter(created_at__lt=cutoff).order_by("created_at", "pk")
    deleted = 0
    while ids := list(expired.values_list("pk", flat=True)[:batch_size]):
        _delete_dependents(ids, batch_size=batch_size)
        with transaction.atomic():
            # Dependents written since (none in practice) go with their row here, through the foreign key's cascade.
            AuditEntry.objects.filter(pk__in=ids).delete()
            record_audit(
                actor=None,
                action="audit.retention",
                target="audit",
                filter={"until": cutoff.isoformat()},
                count=len(ids),
                detail=f"deleted audit rows older than {days} days (created before {until})",
                now=now,
            )
        deleted += len(ids)
    return deleted


def _delete_dependents(ids: list[int], *, batch_size: int) -> None:
    """Delete the rows that point to these audit rows, a batch per statement and transaction, so that a purge of
    millions of dead letters is not one statement of millions. They are found through their foreign keys to
    AuditEntry, so this app need not know the apps above it."""
    for relation in AuditEntry._meta.related_objects:
        dependents = relation.related_model._default_manager.filter(**{f"{relation.field.name}__in": ids})
        while chunk := list(dependents.order_by("pk").values_list("pk", flat=True)[:batch_size]):
            relation.related_model._default_manager.filter(pk__in=chunk).delete()
