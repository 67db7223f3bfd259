"""Shed in real Celery workers: the operation task runs it, and a worker killed in the middle of one leaves it
resumable, with every message shed once or left in the queue once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.deadletters.models import DeadLetter, FailureReason
from dlqconsole.operations.models import ItemStatus, OperationItem, OperationStatus
from dlqconsole.operations.services import start_operation
from dlqconsole.operations.shed import plan_shed
from dlqconsole.operations.upkeep import requeue_stale_operations
from tests.operations.test_worker import wait_until_no_other_sessions
from tests.support import drain, wait_for, wait_for_depth

pytestmark = pytest.mark.django_db(transaction=True)


def fill(channel: Channel, queue: str, count: int) -> dict[bytes, int]:
    channel.queue_declare(queue=queue, durable=True, arguments={"x-max-priority": 10})
    published = {}
    for number in range(count):
        body = f"order {number}".encode()
        published[body] = number % 10
        channel.basic_publish("", queue, body, pika.BasicProperties(priority=number % 10, delivery_mode=2))
    assert wait_for_depth(channel, queue, count, timeout=60) == count
    return published


def shed_bodies(queue: str) -> list[bytes]:
    rows = DeadLetter.objects.filter(source_queue=queue, failure_reason=FailureReason.SHED)
    return [bytes(body) for body in rows.values_list("body", flat=True)]


def test_a_worker_runs_a_shed_started_on_commit(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, celery_worker: Any
) -> None:
    queue = queue_name("orders")
    published = fill(channel, queue, 200)
    celery_worker().wait_until_ready()
    operation = plan_shed(queue=queue, actor=admin_user, priority_below=3)

    start_operation(operation=operation, actor=admin_user)

    operation = wait_for(operation, OperationStatus.DONE, timeout=60)
    assert sorted(shed_bodies(queue)) == sorted(body for body, priority in published.items() if priority < 3)
    assert operation.succeeded == 60 and operation.skipped == 140
    assert len(drain(channel, queue)) == 140


@pytest.mark.slow
def test_a_worker_killed_during_a_shed_resumes_and_sheds_each_message_once(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, celery_worker: Any, settings: Any
) -> None:
    settings.DLQ_OPERATION_STALE_SECONDS = 3
    queue = queue_name("orders")
    published = fill(channel, queue, 20_000)
    worker = celery_worker(DLQ_OPERATION_STALE_SECONDS="3", DLQ_SHED_HOLD="20000")
    worker.wait_until_ready()
    # 10,000 messages of priorities 5 to 9 come first: the workers hold them all while they reach the rest.
    operation = plan_shed(queue=queue, actor=admin_user, priority_below=5, rate="4000/1s")
    start_operation(operation=operation, actor=admin_user)

    deadline = time.monotonic() + 60
    while operation.succeeded < 3000 and time.monotonic() < deadline:
        time.sleep(0.01)
        operation.refresh_from_db()
    assert operation.status == OperationStatus.RUNNING and 3000 <= operation.succeeded < 10_000
    worker.kill()  # SIGKILL: its held messages go back to the queue, and so do those stored but not yet acked
    assert wait_until_no_other_sessions(timeout=30)
    in_flight = OperationItem.objects.filter(operation=operation, status=ItemStatus.IN_FLIGHT).count()

    celery_worker(DLQ_OPERATION_STALE_SECONDS="3", DLQ_SHED_HOLD="20000").wait_until_ready()
    deadline = time.monotonic() + 120
    while operation.status != OperationStatus.DONE and time.monotonic() < deadline:
        requeue_stale_operations()  # what beat's sweeper does every few seconds
        time.sleep(1)
        operation.refresh_from_db()

    assert operation.status == OperationStatus.DONE
    shed = shed_bodies(queue)
    left = [body for _, body in drain(channel, queue)]
    # None lost, none twice: each message is a dead letter once or still in the queue once.
    assert len(shed) == len(set(shed)) and len(left) == len(set(left))
    assert set(shed).isdisjoint(left) and set(shed) | set(left) == set(published)
    assert sorted(shed) == sorted(body for body, priority in published.items() if priority < 5)
    # The redelivered ones among those stored but not known acked were recognised, not stored again (the others'
    # acks had reached the broker before the kill).
    assert operation.duplicates <= in_flight
    assert not OperationItem.objects.filter(operation=operation, status=ItemStatus.IN_FLIGHT).exists()
