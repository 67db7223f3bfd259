"""Retention deletes dead letters replayed or moved more than DLQ_FINISHED_RETENTION_DAYS ago and archived more than
DLQ_ARCHIVE_RETENTION_DAYS ago, a batch per transaction with its audit row; the per-status counters drop exactly what
went, the arrival counts stay; operations finished long ago lose their item rows and keep their summary."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import DatabaseError

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import (
    ArrivalCount,
    DeadLetter,
    DeadLetterStatus,
    FailurePattern,
    PatternArrivalCount,
)
from dlqconsole.operations import history
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.retention import Pacing, RetentionRun, apply_retention
from dlqconsole.operations.services import cancel_operation, run_operation, start_operation
from dlqconsole.operations.tasks import apply_retention as apply_retention_task
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for
from tests.factories import synthetic_dead_letters

pytestmark = [pytest.mark.django_db]

NOW = dt.datetime(2031, 3, 10, 12, 0, tzinfo=dt.UTC)
STATUSES = [str(status) for status in DeadLetterStatus]


def age(ids: list[int], status: str, *, days: float) -> None:
    """Give the dead letters `status`, changed `days` before NOW, moving their counts as an operation would."""
    rows = DeadLetter.objects.filter(pk__in=ids).values_list(*COUNTED_FIELDS)
    count_status_change([CountedRow(*row) for row in rows], to_status=status)
    DeadLetter.objects.filter(pk__in=ids).update(status=status, status_changed_at=NOW - dt.timedelta(days=days))


def unpaced(batch_size: int = 500) -> Pacing:
    return Pacing(batch_size=batch_size, rest=0.0)


def counted() -> dict[str, int | None]:
    """What the pages' counters say per status."""
    return {status: selectors.counted_total(DeadLetterFilter(status=[status])) for status in STATUSES}


def stored() -> dict[str, int]:
    return {status: DeadLetter.objects.filter(status=status).count() for status in STATUSES}


def charts() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], list[tuple[int, int]]]:
    """The arrival counts behind the dashboard's charts, the sparklines and the patterns' totals."""
    return (
        sorted(ArrivalCount.objects.values_list("broker_id", "source_queue", "minute", "count")),
        sorted(PatternArrivalCount.objects.values_list("pattern_id", "hour", "count")),
        sorted(FailurePattern.objects.values_list("pk", "total_count")),
    )


def audit(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("pk"))


@pytest.mark.sqlite
def test_only_finished_rows_past_their_cutoff_go_and_counters_drop_exactly_that(settings) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    settings.DLQ_ARCHIVE_RETENTION_DAYS = 30
    ids = synthetic_dead_letters(queue="orders", count=14, now=NOW - dt.timedelta(days=60))
    old = {"replayed": ids[0:2], "moved": ids[2:4], "archived": ids[4:6]}
    kept = {"replayed": ids[6:7], "moved": ids[7:8], "archived": ids[8:9], "scheduled": ids[9:10], "failed": ids[10:11]}
    for status, chosen in old.items():
        age(chosen, status, days=31 if status == "archived" else 15)
    age(kept["replayed"], "replayed", days=13)
    age(kept["moved"], "moved", days=13.9)
    age(kept["archived"], "archived", days=29)  # past the finished cutoff, not the archive one
    age(kept["scheduled"], "scheduled", days=100)
    age(kept["failed"], "failed", days=100)
    DeadLetter.objects.filter(pk__in=ids[11:]).update(status_changed_at=NOW - dt.timedelta(days=100))  # parked
    before = charts()
    assert counted() == stored()

    run = apply_retention(now=NOW, pacing=unpaced())

    assert run.dead_letters == {"finished.retention": 4, "archive.retention": 2} and run.complete
    left = set(DeadLetter.objects.values_list("pk", flat=True))
    assert left == set(ids) - {pk for chosen in old.values() for pk in chosen}
    assert stored() == {"parked": 3, "scheduled": 1, "replayed": 1, "moved": 1, "archived": 1, "failed": 1}
    assert counted() == stored()
    assert charts() == before
    assert apply_retention(now=NOW, pacing=unpaced()).dead_letters == {"finished.retention": 0, "archive.retention": 0}


