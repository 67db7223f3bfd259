"""Canary, boomerangs, the circuit breaker, the share of returns, and resuming after a worker died."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from typing import Any

import pika
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.core.breaker import CLOSED, get_breakers
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, DeadLetterStatus
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.services import ingest_batch
from dlqconsole.operations.item_sql import count_returned
from dlqconsole.operations.message_retry import edit_and_retry
from dlqconsole.operations.models import ItemStatus, Operation, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import pause_operation, resume_operation, run_operation, start_operation
from tests.support import declare_with_dlq, drain, ingest_from, kill_on_broker, wait_for_depth

pytestmark = pytest.mark.django_db


def cells(queue: str) -> dict[str, int]:
    return {cell.status: cell.count for cell in DeadLetterCount.objects.filter(source_queue=queue) if cell.count}


def dead_letters_on_broker(channel, queue: str, count: int) -> list[DeadLetter]:  # type: ignore[no-untyped-def]
    declare_with_dlq(channel, queue)
    for n in range(count):
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=f"job {n}".encode(),
            properties=pika.BasicProperties(message_id=f"j{n}"),
        )
    kill_on_broker(channel, queue, count)
    assert wait_for_depth(channel, queue + ".dlq", count) == count
    return ingest_from(channel, queue + ".dlq")


def test_a_replay_that_dies_again_links_to_its_first_record_and_counts_once(channel, queue_name, operator):
    orders = queue_name("orders")
    (first,) = dead_letters_on_broker(channel, orders, 1)
    operation = plan_operation(kind=OperationKind.RETRY, filter={"ids": [first.pk]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)
    assert wait_for_depth(channel, orders, 1) == 1

    kill_on_broker(channel, orders, 1)  # the service fails again
    wait_for_depth(channel, orders + ".dlq", 1)
    method, properties, body = channel.basic_get(queue=orders + ".dlq")
    again = parse_envelope(source_queue=orders + ".dlq", body=body, properties=properties, now=timezone.now())
    # Stored, then delivered again after a crash between commit and ack: it is one record all the same.
    ingest_batch(letters=[again])
    again.redelivered = True
    ingest_batch(letters=[again])
    channel.basic_ack(delivery_tag=method.delivery_tag)

    boomerang = DeadLetter.objects.get(source_queue=orders + ".dlq", previous__isnull=False)
    first.refresh_from_db()
    assert boomerang.previous_id == first.pk
    assert boomerang.replay_count == 1 and first.replay_count == 1
    assert first.status == DeadLetterStatus.REPLAYED
    assert cells(orders + ".dlq") == {"parked": 1, "replayed": 1}
    assert count_returned(operation=operation) == 1


def start_canary_retry(orders: str, operator: Any, *, wait: int) -> Operation:
    """A started retry of the queue's dead letters whose first two are a canary watched for `wait` seconds."""
    operation = plan_operation(
        kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator, canary_size=2, canary_wait_seconds=wait
    )
    return start_operation(operation=operation, actor=operator)


def canary_dies_again(channel: Any, orders: str) -> None:
    """The two canary messages reach their queue, die there again and are ingested from its DLQ."""
    assert wait_for_depth(channel, orders, 2) == 2
    kill_on_broker(channel, orders, 2)
    wait_for_depth(channel, orders + ".dlq", 2)
    ingest_from(channel, orders + ".dlq")


def test_a_canary_that_comes_back_pauses_the_operation_before_the_rest(channel, queue_name, operator):
    orders = queue_name("orders")
    letters = dead_letters_on_broker(channel, orders, 5)
    operation = start_canary_retry(orders, operator, wait=1)
    waits: list[float] = []

    run_operation(operation_id=operation.pk, continue_later=waits.append)

    assert len(waits) == 1 and 0 < waits[0] <= 1
    canary_dies_again(channel, orders)
    time.sleep(1.1)
    run_operation(operation_id=operation.pk, continue_later=waits.append)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED
    assert operation.pause_reason == "canary of 2: 2 came back to a dead-letter queue within 1s (2 rejected)"
    assert operation.paused_automatically
    assert (operation.succeeded, operation.returned) == (2, 2)
    assert operation.items.filter(status=ItemStatus.PENDING).count() == 3
    rest = DeadLetter.objects.filter(pk__in=[letter.pk for letter in letters[2:]])
    assert set(rest.values_list("status", flat=True)) == {"parked"}


