"""Operations across brokers run as in production, threaded and pipelined: in a real Celery worker (which reads the
same DLQ_BROKERS), or in this process outside a transaction. Each replayed message lands once on the broker its dead
letter came from, and a broker that refuses holds back only its own messages."""

from __future__ import annotations

from typing import Any

import pytest
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.operations.models import OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import resume_operation, run_operation, start_operation
from tests.factories import EnvelopeFactory, store
from tests.operations.conftest import SecondBroker, TwoBrokers
from tests.support import declare_with_dlq, drain, wait_for, wait_for_depth

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_retries_one_brokers_pattern_back_into_that_brokers_queue_only(
    channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers, operator: Any, celery_worker: Any
) -> None:
    worker = celery_worker(DLQ_BROKERS=f"staging={staging.url}")
    worker.wait_until_ready()
    operation = plan_operation(
        kind=OperationKind.RETRY,
        filter={"pattern": [two_brokers.pattern_id], "broker": ["staging"]},
        actor=operator,
    )
    start_operation(operation=operation, actor=operator)  # enqueued on commit, run by the worker

    wait_for(operation, OperationStatus.DONE, timeout=30)
    orders = two_brokers.orders
    assert wait_for_depth(staging.channel, orders, 3) == 3
    assert sorted(body for _, body in drain(staging.channel, orders)) == [b"staging 0", b"staging 1", b"staging 2"]
    assert channel.queue_declare(queue=orders, passive=True).method.message_count == 0


def mixed(orders: str, staging: SecondBroker, count: int) -> None:
    """`count` dead letters of `orders`, every other one on staging (body "1 n"; default's "0 n"), interleaved by id
    so that every batch of the pipeline goes out through both brokers' publishers."""
    letters = []
    for n in range(count):
        letter = EnvelopeFactory.build(
            queue=orders, exchange="", routing_key=orders, body=f"{n % 2} {n}".encode(), message_id=f"m-{n}"
        )
        letter.broker_id = staging.row.pk if n % 2 else None
        letters.append(letter)
    store(*letters)


def test_a_worker_replays_a_set_mixing_two_brokers_each_message_once_to_its_own(
    channel: Channel, staging: SecondBroker, queue_name: Any, operator: Any, celery_worker: Any
) -> None:
    orders = queue_name("orders")
    for on in (channel, staging.channel):
        declare_with_dlq(on, orders)
    mixed(orders, staging, 1200)
    worker = celery_worker(DLQ_BROKERS=f"staging={staging.url}")
    worker.wait_until_ready()
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders + ".dlq"]}, actor=operator)
    assert operation.broker_span == "This retry spans 2 brokers: default 600, staging 600"
    start_operation(operation=operation, actor=operator)

    wait_for(operation, OperationStatus.DONE, timeout=60)
    assert (operation.succeeded, operation.failed, operation.duplicates) == (1200, 0, 0)
    assert wait_for_depth(channel, orders, 600) == 600
    assert wait_for_depth(staging.channel, orders, 600) == 600
    on_default = sorted(body for _, body in drain(channel, orders))
    on_staging = sorted(body for _, body in drain(staging.channel, orders))
    assert on_default == sorted(f"0 {n}".encode() for n in range(0, 1200, 2))
    assert on_staging == sorted(f"1 {n}".encode() for n in range(1, 1200, 2))


def test_a_pipelined_run_holds_back_a_refusing_brokers_messages_and_sends_them_once_it_is_back(
    channel: Channel, staging: SecondBroker, queue_name: Any, operator: Any, settings: Any
) -> None:
    settings.DLQ_OPERATION_CHUNK_SIZE = 300  # batches of 100: several rounds of the pipeline
    orders = queue_name("orders")
    for on in (channel, staging.channel):
        declare_with_dlq(on, orders)
    mixed(orders, staging, 1000)
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders + ".dlq"]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    staging.revoke()

    run_operation(operation_id=operation.pk)  # threaded: no transaction around this test

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED
    assert operation.pause_reason.startswith("cannot publish: broker staging: ")
    assert "500 messages wait" in operation.pause_reason
    assert (operation.succeeded, operation.failed, operation.in_flight) == (500, 0, 0)
    assert wait_for_depth(channel, orders, 500) == 500
    assert set(operation.items.filter(status="pending").values_list("dead_letter__broker__name", flat=True)) == {
        "staging"
    }

    staging.grant()
    resume_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.failed, operation.duplicates) == (
        OperationStatus.DONE,
        1000,
        0,
        0,
    )
    assert wait_for_depth(staging.channel, orders, 500) == 500
    assert sorted(body for _, body in drain(channel, orders)) == sorted(f"0 {n}".encode() for n in range(0, 1000, 2))
    assert sorted(body for _, body in drain(staging.channel, orders)) == sorted(
        f"1 {n}".encode() for n in range(1, 1000, 2)
    )