@pytest.mark.sqlite
def test_each_batch_writes_one_audit_row_with_its_statuses_count_queues_ids_and_cutoff(settings) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    orders = synthetic_dead_letters(queue="orders", count=3, now=NOW - dt.timedelta(days=30))
    payments = synthetic_dead_letters(queue="payments", count=2, now=NOW - dt.timedelta(days=30))
    age(orders, "replayed", days=20)
    age(payments, "moved", days=19)  # changed after the orders: the last batch
    archived = synthetic_dead_letters(queue="orders", count=3, start=10, now=NOW - dt.timedelta(days=60))
    age(archived, "archived", days=40)

    apply_retention(now=NOW, pacing=unpaced(batch_size=2))

    finished = audit("finished.retention")
    assert [row.count for row in finished] == [2, 2, 1]
    assert [row.filter["queue"] for row in finished] == [
        ["orders.dlq"],
        ["orders.dlq", "payments.dlq"],
        ["payments.dlq"],
    ]
    assert [row.filter["status"] for row in finished] == [["replayed"], ["moved", "replayed"], ["moved"]]
    assert {row.filter["status_changed_before"] for row in finished} == {(NOW - dt.timedelta(days=14)).isoformat()}
    assert finished[0].detail.startswith(
        f"deleted dead letters replayed or moved more than 14 days ago (ids {orders[0]}"
    )
    assert all(row.actor_name == "system" and "broker" not in row.filter for row in finished)
    assert [row.count for row in audit("archive.retention")] == [2, 1]
    assert not DeadLetter.objects.exists()


@pytest.mark.sqlite
def test_links_to_a_deleted_dead_letter_become_empty(settings) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    replayed, boomerang, edited = synthetic_dead_letters(queue="orders", count=3, now=NOW - dt.timedelta(days=30))
    age([replayed], "replayed", days=20)
    DeadLetter.objects.filter(pk=boomerang).update(previous_id=replayed)
    DeadLetter.objects.filter(pk=edited).update(edited_from_id=replayed)

    apply_retention(now=NOW, pacing=unpaced())

    assert list(DeadLetter.objects.order_by("pk").values_list("pk", "previous_id", "edited_from_id")) == [
        (boomerang, None, None),
        (edited, None, None),
    ]


def test_a_dead_letter_an_unfinished_operation_holds_stays_until_it_finishes(settings, operator: User) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=4, now=NOW - dt.timedelta(days=30))
    age(ids, "replayed", days=20)
    # A retry may take replayed dead letters again when its filter asks for them: the plan holds two.
    operation = plan_operation(
        kind=OperationKind.RETRY, filter={"ids": ids[:2], "status": ["replayed"]}, actor=operator
    )
    assert operation.total == 2

    run = apply_retention(now=NOW, pacing=unpaced(batch_size=1))

    assert run.dead_letters["finished.retention"] == 2
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == set(ids[:2])
    cancel_operation(operation=operation, actor=operator)
    assert apply_retention(now=NOW, pacing=unpaced()).dead_letters["finished.retention"] == 2
    assert not DeadLetter.objects.exists()