def test_a_failed_canary_resumed_by_a_person_is_not_called_passed(channel, queue_name, operator):
    orders = queue_name("orders")
    dead_letters_on_broker(channel, orders, 5)
    operation = start_canary_retry(orders, operator, wait=1)
    run_operation(operation_id=operation.pk, continue_later=lambda delay: None)
    canary_dies_again(channel, orders)
    time.sleep(1.1)
    run_operation(operation_id=operation.pk, continue_later=lambda delay: None)
    operation.refresh_from_db()
    paused_label = operation.canary_label

    resume_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert paused_label == "failed: its messages came back"
    assert (operation.status, operation.canary_failed, operation.canary_passed) == ("done", True, False)
    assert operation.canary_label == "failed: its messages came back; resumed by a person"
    client = Client()
    client.force_login(operator)
    page = client.get(f"/operations/{operation.pk}/").content.decode()
    assert "resumed by a person" in page and ", passed" not in page


def test_a_canary_of_a_cancelled_operation_is_not_said_to_be_resumed_or_paused():
    # Cancelled after its canary failed (never resumed), or cancelled during the canary's wait (never paused).
    failed = Operation(
        kind=OperationKind.RETRY, canary_size=2, canary_failed=True, returned=2, status=OperationStatus.CANCELLED
    )
    waiting = Operation(
        kind=OperationKind.RETRY, canary_size=2, canary_until=timezone.now(), status=OperationStatus.CANCELLED
    )

    assert failed.canary_label == "failed: its messages came back; the operation was cancelled"
    assert waiting.canary_label == "its wait was cut short: the operation was cancelled"


def test_the_canary_label_says_why_it_failed_and_when_it_watches_until() -> None:
    until = dt.datetime(2026, 11, 26, 9, 30, 5, tzinfo=dt.UTC)
    unpublished = Operation(canary_size=2, canary_failed=True, returned=0, failed=2, status=OperationStatus.PAUSED)
    came_back = Operation(canary_size=2, canary_failed=True, returned=1, status=OperationStatus.CANCELLED)
    watching = Operation(canary_size=2, canary_until=until, status=OperationStatus.CANARY)

    assert unpublished.canary_label == "failed: its messages could not be published"
    assert came_back.canary_label == "failed: its messages came back; the operation was cancelled"
    assert watching.canary_label == "watching until 09:30:05 UTC"


def test_a_quiet_canary_lets_the_operation_go_on(channel, queue_name, operator):
    orders = queue_name("orders")
    dead_letters_on_broker(channel, orders, 5)
    operation = start_canary_retry(orders, operator, wait=1)

    run_operation(operation_id=operation.pk)  # no worker queue: it waits in process

    operation.refresh_from_db()
    assert (operation.status, operation.canary_passed, operation.succeeded) == ("done", True, 5)
    assert (operation.canary_failed, operation.canary_label) == (False, "passed")
    assert wait_for_depth(channel, orders, 5) == 5


