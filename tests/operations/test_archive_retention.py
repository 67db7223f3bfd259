"""Archive retention deletes in batches, each with its own audit row written in the batch's transaction: a run that
dies midway leaves a record of every deletion it committed, and none of a batch that rolled back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.models import OperationKind
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import run_operation, start_operation
from dlqconsole.operations.upkeep import delete_expired_archives
from tests.factories import synthetic_dead_letters

pytestmark = [pytest.mark.django_db]

NOW = dt.datetime(2031, 3, 10, 12, 0, tzinfo=dt.UTC)


def archive(ids: list[int], *, days_ago: int, actor: User) -> None:
    """Archive through an operation (rows and counters as production keeps them), then date the archiving."""
    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={"ids": ids}, actor=actor)
    start_operation(operation=operation, actor=actor)
    run_operation(operation_id=operation.pk)
    DeadLetter.objects.filter(pk__in=ids).update(status_changed_at=NOW - dt.timedelta(days=days_ago))
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {DeadLetterStatus.ARCHIVED}


def retention_rows() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action="archive.retention").order_by("pk"))


@pytest.mark.sqlite
def test_a_run_over_three_batches_writes_a_row_per_batch_with_its_count_and_queues(settings, operator: User) -> None:
    settings.DLQ_ARCHIVE_RETENTION_DAYS = 7
    orders = synthetic_dead_letters(queue="orders", count=4)
    payments = synthetic_dead_letters(queue="payments", count=3)
    kept = synthetic_dead_letters(queue="orders", count=1, start=10)
    archive(orders + payments, days_ago=8, actor=operator)
    archive(kept, days_ago=6, actor=operator)

    deleted = delete_expired_archives(now=NOW, batch_size=3)

    rows = retention_rows()
    assert deleted == 7
    assert [row.count for row in rows] == [3, 3, 1]
    assert sum(row.count or 0 for row in rows) == 7
    # Batches are taken in id order: the orders queue's four, then the payments queue's three.
    assert [row.filter["queue"] for row in rows] == [["orders.dlq"], ["orders.dlq", "payments.dlq"], ["payments.dlq"]]
    cutoff = (NOW - dt.timedelta(days=7)).isoformat()
    assert all(row.filter["status_changed_before"] == cutoff and row.filter["status"] == ["archived"] for row in rows)
    assert list(DeadLetter.objects.values_list("pk", flat=True)) == kept


def test_a_batch_that_rolls_back_leaves_no_row_and_the_committed_ones_keep_theirs(
    settings, refuse_deleting: Callable[[int], None], operator: User
) -> None:
    settings.DLQ_ARCHIVE_RETENTION_DAYS = 7
    ids = synthetic_dead_letters(queue="orders", count=7)
    archive(ids, days_ago=8, actor=operator)
    refuse_deleting(ids[4])

    with pytest.raises(DatabaseError, match="refused"):
        delete_expired_archives(now=NOW, batch_size=3)

    rows = retention_rows()
    left = set(DeadLetter.objects.values_list("pk", flat=True))
    assert [row.count for row in rows] == [3]  # the first batch committed; the second rolled back
    assert left == set(ids[3:])
    assert len(ids) - len(left) == sum(row.count or 0 for row in rows)
