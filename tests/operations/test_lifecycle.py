from __future__ import annotations

import datetime as dt

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, DeadLetterStatus
from dlqconsole.operations.models import ItemStatus, Operation, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import (
    OperationError,
    cancel_operation,
    change_rate,
    pause_operation,
    resume_operation,
    run_operation,
    start_operation,
)
from dlqconsole.operations.upkeep import delete_expired_archives, requeue_stale_operations
from tests.factories import synthetic_dead_letters

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def cells(queue: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for cell in DeadLetterCount.objects.filter(source_queue=queue):
        if cell.count:
            found[cell.status] = found.get(cell.status, 0) + cell.count
    return found


def run(kind: str, actor, **plan) -> Operation:  # type: ignore[no-untyped-def]
    operation = plan_operation(kind=kind, actor=actor, **plan)
    start_operation(operation=operation, actor=actor)
    run_operation(operation_id=operation.pk)
    operation.refresh_from_db()
    return operation


def test_archive_hides_dead_letters_and_restore_brings_them_back(operator):
    ids = synthetic_dead_letters(queue="orders", count=5)

    archived = run(OperationKind.ARCHIVE, operator, filter={"queue": ["orders.dlq"]})

    assert (archived.status, archived.succeeded) == (OperationStatus.DONE, 5)
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"archived"}
    assert not DeadLetterFilter.from_dict({"queue": ["orders.dlq"]}).apply().exists()
    assert cells("orders.dlq") == {"archived": 5}

    restored = run(OperationKind.RESTORE, operator, filter={"queue": ["orders.dlq"]})

    assert restored.succeeded == 5
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"parked"}
    assert cells("orders.dlq") == {"parked": 5}


def test_purge_deletes_for_good_and_the_audit_log_keeps_count_and_filter(admin_user):
    ids = synthetic_dead_letters(queue="orders", count=4)
    keep = synthetic_dead_letters(queue="payments", count=2)

    purged = run(OperationKind.PURGE, admin_user, filter={"queue": ["orders.dlq"]})

    assert purged.succeeded == 4
    assert not DeadLetter.objects.filter(pk__in=ids).exists()
    assert DeadLetter.objects.filter(pk__in=keep).count() == 2
    assert cells("orders.dlq") == {}
    assert sorted(purged.items.values_list("dead_letter_id", flat=True)) == ids
    start = AuditEntry.objects.get(action="operation.purge.start")
    assert (start.count, start.filter, start.actor) == (4, {"queue": ["orders.dlq"]}, admin_user)
    done = AuditEntry.objects.get(action="operation.purge.done")
    assert (done.count, done.filter) == (4, {"queue": ["orders.dlq"]})


def test_an_operator_cannot_purge_and_a_viewer_cannot_retry(operator, viewer):
    synthetic_dead_letters(queue="orders", count=1)

    with pytest.raises(PermissionDenied):
        plan_operation(kind=OperationKind.PURGE, filter={}, actor=operator)
    with pytest.raises(PermissionDenied):
        plan_operation(kind=OperationKind.RETRY, filter={}, actor=viewer)
    assert not Operation.objects.exists()


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"kind": "retry", "rate": "fast"}, "has no '/'"),
        ({"kind": "move"}, "needs a target queue"),
        ({"kind": "move", "target_queue": "a", "target_exchange": "b"}, "not both"),
        ({"kind": "retry", "target_queue": "a"}, "only a move takes a target"),
        ({"kind": "archive", "canary_size": 5}, "no canary"),
        ({"kind": "retry", "limit": 0}, "between 1 and 1,000,000,000"),
        ({"kind": "explode"}, "unknown operation"),
        ({"kind": "retry", "filter": {"reason": ["NOPE"]}}, "unknown reason"),
        ({"kind": "restore", "filter": {"status": ["parked"]}}, "cannot act on dead letters with status parked"),
    ],
)
def test_plan_rejects_what_it_cannot_do_with_a_clear_message(admin_user, plan, message):
    plan.setdefault("filter", {})
    with pytest.raises(OperationError, match=message):
        plan_operation(actor=admin_user, **plan)


def test_limit_freezes_the_oldest_matches_only(operator):
    ids = synthetic_dead_letters(queue="orders", count=10)

    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={}, actor=operator, limit=3)

    assert operation.total == 3
    assert sorted(operation.items.values_list("dead_letter_id", flat=True)) == ids[:3]


