"""Shed: low-priority messages taken out of a live classic queue into archived dead letters (reason SHED), the rest
given back, every message consumed or shed exactly once; restore and retry put the shed ones back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.brokers import registry
from dlqconsole.core.amqp import connect
from dlqconsole.core.breaker import get_breakers
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailureReason
from dlqconsole.ingest.models import WatchedQueue
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import OperationError, change_rate, run_operation, start_operation
from dlqconsole.operations.shed import plan_shed
from dlqconsole.operations.shed_queue import storage
from dlqconsole.operations.shedding import ShedRun
from tests.support import declare_with_dlq, drain, ingest_from, kill_on_broker, wait_for_depth, wait_until

pytestmark = pytest.mark.django_db
OLD = 1_000_000_000  # 2001
NEW = 4_000_000_000  # 2096


def publish(channel: Channel, queue: str, body: bytes, **properties: Any) -> None:
    channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, **properties))


def priority_queue(channel: Channel, queue_name: Callable[[str], str], base: str = "work") -> str:
    queue = queue_name(base)
    channel.queue_declare(queue=queue, durable=True, arguments={"x-max-priority": 10})
    return queue


def shed_now(queue: str, actor: User, **options: Any) -> Operation:
    """Plan, start and run a shed in this process."""
    operation = plan_shed(queue=queue, actor=actor, **options)
    start_operation(operation=operation, actor=actor)
    run_operation(operation_id=operation.pk)
    operation.refresh_from_db()
    return operation


def shed_bodies(queue: str) -> list[bytes]:
    return [
        bytes(body)
        for body in DeadLetter.objects.filter(source_queue=queue, failure_reason=FailureReason.SHED).values_list(
            "body", flat=True
        )
    ]


class Consumer(threading.Thread):
    """An application's consumer: takes one message at a time, records it and acks it, until told to stop."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.bodies: list[bytes] = []
        self.stopping = threading.Event()
        self.attached = threading.Event()

    def run(self) -> None:
        connection = connect(settings.AMQP_URL)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        for method, _, body in channel.consume(self.queue, inactivity_timeout=0.05):
            self.attached.set()
            if self.stopping.is_set():
                break
            if method is not None:
                self.bodies.append(bytes(body))
                channel.basic_ack(method.delivery_tag)
        channel.cancel()
        connection.close()


@pytest.fixture
def consumer() -> Iterator[Callable[[str], Consumer]]:
    started: list[Consumer] = []

    def start(queue: str) -> Consumer:
        worker = Consumer(queue)
        worker.start()
        assert worker.attached.wait(10)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stopping.set()
        worker.join(10)


def test_shed_of_a_flooded_priority_queue_with_a_consumer_takes_each_low_message_once_and_retry_puts_them_back(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, consumer: Callable[[str], Consumer]
) -> None:
    queue = priority_queue(channel, queue_name)
    published: dict[bytes, int] = {}
    for number in range(10_000):
        priority = number % 10
        body = f"order {number} at priority {priority}".encode()
        publish(channel, queue, body, priority=priority, timestamp=OLD + number, headers={"number": number})
        published[body] = priority
    assert wait_for_depth(channel, queue, 10_000) == 10_000
    app = consumer(queue)

    operation = shed_now(queue, admin_user, priority_below=5)

    shed = shed_bodies(queue)
    assert operation.status == OperationStatus.DONE and operation.succeeded == len(shed) > 0
    assert all(published[body] < 5 for body in shed)
    assert len(set(shed)) == len(shed)
    assert wait_until(lambda: len(app.bodies) + len(shed) >= 10_000, timeout=120)
    app.stopping.set()
    app.join(10)
    # Every message was either consumed or shed, exactly once: none lost, none twice.
    assert len(app.bodies) == len(set(app.bodies))
    assert set(app.bodies).isdisjoint(shed)
    assert set(app.bodies) | set(shed) == set(published)
    assert len(app.bodies) + len(shed) == 10_000
    assert operation.shed_plan["type"] == "classic" and operation.shed_plan["max_priority"] == 10
    assert operation.shed_plan["stopped"]
    letters = DeadLetter.objects.filter(source_queue=queue)
    assert set(letters.values_list("status", "original_queue", "failure_reason")) == {
        (DeadLetterStatus.ARCHIVED, queue, FailureReason.SHED)
    }
    assert not OperationItem.objects.filter(operation=operation).exclude(status=ItemStatus.DONE).exists()

    restore = plan_operation(kind="restore", filter={"queue": [queue], "reason": ["SHED"]}, actor=admin_user)
    start_operation(operation=restore, actor=admin_user)
    run_operation(operation_id=restore.pk)
    retry = plan_operation(kind="retry", filter={"queue": [queue], "reason": ["SHED"]}, actor=admin_user)
    assert retry.total == len(shed) and not retry.unreplayable
    start_operation(operation=retry, actor=admin_user)
    run_operation(operation_id=retry.pk)

    assert wait_for_depth(channel, queue, len(shed)) == len(shed)
    back = drain(channel, queue)
    assert sorted(body for _, body in back) == sorted(shed)
    for properties, body in back:
        number = int(body.split()[1])
        assert properties.priority == published[body] and properties.timestamp == OLD + number
        assert properties.delivery_mode == 2 and properties.headers["number"] == number
        assert properties.headers[settings.DLQ_REPLAY_COUNT_HEADER] == 1