def test_a_canary_paused_during_its_wait_goes_on_watching_when_resumed(channel, queue_name, operator):
    """A pause during the watch does not skip the rest of it: resumed, the canary is watched until its end, and
    its messages coming back then still stop the operation before the rest is replayed."""
    orders = queue_name("orders")
    dead_letters_on_broker(channel, orders, 5)
    operation = start_canary_retry(orders, operator, wait=60)
    waits: list[float] = []
    run_operation(operation_id=operation.pk, continue_later=waits.append)
    operation.refresh_from_db()
    until = operation.canary_until
    assert until is not None and operation.succeeded == 2

    pause_operation(operation=operation, actor=operator)
    operation.refresh_from_db()
    paused_label = operation.canary_label
    resume_operation(operation=operation, actor=operator)
    operation.refresh_from_db()
    resumed = (operation.status, operation.canary_until, operation.canary_label)
    run_operation(operation_id=operation.pk, continue_later=waits.append)
    operation.refresh_from_db()
    still_watching = (operation.status, operation.succeeded, operation.items.filter(status=ItemStatus.PENDING).count())

    canary_dies_again(channel, orders)
    run_operation(operation_id=operation.pk, continue_later=waits.append)

    clock = f"{timezone.localtime(until):%H:%M:%S %Z}"
    assert paused_label == f"paused during its wait; resuming goes on watching until {clock}"
    assert resumed == (OperationStatus.CANARY, until, f"watching until {clock}")
    assert still_watching == (OperationStatus.CANARY, 2, 3)
    assert len(waits) == 2 and waits[-1] <= 2
    operation.refresh_from_db()
    assert (operation.status, operation.canary_failed, operation.canary_passed) == ("paused", True, False)
    assert operation.pause_reason == "canary of 2: 2 came back to a dead-letter queue within 60s (2 rejected)"
    assert operation.items.filter(status=ItemStatus.PENDING).count() == 3
    assert operation.canary_label == "failed: its messages came back"


def test_a_canary_whose_wait_ended_during_a_pause_is_judged_at_once_on_resume(channel, queue_name, operator):
    orders = queue_name("orders")
    dead_letters_on_broker(channel, orders, 5)
    operation = start_canary_retry(orders, operator, wait=1)
    run_operation(operation_id=operation.pk, continue_later=lambda delay: None)
    pause_operation(operation=operation, actor=operator)
    time.sleep(1.1)

    resume_operation(operation=operation, actor=operator)
    operation.refresh_from_db()
    resumed = operation.status
    waits: list[float] = []
    run_operation(operation_id=operation.pk, continue_later=waits.append)

    operation.refresh_from_db()
    assert resumed == OperationStatus.CANARY
    assert waits == []  # nothing left to wait for: nothing came back, so it passed and went on
    assert (operation.status, operation.canary_passed, operation.succeeded) == ("done", True, 5)
    assert operation.canary_label == "passed"
    assert wait_for_depth(channel, orders, 5) == 5


def test_a_canary_paused_before_its_wait_and_a_legacy_resume_are_labelled() -> None:
    before = Operation(canary_size=2, status=OperationStatus.PAUSED)
    legacy = Operation(canary_size=2, canary_until=timezone.now(), status=OperationStatus.RUNNING)

    assert before.canary_label == "paused before its wait; resuming goes on with the canary"
    assert legacy.canary_label == "its wait was cut short by a pause"


def test_unroutable_returns_fail_their_items_and_do_not_open_the_breaker(channel, queue_name, operator, settings):
    settings.DLQ_BREAKER_FAILURES = 3
    settings.DLQ_OPERATION_CHUNK_SIZE = 2
    orders = queue_name("orders")
    letters = dead_letters_on_broker(channel, orders, 10)
    gone = queue_name("gone")
    operation = plan_operation(kind=OperationKind.MOVE, filter={"queue": [orders]}, actor=operator, target_queue=gone)
    start_operation(operation=operation, actor=operator)

    run_operation(operation_id=operation.pk)

    # A configuration error does not wait: every item failed, with its dead letter, and the breaker stayed closed.
    operation.refresh_from_db()
    assert (operation.status, operation.failed, operation.breaker_wait) == (OperationStatus.DONE, 10, "")
    assert re.fullmatch(r"unroutable: 312 NO_ROUTE .*", operation.last_error)
    statuses = DeadLetter.objects.filter(pk__in=[letter.pk for letter in letters]).values_list("status", flat=True)
    assert set(statuses) == {"failed"}
    assert cells(orders + ".dlq") == {"failed": 10}
    assert get_breakers().peek(f"queue:{gone}").state == CLOSED


