"""The operations tasks take their arguments from whoever can publish to the console's Celery vhost: hostile ones
are refused with one logged line, and no operation, dead letter or archive changes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from pytest_django import Settings

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import start_operation
from dlqconsole.operations.tasks import (
    delete_expired_archives,
    run_operation_task,
    schedule_new_dead_letters,
    start_due_retries,
    sweep_operations,
)
from tests.factories import synthetic_dead_letters
from tests.support import NESTED, refusals

pytestmark = [pytest.mark.django_db]


def test_hostile_operation_ids_are_refused_and_change_nothing(operator: User, caplog: pytest.LogCaptureFixture) -> None:
    ids = synthetic_dead_letters(queue="orders", count=3)
    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={}, actor=operator)
    # Started, but its task is not sent: the test's transaction never commits.
    start_operation(operation=operation, actor=operator)
    operation.refresh_from_db()
    before = (operation.status, operation.succeeded, operation.runner)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((hostile,), {})
        for hostile in [
            "1; DROP",
            str(operation.pk),
            -1,
            0,
            2**70,
            2**63,
            True,
            None,
            float(operation.pk),
            NESTED,
            [operation.pk],
            operation.pk + 1000,  # no such operation
        ]
    ]
    calls += [
        ((), {"operation_id": operation.pk, "kind": "purge"}),
        ((operation.pk, operation.pk), {}),
        ((), {}),
    ]

    for args, kwargs in calls:
        assert run_operation_task(*args, **kwargs) is None

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.runner) == before
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"parked"}
    found = refusals(caplog, "operations.run_operation")
    assert len(found) == len(calls)
    assert f"operation_id: no Operation {operation.pk + 1000}" in " ".join(found)

    run_operation_task(operation.pk)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.DONE
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"archived"}


def test_the_archive_retention_task_takes_no_arguments(
    operator: User,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.DLQ_ARCHIVE_RETENTION_DAYS = 7
    ids = synthetic_dead_letters(queue="orders", count=2)
    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={}, actor=operator)
    start_operation(operation=operation, actor=operator)
    run_operation_task(operation.pk)
    DeadLetter.objects.filter(pk__in=ids).update(status_changed_at=timezone.now() - dt.timedelta(days=30))

    assert delete_expired_archives(1000) is None
    assert delete_expired_archives(now="2999-01-01") is None

    assert DeadLetter.objects.filter(pk__in=ids).count() == 2
    assert len(refusals(caplog, "operations.delete_expired_archives")) == 2
    delete_expired_archives()
    assert not DeadLetter.objects.filter(pk__in=ids).exists()


@pytest.mark.parametrize("task", [sweep_operations, schedule_new_dead_letters, start_due_retries])
@pytest.mark.parametrize(("args", "kwargs"), [(("x",), {}), ((), {"now": "2999-01-01"}), ((NESTED,), {})])
def test_the_beat_tasks_take_no_arguments(
    task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    assert task(*args, **kwargs) is None

    assert len(refusals(caplog, task.name)) == 1
    assert Operation.objects.count() == 0