def test_retry_leaves_replayed_ones_alone_unless_the_filter_asks_for_them(operator):
    ids = synthetic_dead_letters(queue="orders", count=3)
    DeadLetter.objects.filter(pk=ids[0]).update(status=DeadLetterStatus.REPLAYED)

    default = plan_operation(kind=OperationKind.RETRY, filter={}, actor=operator)
    explicit = plan_operation(kind=OperationKind.RETRY, filter={"status": ["replayed"]}, actor=operator)

    assert sorted(default.items.values_list("dead_letter_id", flat=True)) == ids[1:]
    assert list(explicit.items.values_list("dead_letter_id", flat=True)) == [ids[0]]


def test_cancel_skips_what_is_left_and_leaves_the_dead_letters_as_they_were(operator):
    ids = synthetic_dead_letters(queue="orders", count=3)
    operation = plan_operation(kind=OperationKind.RETRY, filter={}, actor=operator)
    start_operation(operation=operation, actor=operator)

    cancel_operation(operation=operation, actor=operator)

    operation.refresh_from_db()
    assert (operation.status, operation.skipped, operation.succeeded) == (OperationStatus.CANCELLED, 3, 0)
    assert set(operation.items.values_list("status", "error")) == {(ItemStatus.SKIPPED, "cancelled")}
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"parked"}
    assert not run_operation(operation_id=operation.pk)  # a late task finds nothing to run
    with pytest.raises(OperationError, match="already"):
        cancel_operation(operation=operation, actor=operator)


def test_pause_stops_a_run_and_resume_continues_it(operator):
    synthetic_dead_letters(queue="orders", count=3)
    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={}, actor=operator)
    with pytest.raises(OperationError, match="only a running one"):
        pause_operation(operation=operation, actor=operator)
    start_operation(operation=operation, actor=operator)
    pause_operation(operation=operation, actor=operator, reason="downstream deploy")

    assert not run_operation(operation_id=operation.pk)
    operation.refresh_from_db()
    assert (operation.status, operation.pause_reason, operation.succeeded) == ("paused", "downstream deploy", 0)
    assert not operation.paused_automatically

    resume_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == ("done", 3)
    actions = list(AuditEntry.objects.order_by("pk").values_list("action", flat=True))
    assert actions == [
        "operation.archive.plan",
        "operation.archive.start",
        "operation.pause",
        "operation.resume",
        "operation.archive.done",
    ]


def test_change_rate_applies_to_unfinished_operations_only(operator):
    synthetic_dead_letters(queue="orders", count=1)
    operation = plan_operation(kind=OperationKind.RETRY, filter={}, actor=operator, rate="10/1s")

    change_rate(operation=operation, rate="50/1m:5", actor=operator)
    operation.refresh_from_db()
    assert operation.rate == "50/1m:5"
    with pytest.raises(OperationError, match="unknown unit"):
        change_rate(operation=operation, rate="5/1y", actor=operator)
    assert AuditEntry.objects.filter(action="operation.rate", detail="rate 10/1s -> 50/1m:5").exists()
    cancel_operation(operation=operation, actor=operator)
    with pytest.raises(OperationError, match="cannot change"):
        change_rate(operation=operation, rate="", actor=operator)


def test_retention_deletes_old_archives_and_adjusts_counts(operator, settings):
    settings.DLQ_ARCHIVE_RETENTION_DAYS = 7
    ids = synthetic_dead_letters(queue="orders", count=4)
    run(OperationKind.ARCHIVE, operator, filter={})
    DeadLetter.objects.filter(pk__in=ids[:3]).update(status_changed_at=timezone.now() - dt.timedelta(days=8))

    assert delete_expired_archives() == 3

    assert list(DeadLetter.objects.values_list("pk", flat=True)) == [ids[3]]
    assert cells("orders.dlq") == {"archived": 1}
    assert AuditEntry.objects.get(action="archive.retention").count == 3


def test_progress_and_eta_follow_the_counts(operator):
    operation = Operation(kind="retry", total=200, succeeded=40, failed=5, skipped=5, status="running")
    operation.started_at = timezone.now() - dt.timedelta(seconds=10)

    assert operation.progress == 0.25
    assert operation.eta is not None and 29 <= operation.eta.total_seconds() <= 31
    operation.status = "paused"
    assert operation.eta is None


