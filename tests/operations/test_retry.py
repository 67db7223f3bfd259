from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pika
import pytest
from django.conf import settings

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount
from dlqconsole.operations.models import ItemStatus, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import run_operation, start_operation
from tests.alerts.conftest import settle
from tests.support import declare_with_dlq, drain, ingest_from, kill_on_broker, wait_for_depth

pytestmark = pytest.mark.django_db


def counts(queue: str) -> dict[str, int]:
    return {cell.status: cell.count for cell in DeadLetterCount.objects.filter(source_queue=queue) if cell.count}


def test_retried_message_arrives_in_its_queue_unchanged_without_death_headers(
    channel, queue_name, operator, django_capture_on_commit_callbacks
):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    original = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
        priority=3,
        correlation_id="corr-7",
        reply_to="replies",
        message_id="order-42",
        timestamp=1_790_000_000,
        type="order.created",
        app_id="shop",
        headers={
            "x-exception-message": "Request timed out after 3000ms",
            "tenant": "acme",
            "attempt": 2,
            "ratio": Decimal("1.50"),
            "raw": b"\x00\xffbinary",
            "when": dt.datetime(2026, 11, 20, 10, 0, 5, tzinfo=dt.UTC),
            "nested": {"list": [1, "two", None, True]},
        },
    )
    body = b'{"order": 42, "bytes": "\xc3\xa9"}\x00\xff'
    channel.basic_publish(exchange="", routing_key=orders, body=body, properties=original)
    kill_on_broker(channel, orders, 1)
    wait_for_depth(channel, orders + ".dlq", 1)
    (letter,) = ingest_from(channel, orders + ".dlq")
    assert letter.original_queue == orders

    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders + ".dlq"]}, actor=operator)
    with django_capture_on_commit_callbacks() as callbacks:
        start_operation(operation=operation, actor=operator)
    assert len(callbacks) == 1  # the run was handed to a worker after the commit
    run_operation(operation_id=operation.pk)

    assert wait_for_depth(channel, orders, 1) == 1
    ((properties, received),) = drain(channel, orders)
    assert received == body
    for name in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "message_id",
        "timestamp",
        "type",
        "app_id",
    ):
        assert getattr(properties, name) == getattr(original, name), name
    expected_headers = dict(original.headers)
    expected_headers[settings.DLQ_REPLAY_COUNT_HEADER] = 1
    expected_headers[settings.DLQ_REPLAYED_FROM_HEADER] = letter.pk
    assert properties.headers == expected_headers
    assert not [name for name in properties.headers if name.startswith("x-") and "death" in name]
    assert "x-delivery-count" not in properties.headers

    operation.refresh_from_db()
    letter.refresh_from_db()
    assert (operation.status, operation.total, operation.succeeded, operation.failed) == ("done", 1, 1, 0)
    assert letter.status == "replayed" and letter.replay_count == 1
    item = operation.items.get()
    assert item.status == ItemStatus.PUBLISHED and item.published_at is not None
    assert counts(orders + ".dlq") == {"replayed": 1}
    assert AuditEntry.objects.filter(action="operation.retry.start", count=1, actor=operator).exists()


def test_plan_freezes_the_matching_dead_letters_and_later_arrivals_are_not_swept_in(channel, queue_name, operator):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    for n in range(3):
        channel.basic_publish(exchange="", routing_key=orders, body=f"early {n}".encode())
    kill_on_broker(channel, orders, 3)
    wait_for_depth(channel, orders + ".dlq", 3)
    ingest_from(channel, orders + ".dlq")

    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    channel.basic_publish(exchange="", routing_key=orders, body=b"late")
    kill_on_broker(channel, orders, 1)
    wait_for_depth(channel, orders + ".dlq", 1)
    (late,) = ingest_from(channel, orders + ".dlq")
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    late.refresh_from_db()
    operation.refresh_from_db()
    assert (operation.total, operation.succeeded) == (3, 3)
    assert late.status == "parked"
    assert sorted(body for _, body in drain(channel, orders)) == [b"early 0", b"early 1", b"early 2"]
    assert operation.breakdown["queue"] == {orders + ".dlq": 3}
    assert operation.breakdown["destination"] == {f"queue {orders}": 3}


def test_moving_to_a_missing_queue_marks_the_messages_failed_and_loses_none(channel, queue_name, operator):
    orders = queue_name("orders")
    missing = queue_name("nowhere")
    declare_with_dlq(channel, orders)
    for n in range(5):
        channel.basic_publish(exchange="", routing_key=orders, body=f"m{n}".encode())
    kill_on_broker(channel, orders, 5)
    wait_for_depth(channel, orders + ".dlq", 5)
    letters = ingest_from(channel, orders + ".dlq")

    operation = plan_operation(
        kind=OperationKind.MOVE, filter={"queue": [orders]}, actor=operator, target_queue=missing
    )
    assert operation.unreplayable == 5
    assert operation.unreplayable_reasons == {f"queue {missing!r} does not exist": 5}
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.failed) == (OperationStatus.DONE, 0, 5)
    for letter in letters:
        letter.refresh_from_db()
        assert letter.status == "failed"
        assert bytes(letter.body).startswith(b"m")
    errors = set(operation.items.values_list("error", flat=True))
    assert len(errors) == 1 and "NO_ROUTE" in errors.pop()
    assert counts(orders + ".dlq") == {"failed": 5}
    assert DeadLetter.objects.filter(source_queue=orders + ".dlq").count() == 5


def test_an_already_replayed_dead_letter_whose_move_fails_stays_replayed(channel, queue_name, operator):
    # As "failed" it would wait again, and a retry policy could deliver a message that was delivered already.
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    for n in range(2):
        channel.basic_publish(exchange="", routing_key=orders, body=f"m{n}".encode())
    kill_on_broker(channel, orders, 2)
    wait_for_depth(channel, orders + ".dlq", 2)
    letters = ingest_from(channel, orders + ".dlq")
    settle(letters, status="replayed")  # as a finished retry leaves them, counters included

    operation = plan_operation(
        kind=OperationKind.MOVE,
        filter={"queue": [orders], "status": ["replayed"]},
        actor=operator,
        target_queue=queue_name("nowhere"),
    )
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.succeeded, operation.failed) == (0, 2)
    assert set(operation.items.values_list("status", flat=True)) == {ItemStatus.FAILED}
    statuses = DeadLetter.objects.filter(pk__in=[letter.pk for letter in letters]).values_list("status", flat=True)
    assert set(statuses) == {"replayed"}
    assert counts(orders + ".dlq") == {"replayed": 2}


def test_retry_to_a_missing_exchange_fails_without_publishing(channel, queue_name, operator):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    channel.exchange_declare(exchange=orders + ".shop", exchange_type="direct")
    channel.queue_bind(queue=orders, exchange=orders + ".shop", routing_key="created")
    channel.basic_publish(exchange=orders + ".shop", routing_key="created", body=b"x")
    kill_on_broker(channel, orders, 1)
    wait_for_depth(channel, orders + ".dlq", 1)
    (letter,) = ingest_from(channel, orders + ".dlq")
    assert letter.original_exchange == orders + ".shop"
    channel.exchange_delete(exchange=orders + ".shop")

    operation = plan_operation(kind=OperationKind.RETRY, filter={"ids": [letter.pk]}, actor=operator)
    assert operation.unreplayable_reasons == {f"exchange {orders + '.shop'!r} does not exist": 1}
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    letter.refresh_from_db()
    operation.refresh_from_db()
    assert (operation.failed, letter.status) == (1, "failed")
    assert "does not exist" in operation.items.get().error
