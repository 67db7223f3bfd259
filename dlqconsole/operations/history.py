"""Reads of operations shared by the operations pages and the API: the history's filters (status, kind, broker), and
what happened to an operation's messages, each counted once (its figures).

A cancel counts the messages it left untouched among the operation's skipped; their items say "cancelled", so the
figures count them apart ("not attempted"). For a page of operations that count is one query for the whole page.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, Q

from dlqconsole.brokers.models import DEFAULT
from dlqconsole.operations.models import (
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    OperationQuerySet,
    OperationStatus,
)

# The status filter's value for every operation not yet over (planned, canary, running, paused).
UNFINISHED = "unfinished"


def filtered(operations: OperationQuerySet, *, status: str = "", kind: str = "", broker: str = "") -> OperationQuerySet:
    """The operations of the history's filters: a status (or "unfinished"), a kind, and a broker's name (those that
    touched it: its dead letters, or a move onto it). An empty value, or one naming no status or kind, filters
    nothing; the caller checks that a broker's name is one of the brokers."""
    if status == UNFINISHED:
        operations = operations.unfinished()
    elif status in OperationStatus.values:
        operations = operations.filter(status=status)
    if kind in OperationKind.values:
        operations = operations.filter(kind=kind)
    if broker:
        touched = Q(breakdown__brokers__has_key=broker) | Q(target_broker__name=broker)
        if broker == DEFAULT:
            # Operations planned before brokers existed name none, and were all on default.
            touched |= ~Q(breakdown__has_key="brokers")
        operations = operations.filter(touched)
    return operations


@dataclass(frozen=True)
class Figures:
    """What happened to an operation's messages, each counted once; they add up to its total."""

    done: int
    failed: int
    skipped: int
    # Skipped by a cancel before anything was done to them.
    not_attempted: int
    in_flight: int
    # Still to be taken (0 once the operation is over).
    waiting: int


def not_attempted_counts(operations: Iterable[Operation]) -> dict[int, int]:
    """The messages a cancel left untouched, per cancelled operation among `operations` (one query). An operation
    whose items retention removed (or is removing) says it from its summary."""
    candidates = [operation for operation in operations if _may_have_untouched(operation)]
    counts = {
        operation.pk: int(operation.items_summary.get("not_attempted", 0))
        for operation in candidates
        if operation.items_summary is not None
    }
    ids = [operation.pk for operation in candidates if operation.pk not in counts]
    if not ids:
        return counts
    rows = (
        OperationItem.objects.filter(operation_id__in=ids, status=ItemStatus.SKIPPED, error__startswith="cancelled")
        .values("operation_id")
        .annotate(n=Count("pk"))
    )
    return counts | {row["operation_id"]: row["n"] for row in rows}


def figures(operation: Operation, *, not_attempted: int | None = None) -> Figures:
    """The operation's figures; `not_attempted` when already counted (not_attempted_counts), else counted here."""
    if not_attempted is None:
        not_attempted = not_attempted_counts([operation]).get(operation.pk, 0)
    return Figures(
        done=operation.succeeded,
        failed=operation.failed,
        skipped=max(0, operation.skipped - not_attempted),
        not_attempted=not_attempted,
        in_flight=operation.in_flight,
        waiting=max(0, operation.remaining - operation.in_flight) if not operation.is_finished else 0,
    )


def _may_have_untouched(operation: Operation) -> bool:
    return operation.status == OperationStatus.CANCELLED and operation.skipped > 0