def test_the_sweeper_requeues_operations_whose_worker_went_quiet(
    operator, settings, django_capture_on_commit_callbacks
):
    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS + 1)
    quiet = Operation.objects.create(kind="retry", status="running", runner="dead", heartbeat_at=stale)
    lost = Operation.objects.create(kind="retry", status="canary", heartbeat_at=None)
    alive = Operation.objects.create(kind="retry", status="running", runner="alive", heartbeat_at=now)
    waiting = Operation.objects.create(
        kind="retry", status="canary", heartbeat_at=stale, canary_until=now + dt.timedelta(seconds=30)
    )
    Operation.objects.create(kind="retry", status="paused", heartbeat_at=stale)

    with django_capture_on_commit_callbacks() as callbacks:
        requeued = requeue_stale_operations(now=now)

    assert requeued == [quiet.pk, lost.pk]
    assert len(callbacks) == 2
    assert alive.pk not in requeued and waiting.pk not in requeued
    quiet.refresh_from_db()
    assert (quiet.runner, quiet.heartbeat_at) == ("", now)  # the silent worker lost its claim
    assert requeue_stale_operations(now=now + dt.timedelta(seconds=15)) == []  # one task per stale period


def test_every_beat_entry_names_a_registered_task(settings):
    from dlqconsole.celery import app

    app.loader.import_default_modules()
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    operations = {name for name in names if str(name).startswith("operations.")}

    assert operations == {
        "operations.sweep_operations",
        "operations.schedule_new_dead_letters",
        "operations.start_due_retries",
        "operations.apply_retention",
    }
    assert operations <= set(app.tasks)


def test_time_left_follows_the_rate_limit_not_the_pace_so_far(operator):
    """The pace so far counts a canary's wait and pauses; with a rate limit the time left is what it allows."""
    synthetic_dead_letters(queue="orders", count=30)
    operation = plan_operation(kind=OperationKind.RETRY, filter={}, actor=operator, rate="2/1s")
    Operation.objects.filter(pk=operation.pk).update(
        status=OperationStatus.RUNNING, started_at=timezone.now() - dt.timedelta(minutes=5), succeeded=5
    )
    operation.refresh_from_db()

    assert operation.eta == dt.timedelta(seconds=12.5)  # 25 left at 2 a second, not 25 * 300 s / 5
    Operation.objects.filter(pk=operation.pk).update(rate="")
    operation.refresh_from_db()
    assert operation.eta is not None
    assert abs(operation.eta.total_seconds() - 25 * 300 / 5) < 5  # the pace so far, without a limit


def test_time_left_during_a_canary_counts_what_is_left_of_its_wait(operator):
    """The page said "about 1s" while a canary was watched for another minute: the wait left is part of it."""
    now = timezone.now()
    watching = Operation(
        kind="retry",
        status=OperationStatus.CANARY,
        total=100,
        succeeded=10,
        canary_size=10,
        canary_wait_seconds=60,
        canary_until=now + dt.timedelta(seconds=45),
        started_at=now - dt.timedelta(seconds=17),
        rate="10/1s",
    )
    assert watching.eta is not None and 53 <= watching.eta.total_seconds() <= 54  # 45 s of wait + 90 at 10/s

    # Without a rate, the pace is the canary's own (10 in the 2 s before its wait), not one slowed by the wait.
    watching.rate = ""
    assert watching.eta is not None and 62 <= watching.eta.total_seconds() <= 63  # 45 s + 90 * 2 s / 10

    # Its wait over (the runner judges it at once), only the messages are left.
    watching.canary_until = now - dt.timedelta(seconds=1)
    watching.started_at = now - dt.timedelta(seconds=62)
    assert watching.eta is not None and 17 <= watching.eta.total_seconds() <= 19

    passed = Operation(
        kind="retry",
        status=OperationStatus.RUNNING,
        total=100,
        succeeded=50,
        canary_size=10,
        canary_passed=True,
        canary_wait_seconds=60,
        canary_until=now - dt.timedelta(seconds=10),
        started_at=now - dt.timedelta(seconds=80),
    )
    assert passed.eta is not None and 19 <= passed.eta.total_seconds() <= 21  # 50 in the 20 s spent publishing