def test_a_dead_letter_with_no_known_destination_is_skipped_and_stays_parked(operator):
    properties = pika.BasicProperties(headers={"x-exception-message": "boom"})
    letter = parse_envelope(source_queue="lost.dlq", body=b"?", properties=properties, now=timezone.now())
    ingest_batch(letters=[letter])
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": ["lost.dlq"]}, actor=operator)
    assert operation.unreplayable == 1
    assert list(operation.unreplayable_reasons) == [
        "no known destination (no queue, exchange or routing key in its x-death)"
    ]
    start_operation(operation=operation, actor=operator)

    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.skipped) == ("done", 1)
    assert operation.items.get().error.startswith("no known destination")
    assert DeadLetter.objects.get(source_queue="lost.dlq").status == "parked"


def test_in_flight_items_left_by_a_dead_worker_are_published_again_and_recorded_as_duplicates(
    channel, queue_name, operator
):
    orders = queue_name("orders")
    letters = dead_letters_on_broker(channel, orders, 4)
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    # What a worker killed mid-chunk leaves: two items in flight (their dead letters unchanged), a stale heartbeat.
    taken = letters[:2]
    operation.items.filter(dead_letter__in=taken).update(status=ItemStatus.IN_FLIGHT, attempts=1)
    Operation.objects.filter(pk=operation.pk).update(
        runner="dead-worker",
        heartbeat_at=timezone.now() - dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS + 1),
    )

    assert run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.duplicates) == ("done", 4, 2)
    attempts = dict(operation.items.values_list("dead_letter_id", "attempts"))
    assert attempts == {taken[0].pk: 2, taken[1].pk: 2, letters[2].pk: 1, letters[3].pk: 1}
    assert cells(orders + ".dlq") == {"replayed": 4}
    assert wait_for_depth(channel, orders, 4) == 4


def test_a_live_worker_keeps_its_operation(operator):
    operation = Operation.objects.create(kind="archive", status="running", runner="alive", heartbeat_at=timezone.now())

    assert not run_operation(operation_id=operation.pk)


@pytest.mark.django_db(transaction=True)
def test_an_operation_pauses_itself_when_too_many_replays_come_back(channel, queue_name, operator, settings):
    """Its destination's circuit breaker stays closed (its thresholds are out of reach here): the operation's own
    share of returns pauses it for a person. (With the breaker open it waits instead: test_breaker_worker.py.)"""
    settings.DLQ_BREAKER_FAILURES = 1000
    settings.DLQ_BREAKER_MIN_SAMPLE = 1000
    orders = queue_name("orders")
    dead_letters_on_broker(channel, orders, 100)
    operation = plan_operation(
        kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator, rate="20/1s", max_return_share=0.2
    )
    start_operation(operation=operation, actor=operator)

    def work() -> None:
        try:
            run_operation(operation_id=operation.pk)
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    # The service is still broken: everything replayed dies again, and the consumer ingests it.
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline:
        depth = channel.queue_declare(queue=orders, passive=True).method.message_count
        if depth:
            kill_on_broker(channel, orders, depth)
            wait_for_depth(channel, orders + ".dlq", depth)
            ingest_from(channel, orders + ".dlq")
        time.sleep(0.2)
    worker.join(timeout=30)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED
    assert "replayed messages came back to a dead-letter queue (more than 20%)" in operation.pause_reason
    assert operation.succeeded < 100
    assert operation.items.filter(status=ItemStatus.PENDING).count() == 100 - operation.processed


