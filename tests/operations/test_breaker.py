"""Operations and the circuit breaker of their destinations, on the real broker and Redis (see
test_breaker_worker.py for the whole story with a real worker)."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import Any

import pika
import pytest
from django.conf import settings as django_settings
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.core.breaker import (
    CLOSED,
    NACK,
    OPEN,
    BreakerConfig,
    Event,
    RedisBreakers,
    destination_key,
    get_breakers,
)
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.ingest import boomerangs
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.services import ingest_batch
from dlqconsole.operations import run_state
from dlqconsole.operations.breakers import describe_key
from dlqconsole.operations.destinations import Destination, retry_destination
from dlqconsole.operations.models import ItemStatus, Operation, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import close_breaker, run_operation, start_operation
from dlqconsole.operations.upkeep import requeue_stale_operations
from tests.factories import parked
from tests.support import declare_with_dlq, drain, ingest_from, kill_on_broker, wait_for_depth

pytestmark = pytest.mark.django_db


def dead_letters(channel: Any, queue: str, count: int) -> list[DeadLetter]:
    declare_with_dlq(channel, queue)
    for number in range(count):
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=f"job {number}".encode(),
            properties=pika.BasicProperties(message_id=f"{queue}-{number}"),
        )
    kill_on_broker(channel, queue, count)
    assert wait_for_depth(channel, queue + ".dlq", count) == count
    return ingest_from(channel, queue + ".dlq")


def refusing_queue(channel: Any, name: str) -> str:
    """A queue the broker refuses every publish to (basic.nack): full at length 0, rejecting publishes."""
    channel.queue_declare(queue=name, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    return name


def open_breaker(key: str) -> None:
    get_breakers().record(key, [Event(NACK, reason="refused")] * 50, config=BreakerConfig.from_settings())
    assert get_breakers().peek(key).state == OPEN


def delivered(channel: Any, queue: str) -> Counter[str]:
    return Counter(str(properties.message_id) for properties, _ in drain(channel, queue))


def test_refusals_open_the_breaker_and_the_operation_waits_without_holding_its_worker(
    channel, queue_name, operator, admin_user, settings, django_capture_on_commit_callbacks
):
    settings.DLQ_BREAKER_FAILURES = 3
    settings.DLQ_OPERATION_CHUNK_SIZE = 2
    orders = queue_name("orders")
    letters = dead_letters(channel, orders, 10)
    full = refusing_queue(channel, queue_name("full"))
    operation = plan_operation(kind=OperationKind.MOVE, filter={"queue": [orders]}, actor=operator, target_queue=full)
    start_operation(operation=operation, actor=operator)
    waits: list[float] = []

    assert run_operation(operation_id=operation.pk, continue_later=waits.append)

    # It stopped: its task comes back when the breaker probes, a cool-down from now; the worker is free.
    operation.refresh_from_db()
    assert operation.status == OperationStatus.RUNNING
    assert operation.runner == ""
    assert len(waits) == 1 and 55 < waits[0] <= 61
    assert re.fullmatch(rf"circuit open for queue {full}, probing at \d\d:\d\d:\d\d \w+", operation.breaker_wait)
    assert operation.breaker_wait_until is not None
    state = get_breakers().peek(f"queue:{full}")
    assert state.state == OPEN
    assert state.reason == "3 failures in a row; the last: the broker refused it (basic.nack)"
    # The refused ones failed (the breaker trips at 3; a batch or two already out may add some); the others wait.
    failed = operation.failed
    assert 3 <= failed < 10
    assert operation.items.filter(status=ItemStatus.PENDING).count() == 10 - failed

    # The queue is fixed and an operator closes the breaker: the waiting ones go, each once.
    channel.queue_delete(queue=full)
    channel.queue_declare(queue=full)
    with django_capture_on_commit_callbacks() as enqueued:
        close_breaker(key=f"queue:{full}", actor=admin_user)
    assert len(enqueued) == 1  # its run, at once
    assert AuditEntry.objects.filter(action="breaker.close", target=f"breaker:queue:{full}").exists()
    assert run_operation(operation_id=operation.pk, continue_later=waits.append)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.failed) == ("done", 10 - failed, failed)
    assert (operation.breaker_wait, operation.breaker_wait_until) == ("", None)
    assert wait_for_depth(channel, full, 10 - failed) == 10 - failed
    counts = delivered(channel, full)
    assert sum(counts.values()) == 10 - failed and set(counts.values()) == {1}
    moved = {letter.message_id for letter in letters} - {
        letter.message_id for letter in DeadLetter.objects.filter(pk__in=[item.pk for item in letters], status="failed")
    }
    assert set(counts) == moved


def test_other_destinations_keep_flowing_while_one_breaker_is_open(channel, queue_name, operator):
    orders, payments = queue_name("orders"), queue_name("payments")
    dead_letters(channel, orders, 4)
    dead_letters(channel, payments, 3)
    open_breaker(f"queue:{payments}")
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders, payments]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    waits: list[float] = []

    run_operation(operation_id=operation.pk, continue_later=waits.append)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.failed) == ("running", 4, 0)
    assert operation.breaker_wait.startswith(f"circuit open for queue {payments}, probing at ")
    assert len(waits) == 1
    assert wait_for_depth(channel, orders, 4) == 4
    assert wait_for_depth(channel, payments, 0) == 0
    assert operation.items.filter(status=ItemStatus.PENDING).count() == 3


def test_inline_a_run_waits_in_process_for_the_probe_and_goes_on(channel, queue_name, operator, settings):
    settings.DLQ_BREAKER_COOLDOWN_SECONDS = 1
    settings.DLQ_BREAKER_WATCH_SECONDS = 1
    settings.DLQ_BREAKER_PROBE_SIZE = 2
    orders = queue_name("orders")
    dead_letters(channel, orders, 6)
    open_breaker(f"queue:{orders}")
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    start_operation(operation=operation, actor=operator)

    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == ("done", 6)
    assert get_breakers().peek(f"queue:{orders}").state == CLOSED
    assert wait_for_depth(channel, orders, 6) == 6
    counts = delivered(channel, orders)
    assert len(counts) == 6 and set(counts.values()) == {1}


def test_a_waiting_operation_is_left_to_its_own_task(operator):
    now = timezone.now()
    operation = Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.RUNNING,
        created_by=operator,
        heartbeat_at=now - dt.timedelta(hours=1),
        breaker_wait="circuit open for queue orders, probing at 07:00:00 UTC",
        breaker_wait_until=now + dt.timedelta(seconds=30),
    )

    # Neither the sweeper nor a stray task takes it before its wait is over; the CLI's --inline may.
    assert requeue_stale_operations(now=now) == []
    assert run_operation(operation_id=operation.pk, continue_later=lambda seconds: None) is False
    assert requeue_stale_operations(now=now + dt.timedelta(seconds=31)) == [operation.pk]


def test_the_breaker_key_of_a_boomerang_is_that_of_its_replay():
    cases = [
        ("", ["orders"], "orders", "default"),
        ("orders.exchange", ["orders.created"], "orders", "default"),
        ("orders.exchange", ["orders.created"], "", "staging"),
        ("", [], "orders", "staging"),
    ]
    for exchange, keys, queue, broker in cases:
        destination = retry_destination(exchange=exchange, routing_keys=keys, queue=queue, broker=broker)
        assert destination is not None
        key = destination_key(
            exchange=exchange, routing_keys=keys, queue=queue, broker="" if broker == "default" else broker
        )
        assert key == destination.limit_key


def test_ingest_counts_boomerangs_against_the_breaker_of_their_destination(
    channel, queue_name, operator, settings, django_capture_on_commit_callbacks
):
    settings.DLQ_BREAKER_FAILURES = 3
    orders = queue_name("orders")
    letters = dead_letters(channel, orders, 4)
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)
    assert wait_for_depth(channel, orders, 4) == 4
    # One of them was replayed long ago (as far as the window goes): its return is not the destination's fault now.
    DeadLetter.objects.filter(pk=letters[0].pk).update(status_changed_at=timezone.now() - dt.timedelta(hours=1))
    state = get_breakers().peek(f"queue:{orders}")
    assert (state.state, state.recent) == (CLOSED, "0000")

    kill_on_broker(channel, orders, 4)
    assert wait_for_depth(channel, orders + ".dlq", 4) == 4
    with django_capture_on_commit_callbacks(execute=True):
        ingest_from(channel, orders + ".dlq")

    state = get_breakers().peek(f"queue:{orders}")
    assert state.state == OPEN
    assert state.reason == f"3 failures in a row; the last: a replay came back (rejected) from queue {orders}"


def test_ingest_goes_on_when_the_breakers_cannot_be_reached(
    channel, queue_name, operator, settings, django_capture_on_commit_callbacks, monkeypatch
):
    orders = queue_name("orders")
    dead_letters(channel, orders, 1)
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)
    assert wait_for_depth(channel, orders, 1) == 1
    kill_on_broker(channel, orders, 1)
    assert wait_for_depth(channel, orders + ".dlq", 1) == 1
    # A Redis nobody listens on.
    monkeypatch.setattr(boomerangs, "get_breakers", lambda: RedisBreakers("redis://127.0.0.1:1/0", timeout=1.0))
    monkeypatch.setitem(boomerangs.QUIET, "until", 0.0)

    with django_capture_on_commit_callbacks(execute=True):
        (boomerang,) = ingest_from(channel, orders + ".dlq")

    # Stored and linked; the breakers are left alone for a while rather than slowing every batch.
    assert boomerang.previous_id is not None
    assert boomerangs.QUIET["until"] > 0


def test_only_an_admin_closes_a_breaker_by_hand(operator, queue_name):
    key = f"queue:{queue_name('orders')}"
    open_breaker(key)
    with pytest.raises(PermissionDenied):
        close_breaker(key=key, actor=operator)
    assert get_breakers().peek(key).state == OPEN


def test_when_the_breakers_cannot_be_reached_replays_go_on(channel, queue_name, operator, monkeypatch, caplog):
    orders = queue_name("orders")
    dead_letters(channel, orders, 3)
    unreachable = RedisBreakers("redis://127.0.0.1:1/0", timeout=1.0)
    monkeypatch.setattr(run_state, "get_breakers", lambda: unreachable)
    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [orders]}, actor=operator)
    start_operation(operation=operation, actor=operator)

    run_operation(operation_id=operation.pk, continue_later=lambda seconds: None)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == ("done", 3)
    assert wait_for_depth(channel, orders, 3) == 3
    assert "circuit breakers unavailable" in caplog.text


def forged_boomerangs(*, origin: int, queue: str, count: int, source: str = "attacker.dlq") -> list[Any]:
    """`count` messages anyone could drop in a DLQ, claiming to be returns of dead letter `origin` from `queue`."""
    now = timezone.now()
    return [
        parse_envelope(
            source_queue=source,
            body=f"forged {number}".encode(),
            properties=pika.BasicProperties(
                message_id=f"forged-{number}",
                headers={
                    django_settings.DLQ_REPLAYED_FROM_HEADER: origin,
                    "x-death": [
                        {"queue": queue, "reason": "rejected", "count": 1, "exchange": "", "routing-keys": [queue]}
                    ],
                },
            ),
            now=now,
        )
        for number in range(count)
    ]


def test_forged_boomerangs_of_a_dead_letter_never_replayed_count_for_nothing(
    queue_name, django_capture_on_commit_callbacks
):
    payments = queue_name("payments")
    (origin,) = parked(1, queue="someone-else.dlq")
    letters = forged_boomerangs(origin=origin.pk, queue=payments, count=django_settings.DLQ_BREAKER_FAILURES)

    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(letters=letters)

    assert DeadLetter.objects.filter(previous=origin).count() == len(letters)
    assert get_breakers().peek(f"queue:{payments}").state == CLOSED
    assert boomerangs._report(letters) == 0


def test_a_boomerang_counts_once_and_only_against_where_its_origin_was_replayed(
    queue_name, django_capture_on_commit_callbacks
):
    orders, payments = queue_name("orders"), queue_name("payments")
    origins = parked(3, queue=orders + ".dlq")
    DeadLetter.objects.filter(pk__in=[row.pk for row in origins]).update(
        status=DeadLetterStatus.REPLAYED, original_queue=orders, original_exchange="", original_routing_keys=[orders]
    )
    stale, moved = origins[1], origins[2]
    DeadLetter.objects.filter(pk=stale.pk).update(status_changed_at=timezone.now() - dt.timedelta(hours=1))
    DeadLetter.objects.filter(pk=moved.pk).update(status=DeadLetterStatus.MOVED)

    # Returns claimed from another queue than the replay went to, or of a replay outside the window, or of a move.
    letters = [
        *forged_boomerangs(origin=origins[0].pk, queue=payments, count=3),
        *forged_boomerangs(origin=stale.pk, queue=orders, count=1, source="a.dlq"),
        *forged_boomerangs(origin=moved.pk, queue=orders, count=1, source="b.dlq"),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(letters=letters)
    assert get_breakers().peek(f"queue:{payments}").state == CLOSED
    assert get_breakers().peek(f"queue:{orders}").outcomes == ""

    # The real return, twice in a batch: one outcome.
    real = forged_boomerangs(origin=origins[0].pk, queue=orders, count=2, source=orders + ".dlq")
    DeadLetter.objects.filter(previous=origins[0]).delete()
    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(letters=real)
    assert get_breakers().peek(f"queue:{orders}").outcomes == "1"
    # Once it has come back, a further claim to be its return is not counted.
    assert boomerangs._report(forged_boomerangs(origin=origins[0].pk, queue=orders, count=1, source="c.dlq")) == 0


def test_a_return_stored_before_the_record_of_its_replay_counts_only_from_its_own_dead_letter_queue(
    queue_name, django_capture_on_commit_callbacks
):
    """A replayed dead letter keeps its status while its message is in flight, and a fast consumer's return can be
    stored before the record of the confirm: it counts as a return of a replay sent just now, when it comes back to
    the origin's own DLQ; naming a waiting dead letter from another queue's messages counts for nothing."""
    orders = queue_name("orders")
    (origin,) = parked(1, queue=orders + ".dlq")
    DeadLetter.objects.filter(pk=origin.pk).update(
        original_queue=orders, original_exchange="", original_routing_keys=[orders]
    )

    elsewhere = forged_boomerangs(origin=origin.pk, queue=orders, count=3, source="attacker.dlq")
    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(letters=elsewhere)
    assert get_breakers().peek(f"queue:{orders}").outcomes == ""

    DeadLetter.objects.filter(previous=origin).delete()
    (home,) = forged_boomerangs(origin=origin.pk, queue=orders, count=1, source=orders + ".dlq")
    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(letters=[home])
    assert get_breakers().peek(f"queue:{orders}").outcomes == "1"


def test_an_exchange_with_a_slash_and_its_routing_key_are_one_destination_key():
    split_early = Destination(exchange="a", routing_key="b/c")
    split_late = Destination(exchange="a/b", routing_key="c")
    odd = Destination(exchange="a%2Fb", routing_key="c", broker="staging")

    assert len({split_early.limit_key, split_late.limit_key, odd.limit_key}) == 3
    for destination in (split_early, split_late, odd):
        assert describe_key(destination.limit_key) == str(destination)
        key = destination_key(
            exchange=destination.exchange,
            routing_keys=[destination.routing_key],
            queue="",
            broker="" if destination.broker == "default" else destination.broker,
        )
        assert key == destination.limit_key