class Clock:
    """A monotonic clock that moves only when a query runs or the run sleeps."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step
        self.slept: list[float] = []

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.sqlite
def test_a_run_rests_after_each_batch_stops_when_its_time_is_spent_and_the_next_goes_on(settings) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=10, now=NOW - dt.timedelta(days=30))
    age(ids, "replayed", days=20)
    clock = Clock(step=1.0)
    pacing = Pacing(batch_size=2, rest=1.0, seconds=10.0, clock=clock, sleep=clock.sleep)

    first = apply_retention(now=NOW, pacing=pacing)

    # Each batch reads the clock twice (1 s) and then rests as long: 2 s a batch in a 10 s budget.
    assert not first.complete and 0 < first.dead_letters["finished.retention"] < 10
    assert clock.slept and all(0 < pause <= 1.0 for pause in clock.slept)
    runs: list[RetentionRun] = [first]
    while not runs[-1].complete:
        runs.append(apply_retention(now=NOW, pacing=pacing))
        assert len(runs) < 10
    assert sum(run.dead_letters["finished.retention"] for run in runs) == 10
    assert [row.count for row in audit("finished.retention")] == [2] * 5


@pytest.mark.sqlite
def test_a_run_whose_rows_are_all_held_ends_at_once_even_on_a_clock_that_stands_still(settings, operator: User) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=5, now=NOW - dt.timedelta(days=30))
    age(ids, "replayed", days=20)
    plan_operation(kind=OperationKind.RETRY, filter={"status": ["replayed"]}, actor=operator)
    clock = Clock(step=0.0)

    run = apply_retention(now=NOW, pacing=Pacing(batch_size=2, clock=clock, sleep=clock.sleep))

    assert run.complete and run.dead_letters["finished.retention"] == 0
    assert DeadLetter.objects.count() == 5


def test_a_run_killed_midway_keeps_the_batches_it_committed_with_their_audit_rows(
    settings, refuse_deleting: Callable[[int], None]
) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=7, now=NOW - dt.timedelta(days=30))
    age(ids, "moved", days=20)
    refuse_deleting(ids[4])

    with pytest.raises(DatabaseError, match="refused"):
        apply_retention(now=NOW, pacing=unpaced(batch_size=3))

    assert [row.count for row in audit("finished.retention")] == [3]
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == set(ids[3:])
    assert counted() == stored()


def finished_operation(
    kind: str, *, days: float, statuses: dict[str, int], status: str = OperationStatus.DONE, **fields: int
) -> Operation:
    """An operation (finished unless `status` says otherwise) `days` before NOW with items of these statuses (error
    "boom <n>" when failed)."""
    operation = Operation.objects.create(
        kind=kind,
        status=status,
        total=sum(statuses.values()),
        started_at=NOW - dt.timedelta(days=days, hours=1),
        finished_at=NOW - dt.timedelta(days=days),
        **fields,
    )
    items = []
    for status, n in statuses.items():
        for index in range(n):
            error = f"boom {index % 2}" if status == ItemStatus.FAILED else ""
            items.append(OperationItem(operation=operation, dead_letter_id=None, status=status, error=error))
    # dead_letter is null in these records: the unique (operation, dead letter) lets nulls repeat.
    OperationItem.objects.bulk_create(items)
    return operation


@pytest.mark.sqlite
def test_old_finished_operations_lose_their_items_and_keep_their_summary(settings) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    old = finished_operation("retry", days=15, statuses={"published": 5, "failed": 3}, succeeded=5, failed=3)
    purge = finished_operation("purge", days=20, statuses={"done": 4}, succeeded=4)
    recent = finished_operation("retry", days=13, statuses={"published": 2}, succeeded=2)
    paused = finished_operation("retry", days=30, statuses={"pending": 2}, status=OperationStatus.PAUSED)

    run = apply_retention(now=NOW, pacing=unpaced(batch_size=3))

    assert (run.operations, run.items) == (2, 12)
    assert set(OperationItem.objects.values_list("operation_id", flat=True)) == {recent.pk, paused.pk}
    for operation in (old, purge, recent, paused):
        operation.refresh_from_db()
    assert old.items_removed_at == NOW and purge.items_removed_at == NOW
    assert recent.items_removed_at is None and paused.items_removed_at is None
    assert (old.succeeded, old.failed, old.total) == (5, 3, 8)
    assert old.items_summary == {
        "statuses": {"published": 5, "failed": 3},
        "not_attempted": 0,
        "errors": [["boom 0", 2], ["boom 1", 1]],
    }
    rows = audit("operation.items.retention")
    assert [(row.target, row.count) for row in rows] == [(f"operation:{purge.pk}", 4), (f"operation:{old.pk}", 8)]


def test_a_cancelled_operation_still_counts_what_it_never_attempted_on_its_page_cli_and_api(
    settings, operator: User, viewer: User
) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=3, now=NOW - dt.timedelta(days=60))
    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={"ids": ids}, actor=operator)
    start_operation(operation=operation, actor=operator)
    cancel_operation(operation=operation, actor=operator)  # before any worker took a message
    Operation.objects.filter(pk=operation.pk).update(finished_at=NOW - dt.timedelta(days=15))
    operation.refresh_from_db()
    assert history.figures(operation).not_attempted == 3

    apply_retention(now=NOW, pacing=unpaced())

    operation.refresh_from_db()
    assert not OperationItem.objects.filter(operation=operation).exists()
    assert history.figures(operation).not_attempted == 3
    page = client_for(viewer).get(f"/operations/{operation.pk}/").content.decode()
    assert 'data-testid="items-removed"' in page and "removed by retention" in page
    assert "3 not attempted" in " ".join(page.split())
    out = StringIO()
    call_command("dlq", "operation", "show", str(operation.pk), stdout=out)
    assert "per-message rows: removed by retention on" in out.getvalue()
    body = api_client(token_for(viewer)).get(f"/api/v1/operations/{operation.pk}/").json()
    assert body["items_removed_at"] is not None and body["progress"]["not_attempted"] == 3


def test_the_operation_page_and_admin_show_the_summary_once_its_items_are_gone(
    settings, viewer: User, admin_user: User
) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    operation = finished_operation("retry", days=15, statuses={"failed": 3}, failed=3)

    apply_retention(now=NOW, pacing=unpaced())

    page = client_for(viewer).get(f"/operations/{operation.pk}/").content.decode()
    assert 'data-testid="summary-errors"' in page and "2 × boom 0" in page and "1 × boom 1" in page
    assert "3 failed" in " ".join(page.split())
    admin = client_for(admin_user).get(f"/admin/operations/operation/{operation.pk}/change/").content.decode()
    assert "removed by retention on" in admin and "operationitem/?operation__id__exact" not in admin


def test_a_purge_keeps_its_list_of_deleted_dead_letters_when_its_items_go(settings, admin_user: User) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=2)
    operation = plan_operation(kind=OperationKind.PURGE, filter={"ids": ids}, actor=admin_user)
    start_operation(operation=operation, actor=admin_user, typed_count="2")
    run_operation(operation_id=operation.pk)
    operation.refresh_from_db()
    assert operation.purged.count() == 2

    assert operation.finished_at is not None
    apply_retention(now=operation.finished_at + dt.timedelta(days=15), pacing=unpaced())

    operation.refresh_from_db()
    assert operation.items_removed_at is not None and operation.succeeded == 2
    assert not OperationItem.objects.filter(operation=operation).exists()
    assert operation.purged.count() == 2


def test_the_retention_task_takes_no_arguments_and_runs_the_whole_retention(settings, caplog) -> None:
    settings.DLQ_FINISHED_RETENTION_DAYS = 14
    ids = synthetic_dead_letters(queue="orders", count=2, now=NOW - dt.timedelta(days=400))
    age(ids, "replayed", days=0)
    # The task runs at the real time: changed long before it, whatever the year.
    DeadLetter.objects.filter(pk__in=ids).update(status_changed_at=dt.datetime(2001, 1, 1, tzinfo=dt.UTC))

    assert apply_retention_task(now="2999-01-01") is None
    assert DeadLetter.objects.count() == 2
    apply_retention_task()
    assert not DeadLetter.objects.exists()
    assert json.dumps(audit("finished.retention")[0].filter)
