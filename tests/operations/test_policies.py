from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount
from dlqconsole.operations.models import OperationKind, RetryPolicy, SchedulerCursor
from dlqconsole.operations.policies import schedule_new_dead_letters, start_due_retries
from dlqconsole.operations.services import run_operation
from tests.factories import synthetic_dead_letters
from tests.support import declare_with_dlq, wait_for_depth

EARLIER = dt.timedelta(minutes=5)


def cells(queue: str) -> dict[str, int]:
    return {cell.status: cell.count for cell in DeadLetterCount.objects.filter(source_queue=queue) if cell.count}


@pytest.mark.django_db
@pytest.mark.sqlite
def test_new_dead_letters_a_policy_covers_are_scheduled_after_the_first_delay():
    RetryPolicy.objects.create(name="orders", queue="orders.dlq")
    now = timezone.now()
    ids = synthetic_dead_letters(queue="orders", count=3, now=now - EARLIER)
    other = synthetic_dead_letters(queue="payments", count=1, now=now - EARLIER)

    assert schedule_new_dead_letters(now=now) == 3

    scheduled = DeadLetter.objects.filter(pk__in=ids)
    assert set(scheduled.values_list("status", "next_retry_at")) == {("scheduled", now + dt.timedelta(minutes=1))}
    assert DeadLetter.objects.get(pk=other[0]).status == "parked"
    assert cells("orders.dlq") == {"scheduled": 3}
    assert SchedulerCursor.objects.get().position == max(ids + other)
    assert schedule_new_dead_letters(now=now) == 0


@pytest.mark.django_db
@pytest.mark.sqlite
def test_the_delay_grows_with_the_replay_count_and_exhausted_ones_stay_parked_and_marked():
    RetryPolicy.objects.create(name="all", delays=[60, 300, 1800], max_attempts=3)
    now = timezone.now()
    (second,) = synthetic_dead_letters(queue="a", count=1, now=now - EARLIER, extra_headers={"dlq-replay-count": 1})
    (fourth,) = synthetic_dead_letters(queue="b", count=1, now=now - EARLIER, extra_headers={"dlq-replay-count": 2})
    (spent,) = synthetic_dead_letters(queue="c", count=1, now=now - EARLIER, extra_headers={"dlq-replay-count": 3})

    schedule_new_dead_letters(now=now)

    assert DeadLetter.objects.get(pk=second).next_retry_at == now + dt.timedelta(minutes=5)
    assert DeadLetter.objects.get(pk=fourth).next_retry_at == now + dt.timedelta(minutes=30)
    exhausted = DeadLetter.objects.get(pk=spent)
    assert (exhausted.status, exhausted.retry_exhausted, exhausted.next_retry_at) == ("parked", True, None)


@pytest.mark.django_db
@pytest.mark.sqlite
def test_permanent_failures_are_never_retried_automatically():
    RetryPolicy.objects.create(name="no timeouts", permanent_reasons=["TIMEOUT"])
    now = timezone.now()
    (letter,) = synthetic_dead_letters(queue="orders", count=1, now=now - EARLIER)
    assert DeadLetter.objects.get(pk=letter).failure_reason == "TIMEOUT"

    assert schedule_new_dead_letters(now=now) == 0

    stored = DeadLetter.objects.get(pk=letter)
    assert (stored.status, stored.retry_exhausted) == ("parked", False)


@pytest.mark.django_db
@pytest.mark.sqlite
def test_the_most_specific_policy_wins():
    RetryPolicy.objects.create(name="catch-all", delays=[10])
    RetryPolicy.objects.create(name="timeouts", failure_reason="TIMEOUT", delays=[20])
    RetryPolicy.objects.create(name="orders", queue="orders", delays=[30])
    now = timezone.now()
    (letter,) = synthetic_dead_letters(queue="orders", count=1, now=now - EARLIER)
    (elsewhere,) = synthetic_dead_letters(queue="billing", count=1, now=now - EARLIER)

    schedule_new_dead_letters(now=now)

    assert DeadLetter.objects.get(pk=letter).next_retry_at == now + dt.timedelta(seconds=30)
    assert DeadLetter.objects.get(pk=elsewhere).next_retry_at == now + dt.timedelta(seconds=20)


@pytest.mark.django_db
@pytest.mark.sqlite
def test_the_cursor_waits_for_recent_arrivals_and_deciding_again_changes_nothing():
    RetryPolicy.objects.create(name="orders", queue="orders.dlq")
    now = timezone.now()
    old = synthetic_dead_letters(queue="orders", count=1, now=now - EARLIER)
    young = synthetic_dead_letters(queue="orders", count=1, now=now, start=1)

    assert schedule_new_dead_letters(now=now) == 2
    assert SchedulerCursor.objects.get().position == old[0]
    assert schedule_new_dead_letters(now=now) == 0
    assert DeadLetter.objects.get(pk=young[0]).status == "scheduled"
    assert cells("orders.dlq") == {"scheduled": 2}


@pytest.mark.django_db
def test_due_retries_are_replayed_by_an_automatic_operation_at_the_policy_rate(
    channel, queue_name, django_capture_on_commit_callbacks
):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    RetryPolicy.objects.create(name="orders", queue=orders, rate="100/1s")
    now = timezone.now()
    ids = synthetic_dead_letters(queue=orders, count=3, now=now - EARLIER)
    schedule_new_dead_letters(now=now - dt.timedelta(minutes=2))

    with django_capture_on_commit_callbacks() as callbacks:
        (operation,) = start_due_retries(now=now)
    assert len(callbacks) == 1
    assert start_due_retries(now=now) == []  # taken: no longer due
    assert (operation.kind, operation.automatic, operation.rate, operation.total) == (
        OperationKind.RETRY,
        True,
        "100/1s",
        3,
    )
    run_operation(operation_id=operation.pk)

    assert wait_for_depth(channel, orders, 3) == 3
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", "replay_count")) == {("replayed", 1)}
    assert cells(orders + ".dlq") == {"replayed": 3}
    assert AuditEntry.objects.filter(action="operation.retry.start", actor=None, count=3).exists()


@pytest.mark.django_db(transaction=True)
def test_due_retries_skip_dead_letters_another_worker_has_locked():
    RetryPolicy.objects.create(name="all")
    now = timezone.now()
    ids = synthetic_dead_letters(queue="orders", count=4, now=now - EARLIER)
    DeadLetter.objects.filter(pk__in=ids).update(status="scheduled", next_retry_at=now - dt.timedelta(seconds=1))
    taken: list[list[int]] = []

    def other_worker() -> None:
        try:
            taken.extend(sorted(op.items.values_list("dead_letter_id", flat=True)) for op in start_due_retries(now=now))
        finally:
            connection.close()

    with transaction.atomic():
        list(DeadLetter.objects.select_for_update().filter(pk__in=ids[:2]))
        thread = threading.Thread(target=other_worker)
        thread.start()
        thread.join(timeout=30)

    assert taken == [ids[2:]]
    (rest,) = start_due_retries(now=now)
    assert sorted(rest.items.values_list("dead_letter_id", flat=True)) == ids[:2]