def test_the_scan_holds_the_high_priorities_in_front_and_reaches_the_low_ones_behind(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, settings: Any
) -> None:
    queue = priority_queue(channel, queue_name)
    for number in range(30):
        publish(channel, queue, f"high {number}".encode(), priority=9)
    for number in range(5):
        publish(channel, queue, f"low {number}".encode(), priority=1)
    wait_for_depth(channel, queue, 35)

    operation = shed_now(queue, admin_user, priority_below=5)

    assert sorted(shed_bodies(queue)) == sorted(f"low {number}".encode() for number in range(5))
    assert (operation.succeeded, operation.skipped) == (5, 30)
    assert operation.shed_plan["stopped"].startswith("looked at 35 messages")
    left = drain(channel, queue)
    assert sorted(body for _, body in left) == sorted(f"high {number}".encode() for number in range(30))


def test_a_full_hold_stops_the_scan_and_says_why(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, settings: Any
) -> None:
    settings.DLQ_SHED_HOLD = 10
    queue = priority_queue(channel, queue_name)
    for number in range(20):
        publish(channel, queue, f"high {number}".encode(), priority=9)
    publish(channel, queue, b"low", priority=0)
    wait_for_depth(channel, queue, 21)

    operation = shed_now(queue, admin_user, priority_below=5)

    assert operation.status == OperationStatus.DONE and operation.succeeded == 0
    assert "DLQ_SHED_HOLD" in operation.shed_plan["stopped"]
    assert wait_for_depth(channel, queue, 21) == 21