def test_edit_and_retry_publishes_the_edited_copy_and_archives_the_original(channel, queue_name, operator):
    orders = queue_name("orders")
    (original,) = dead_letters_on_broker(channel, orders, 1)

    operation = edit_and_retry(
        dead_letter=original, body=b'{"fixed": true}', headers={"tenant": "acme"}, actor=operator
    )
    run_operation(operation_id=operation.pk)

    assert wait_for_depth(channel, orders, 1) == 1
    ((properties, body),) = drain(channel, orders)
    assert body == b'{"fixed": true}'
    assert properties.headers["tenant"] == "acme"
    assert properties.message_id == "j0"
    original.refresh_from_db()
    copy = DeadLetter.objects.get(edited_from=original)
    # Kept as it was, but no longer waiting: a retry of its pattern must not replay it beside its fixed copy.
    assert (original.status, bytes(original.body)) == ("archived", b"job 0")
    assert (copy.status, operation.kind) == ("replayed", OperationKind.EDIT_RETRY)
    assert cells(orders + ".dlq") == {"archived": 1, "replayed": 1}
    assert AuditEntry.objects.filter(action="deadletter.archive", target=f"deadletter:{original.pk}").exists()
    retry_all = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    assert retry_all.total == 0


def test_a_copy_whose_headers_amqp_cannot_carry_fails_with_the_reason_and_the_run_goes_on(
    channel, queue_name, operator
):
    """The edit form refuses such headers; behind it, the run marks the copy failed and says why, instead of
    taking pika's refusal for a lost connection and pausing."""
    orders = queue_name("orders")
    (original,) = dead_letters_on_broker(channel, orders, 1)

    operation = edit_and_retry(dead_letter=original, body=b"{}", headers={"n": 2**70}, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    copy = DeadLetter.objects.get(edited_from=original)
    assert (operation.status, operation.failed, copy.status) == (OperationStatus.DONE, 1, "failed")
    assert operation.items.get().error.startswith("cannot be sent over AMQP: a number does not fit its AMQP field")
    assert wait_for_depth(channel, orders, 0) == 0


def test_edit_and_retry_leaves_an_original_another_operation_is_replaying(channel, queue_name, operator):
    orders = queue_name("orders")
    (original,) = dead_letters_on_broker(channel, orders, 1)
    busy = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    busy.items.update(status=ItemStatus.IN_FLIGHT, attempts=1)

    edit_and_retry(dead_letter=original, body=b'{"fixed": true}', headers={}, actor=operator)

    original.refresh_from_db()
    assert original.status == "parked"


def test_a_dead_letter_another_operation_is_publishing_is_left_to_it(channel, queue_name, operator):
    orders = queue_name("orders")
    letters = dead_letters_on_broker(channel, orders, 2)
    first = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    second = plan_operation(kind=OperationKind.ARCHIVE, filter={"queue": [orders]}, actor=operator)
    start_operation(operation=first, actor=operator)
    start_operation(operation=second, actor=operator)
    # The first is mid-chunk in a live worker: its first message is in flight.
    first.items.filter(dead_letter=letters[0]).update(status=ItemStatus.IN_FLIGHT, attempts=1)
    Operation.objects.filter(pk=first.pk).update(runner="alive", heartbeat_at=timezone.now())

    run_operation(operation_id=second.pk)

    second.refresh_from_db()
    assert (second.succeeded, second.skipped) == (1, 1)
    assert second.items.get(dead_letter=letters[0]).error == "another operation is publishing it right now"
    assert [letter.status for letter in DeadLetter.objects.filter(pk__in=[x.pk for x in letters]).order_by("pk")] == [
        "parked",
        "archived",
    ]


def test_a_canary_that_comes_back_stops_the_operation_before_its_wait_is_over(channel, queue_name, operator):
    """A 60 s canary whose messages die again at once is judged at the next look (seconds), not after 60 s."""
    orders = queue_name("orders")
    dead_letters_on_broker(channel, orders, 4)
    operation = start_canary_retry(orders, operator, wait=60)
    waits: list[float] = []

    run_operation(operation_id=operation.pk, continue_later=waits.append)

    assert waits and waits[-1] <= 2  # comes back to look in seconds
    canary_dies_again(channel, orders)
    run_operation(operation_id=operation.pk, continue_later=waits.append)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED
    assert operation.pause_reason == "canary of 2: 2 came back to a dead-letter queue within 60s (2 rejected)"
    assert operation.canary_until is not None and operation.canary_until > timezone.now() + dt.timedelta(seconds=30)
    assert operation.items.filter(status=ItemStatus.PENDING).count() == 2