def test_older_than_reads_the_timestamp_and_a_message_without_one_is_never_older(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    queue = priority_queue(channel, queue_name)
    publish(channel, queue, b"old", priority=0, timestamp=OLD)
    publish(channel, queue, b"new", priority=0, timestamp=NEW)
    publish(channel, queue, b"no timestamp", priority=0)
    publish(channel, queue, b"old but important", priority=8, timestamp=OLD)
    wait_for_depth(channel, queue, 4)

    operation = shed_now(queue, admin_user, priority_below=5, older_than=3600)

    assert shed_bodies(queue) == [b"old"]
    assert operation.shed_plan["older_than_text"] == "1h"
    assert sorted(body for _, body in drain(channel, queue)) == [b"new", b"no timestamp", b"old but important"]


def test_a_message_too_big_to_keep_whole_stays_in_the_queue(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, settings: Any
) -> None:
    settings.DLQ_MAX_BODY_BYTES = 64
    queue = priority_queue(channel, queue_name)
    publish(channel, queue, b"small", priority=0)
    publish(channel, queue, b"x" * 100, priority=0)
    wait_for_depth(channel, queue, 2)

    operation = shed_now(queue, admin_user, priority_below=5)

    assert shed_bodies(queue) == [b"small"]
    assert (operation.succeeded, operation.skipped, operation.shed_plan["too_big"]) == (1, 1, 1)
    assert [body for _, body in drain(channel, queue)] == [b"x" * 100]


def test_a_rate_paces_the_shed_and_can_be_changed(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    queue = priority_queue(channel, queue_name)
    for number in range(3):
        publish(channel, queue, f"low {number}".encode(), priority=0)
    wait_for_depth(channel, queue, 3)
    operation = plan_shed(queue=queue, actor=admin_user, priority_below=5, rate="1000/1s")
    assert operation.rate == "1000/1s"
    change_rate(operation=operation, rate="2000/1s", actor=admin_user)
    start_operation(operation=operation, actor=admin_user)

    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.rate) == (OperationStatus.DONE, 3, "2000/1s")


def test_a_steady_rate_stores_in_batches_not_one_message_at_a_time(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pacer reserves the tokens due shortly at once: between two messages of a steady rate the scan neither
    asks the limiter nor stores a batch of one (which cost a commit, acks and a round trip per message and held a
    shed far below its rate)."""
    queue = priority_queue(channel, queue_name)
    for number in range(300):
        publish(channel, queue, f"low {number}".encode(), priority=0)
    wait_for_depth(channel, queue, 300)
    stores: list[int] = []
    real_store = ShedRun._store_pending

    def counted(self: ShedRun, broker: Any, note: str) -> None:
        if self.pending:
            stores.append(len(self.pending))
        real_store(self, broker, note)

    monkeypatch.setattr(ShedRun, "_store_pending", counted)
    operation = plan_shed(queue=queue, actor=admin_user, priority_below=5, rate="1000/1s")
    start_operation(operation=operation, actor=admin_user)

    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == (OperationStatus.DONE, 300)
    assert sum(stores) == 300
    assert len(stores) <= 10, stores


def test_limit_caps_how_many_are_shed(channel: Channel, queue_name: Callable[[str], str], admin_user: User) -> None:
    queue = priority_queue(channel, queue_name)
    for number in range(10):
        publish(channel, queue, f"low {number}".encode(), priority=0)
    wait_for_depth(channel, queue, 10)

    operation = shed_now(queue, admin_user, priority_below=5, limit=3)

    assert len(shed_bodies(queue)) == 3 and operation.succeeded == 3
    assert operation.shed_plan["stopped"] == "shed 3, its limit"
    assert len(drain(channel, queue)) == 7


def test_a_message_stored_before_a_crash_comes_back_once_and_an_identical_one_is_kept(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    queue = priority_queue(channel, queue_name)
    for body in (b"same", b"same", b"other"):
        publish(channel, queue, body, priority=0, headers={"kind": "twin"})
    wait_for_depth(channel, queue, 3)
    operation = plan_shed(queue=queue, actor=admin_user, priority_below=5)
    start_operation(operation=operation, actor=admin_user)
    # A worker took one "same", committed it and died before its ack reached the broker.
    crashed = connect(settings.AMQP_URL)
    crashed_channel = crashed.channel()
    method, properties, body = crashed_channel.basic_get(queue, auto_ack=False)
    assert body == b"same"
    lent = storage()
    letter = lent.parse(
        queue=queue, broker=registry.default_broker(), body=body, properties=properties, note="shed", now=timezone.now()
    )
    [stored] = lent.store([letter], now=timezone.now())
    OperationItem.objects.create(operation=operation, dead_letter_id=stored, status=ItemStatus.IN_FLIGHT)
    crashed.close()

    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert sorted(shed_bodies(queue)) == [b"other", b"same", b"same"]
    assert operation.duplicates == 1
    assert not OperationItem.objects.filter(operation=operation, status=ItemStatus.IN_FLIGHT).exists()
    assert drain(channel, queue) == []


def test_quorum_queues_and_streams_are_refused_with_the_reason(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    quorum, stream = queue_name("quorum"), queue_name("stream")
    channel.queue_declare(queue=quorum, durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_declare(queue=stream, durable=True, arguments={"x-queue-type": "stream"})
    publish(channel, quorum, b"x")

    with pytest.raises(OperationError, match="quorum queue.*delivery limit"):
        plan_shed(queue=quorum, actor=admin_user, priority_below=5)
    with pytest.raises(OperationError, match="it is a stream"):
        plan_shed(queue=stream, actor=admin_user, priority_below=5)
    assert not Operation.objects.exists()


def test_the_consoles_own_queues_the_dlqs_it_drains_and_missing_queues_are_refused(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, settings: Any
) -> None:
    drained, listed = queue_name("drained.dlq"), queue_name("listed.dlq")
    for queue in (drained, listed):
        channel.queue_declare(queue=queue, durable=True)
        publish(channel, queue, b"dead")
    WatchedQueue.objects.create(name=queue_name("work"), dead_letter_queue=drained, dead_letter_exchange="x")
    settings.DLQ_QUEUES = [listed]

    with pytest.raises(OperationError, match="one of the console's own Celery queues"):
        plan_shed(queue=settings.CELERY_TASK_DEFAULT_QUEUE, actor=admin_user, priority_below=5)
    for queue in (drained, listed):
        with pytest.raises(OperationError, match="dead-letter queue the console drains"):
            plan_shed(queue=queue, actor=admin_user, priority_below=5)
    with pytest.raises(OperationError, match="does not exist"):
        plan_shed(queue=queue_name("missing"), actor=admin_user, priority_below=5)
    assert not Operation.objects.exists()


def test_an_operator_cannot_plan_a_shed(channel: Channel, queue_name: Callable[[str], str], operator: User) -> None:
    queue = priority_queue(channel, queue_name)
    publish(channel, queue, b"x")

    with pytest.raises(PermissionDenied, match="admin"):
        plan_shed(queue=queue, actor=operator, priority_below=5)
    assert not Operation.objects.exists()


def test_plan_and_start_leave_audit_rows(channel: Channel, queue_name: Callable[[str], str], admin_user: User) -> None:
    queue = priority_queue(channel, queue_name)
    publish(channel, queue, b"low", priority=1)
    wait_for_depth(channel, queue, 1)

    operation = shed_now(queue, admin_user, priority_below=5)

    actions = list(
        AuditEntry.objects.filter(target=f"operation:{operation.pk}").order_by("pk").values_list("action", flat=True)
    )
    assert actions == ["operation.shed.plan", "operation.shed.start", "operation.shed.done"]
    assert operation.kind == OperationKind.SHED and operation.total == 1


def test_shedding_messages_the_console_replayed_links_to_no_previous_letter_and_reports_no_boomerang(
    channel: Channel,
    queue_name: Callable[[str], str],
    admin_user: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    queue = queue_name("work")
    declare_with_dlq(channel, queue)
    for number in range(25):
        publish(channel, queue, f"m{number}".encode(), message_id=f"m{number}", priority=0)
    kill_on_broker(channel, queue, 25)
    ingest_from(channel, f"{queue}.dlq", expect=25)
    retry = plan_operation(kind=OperationKind.RETRY, filter={"queue": [f"{queue}.dlq"]}, actor=admin_user)
    start_operation(operation=retry, actor=admin_user)
    run_operation(operation_id=retry.pk)
    assert wait_for_depth(channel, queue, 25) == 25

    with django_capture_on_commit_callbacks(execute=True):
        operation = shed_now(queue, admin_user, priority_below=5)

    assert operation.succeeded == 25
    shed = DeadLetter.objects.filter(source_queue=queue, failure_reason=FailureReason.SHED)
    assert shed.count() == 25 and not shed.exclude(previous=None).exists()
    # The header stays among what was stored: the message is kept as it came.
    header = settings.DLQ_REPLAYED_FROM_HEADER.lower()
    assert all(header in {name.lower() for name in headers} for headers in shed.values_list("headers", flat=True))
    state = get_breakers().peek(f"queue:{queue}")
    assert state.state == "closed" and "1" not in state.outcomes


def test_a_queue_declared_again_as_quorum_after_the_plan_pauses_the_run_and_takes_nothing(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    queue = priority_queue(channel, queue_name)
    for number in range(10):
        publish(channel, queue, f"m{number}".encode(), priority=9 if number % 2 else 0)
    wait_for_depth(channel, queue, 10)
    operation = plan_shed(queue=queue, actor=admin_user, priority_below=5)
    channel.queue_delete(queue)
    channel.queue_declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 0})
    for number in range(10):
        publish(channel, queue, f"m{number}".encode(), priority=9 if number % 2 else 0)
    wait_for_depth(channel, queue, 10)

    start_operation(operation=operation, actor=admin_user)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED and "quorum queue" in operation.pause_reason
    assert AuditEntry.objects.filter(
        action="operation.pause", target=f"operation:{operation.pk}", detail__contains="quorum queue"
    ).exists()
    assert operation.succeeded == 0 and not DeadLetter.objects.exists()
    assert sorted(body for _, body in drain(channel, queue)) == sorted(f"m{number}".encode() for number in range(10))


def test_a_delivery_only_a_quorum_queue_or_a_stream_would_carry_stops_the_scan_and_gives_back_what_it_holds(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    queue = priority_queue(channel, queue_name)
    publish(channel, queue, b"first", priority=0)
    publish(channel, queue, b"counted", priority=0, headers={"x-delivery-count": 1})
    publish(channel, queue, b"last", priority=0)
    wait_for_depth(channel, queue, 3)

    operation = shed_now(queue, admin_user, priority_below=5)

    assert operation.status == OperationStatus.PAUSED and "x-delivery-count" in operation.pause_reason
    assert shed_bodies(queue) == [b"first"]
    assert sorted(body for _, body in drain(channel, queue)) == [b"counted", b"last"]


def test_the_dlqs_the_console_drains_are_refused_through_any_broker_entry_on_their_vhost(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User, settings: Any
) -> None:
    drained, listed = queue_name("drained.dlq"), queue_name("listed.dlq")
    for queue in (drained, listed):
        channel.queue_declare(queue=queue, durable=True)
        publish(channel, queue, b"dead")
    WatchedQueue.objects.create(name=queue_name("work"), dead_letter_queue=drained, dead_letter_exchange="x")
    settings.DLQ_QUEUES = [listed]
    # A second entry for the default broker's vhost (another host name for the same RabbitMQ).
    settings.DLQ_BROKERS = {"alias": settings.AMQP_URL.replace("127.0.0.1", "localhost")}
    registry.forget()

    for queue in (drained, listed):
        with pytest.raises(OperationError, match="on broker alias: .*dead-letter queue the console drains"):
            plan_shed(queue=queue, actor=admin_user, priority_below=5, broker="alias")
    assert not Operation.objects.exists()
