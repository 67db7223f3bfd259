"""What came back of an operation's replays is counted whenever it arrives, whatever the operation's status (a
canary that paused on the first boomerang, a cancel, the end), and said with the reasons its boomerangs died for."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, DeathReason
from dlqconsole.operations import canary, upkeep
from dlqconsole.operations.canary import CAME_BACK_WATCH, refresh_came_back
from dlqconsole.operations.item_sql import CameBack, count_came_back
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import cancel_operation, run_operation, start_operation
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for
from tests.factories import ParsedDeadLetterFactory, parked, store
from tests.support import declare_with_dlq, ingest_from, kill_on_broker, wait_for_depth

pytestmark = pytest.mark.django_db


def shown(html: str) -> str:
    """The page as a browser reads it: each run of spaces and line breaks as one space."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def publish(channel: Any, queue: str, names: list[str]) -> None:
    for name in names:
        channel.basic_publish(
            exchange="", routing_key=queue, body=name.encode(), properties=pika.BasicProperties(message_id=name)
        )


# The acceptance test ----------------------------------------------------------------------------------------------


def test_a_canary_whose_messages_all_come_back_shows_all_of_them_and_why_after_it_paused(
    channel: Any, queue_name: Any, operator: User
) -> None:
    # A work queue that holds at most 5 messages (the head overflows into the DLQ) and whose consumer fails.
    orders = queue_name("orders")
    declare_with_dlq(channel, orders, **{"x-max-length": 5})
    for batch in (["a0", "a1", "a2", "a3", "a4"], ["b0", "b1", "b2"]):
        publish(channel, orders, batch)
        kill_on_broker(channel, orders, len(batch))
    letters = ingest_from(channel, f"{orders}.dlq", expect=8)
    operation = plan_operation(
        kind=OperationKind.RETRY,
        filter={"queue": [f"{orders}.dlq"]},
        actor=operator,
        canary_size=5,
        canary_wait_seconds=60,
    )
    start_operation(operation=operation, actor=operator)
    waits: list[float] = []

    run_operation(operation_id=operation.pk, continue_later=waits.append)  # the canary goes out, then its watch
    assert wait_for_depth(channel, orders, 5) == 5
    # Another producer's message overflows the queue: the canary's first message dies of it, and the next look at
    # the dead-letter queues pauses the operation on that one.
    publish(channel, orders, ["newcomer"])
    (overflowed,) = ingest_from(channel, f"{orders}.dlq", expect=1)
    run_operation(operation_id=operation.pk, continue_later=waits.append)

    operation.refresh_from_db()
    assert (operation.status, operation.canary_failed) == (OperationStatus.PAUSED, True)
    assert operation.pause_reason == "canary of 5: 1 came back to a dead-letter queue within 60s (1 queue overflow)"
    assert (operation.returned, operation.returned_reasons) == (1, {"maxlen": 1})

    # No worker runs it any more; the other four canary messages die later (their consumer rejects them).
    kill_on_broker(channel, orders, 5)
    later = ingest_from(channel, f"{orders}.dlq", expect=5)
    boomerangs = [row for row in later if row.previous_id is not None]
    assert len(boomerangs) == 4
    # One of them is archived by someone meanwhile: it came back all the same.
    DeadLetter.objects.filter(pk=boomerangs[0].pk).update(status=DeadLetterStatus.ARCHIVED)

    page = client_for(operator).get(f"/operations/{operation.pk}/")

    assert page.status_code == 200
    text = shown(page.content.decode())
    assert "Came back 5 to a dead-letter queue: 4 rejected, 1 queue overflow" in text
    operation.refresh_from_db()
    assert (operation.status, operation.returned, operation.returned_reasons) == (
        OperationStatus.PAUSED,
        5,
        {"rejected": 4, "maxlen": 1},
    )
    # Each reason links to the messages page of exactly those boomerangs.
    html = page.content.decode()
    rejected = re.search(r'href="/messages/\?ids=([0-9,]+)" data-testid="came-back-rejected"', html)
    maxlen = re.search(r'href="/messages/\?ids=([0-9,]+)" data-testid="came-back-maxlen"', html)
    assert rejected is not None and maxlen is not None
    assert sorted(map(int, rejected.group(1).split(","))) == sorted(row.pk for row in boomerangs)
    assert maxlen.group(1) == str(overflowed.pk)
    canary = set(
        OperationItem.objects.filter(operation=operation)
        .exclude(status=ItemStatus.PENDING)
        .values_list("dead_letter_id", flat=True)
    )
    assert {row.previous_id for row in [overflowed, *boomerangs]} == canary
    assert len(canary) == 5 and canary < {row.pk for row in letters}

    body = api_client(token_for(operator)).get(f"/api/v1/operations/{operation.pk}/").json()
    assert body["progress"]["came_back"] == 5
    assert body["progress"]["came_back_reasons"] == [
        {"reason": "rejected", "label": "rejected", "count": 4},
        {"reason": "maxlen", "label": "queue overflow", "count": 1},
    ]


# Without a broker: boomerangs stored by ingest, linked to dead letters an operation published ------------------------


def replayed(count: int, *, status: str, now: dt.datetime) -> tuple[Operation, list[DeadLetter]]:
    """An operation in `status` that published `count` dead letters, started a minute before `now`."""
    letters = parked(count)
    finished = now if status in (OperationStatus.DONE, OperationStatus.CANCELLED) else None
    operation = Operation.objects.create(
        kind=OperationKind.RETRY,
        status=status,
        total=count,
        succeeded=count,
        started_at=now - dt.timedelta(minutes=1),
        finished_at=finished,
        heartbeat_at=now - dt.timedelta(minutes=1),
    )
    OperationItem.objects.bulk_create(
        OperationItem(operation=operation, dead_letter=letter, status=ItemStatus.PUBLISHED) for letter in letters
    )
    return operation, letters


def come_back(
    letters: list[DeadLetter], reason: str, *, now: dt.datetime, death: str = DeathReason.UNKNOWN
) -> list[DeadLetter]:
    """Each letter's replay dies again with failure reason `reason` (and the broker's death reason `death`) and is
    ingested (linked to it through `previous`)."""
    return store(
        *(
            ParsedDeadLetterFactory.build(replayed_from=letter.pk, failure_reason=reason, death_reason=death)
            for letter in letters
        ),
        now=now,
    )


def test_they_came_back_for_the_brokers_death_reason_not_the_error_they_carry() -> None:
    """A replay that carries its first failure's error header (classified INTERNAL) and is rejected again came back
    because it was rejected; one an application published to the dead-letter queue itself has no death reason, and
    counts by its failure reason."""
    now = timezone.now()
    operation, letters = replayed(3, status=OperationStatus.DONE, now=now)
    come_back(letters[:2], "INTERNAL", now=now, death=DeathReason.REJECTED)
    come_back(letters[2:], "INTERNAL", now=now)

    assert refresh_came_back(operation=operation, now=now)
    operation.refresh_from_db()
    assert operation.returned_reasons == {"rejected": 2, "INTERNAL": 1}
    assert CameBack.of(operation).words == "2 rejected, 1 internal error"


def test_boomerangs_of_a_cancelled_operation_are_counted_with_their_reasons() -> None:
    now = timezone.now()
    operation, letters = replayed(5, status=OperationStatus.CANCELLED, now=now)
    come_back(letters[:3], "REJECTED", now=now)
    come_back(letters[3:], "MAXLEN", now=now)

    assert refresh_came_back(operation=operation, now=now)

    operation.refresh_from_db()
    assert (operation.returned, operation.returned_reasons) == (5, {"REJECTED": 3, "MAXLEN": 2})
    assert CameBack.of(operation).words == "3 rejected, 2 queue overflow"
    assert not refresh_came_back(operation=operation, now=now)  # nothing new: the row is left alone


def test_a_dead_letter_that_comes_back_twice_counts_once_by_its_first_reason() -> None:
    now = timezone.now()
    operation, letters = replayed(2, status=OperationStatus.DONE, now=now)
    come_back(letters[:1], "TIMEOUT", now=now)
    # Published twice after a worker restart, it died twice.
    come_back(letters[:1], "REJECTED", now=now)

    assert count_came_back(operation=operation) == CameBack({"TIMEOUT": 1})


def test_a_boomerang_counts_whatever_its_own_status_became() -> None:
    now = timezone.now()
    operation, letters = replayed(3, status=OperationStatus.DONE, now=now)
    back = come_back(letters, "EXPIRED", now=now)
    DeadLetter.objects.filter(pk=back[0].pk).update(status=DeadLetterStatus.REPLAYED)
    DeadLetter.objects.filter(pk=back[1].pk).update(status=DeadLetterStatus.ARCHIVED)

    assert count_came_back(operation=operation) == CameBack({"EXPIRED": 3})


def test_what_arrived_before_the_operation_started_or_was_never_published_is_not_counted() -> None:
    now = timezone.now()
    operation, letters = replayed(3, status=OperationStatus.DONE, now=now)
    come_back(letters[:1], "REJECTED", now=now - dt.timedelta(minutes=5))  # before its start: another replay's
    OperationItem.objects.filter(dead_letter=letters[1]).update(status=ItemStatus.SKIPPED)
    come_back(letters[1:2], "REJECTED", now=now)

    assert count_came_back(operation=operation) == CameBack()


def test_the_sweep_counts_stopped_operations_and_leaves_old_and_running_ones() -> None:
    now = timezone.now()
    cancelled, cancelled_letters = replayed(2, status=OperationStatus.CANCELLED, now=now)
    done, done_letters = replayed(2, status=OperationStatus.DONE, now=now)
    paused, paused_letters = replayed(2, status=OperationStatus.PAUSED, now=now)
    running, running_letters = replayed(2, status=OperationStatus.RUNNING, now=now)
    Operation.objects.filter(pk=running.pk).update(runner="worker-1")
    old, old_letters = replayed(2, status=OperationStatus.DONE, now=now - CAME_BACK_WATCH)
    for letters in (cancelled_letters, done_letters, paused_letters, running_letters, old_letters):
        come_back(letters, "DELIVERY_LIMIT", now=now)

    changed = upkeep.recount_came_back(now=now)

    assert changed == [cancelled.pk, done.pk, paused.pk]
    returned = dict(Operation.objects.values_list("pk", "returned"))
    assert (returned[cancelled.pk], returned[done.pk], returned[paused.pk]) == (2, 2, 2)
    # The running one is counted by its worker; the one finished long ago keeps its figures.
    assert (returned[running.pk], returned[old.pk]) == (0, 0)
    assert Operation.objects.get(pk=done.pk).returned_reasons == {"DELIVERY_LIMIT": 2}


def test_a_cancel_after_the_canary_paused_still_counts_what_comes_back(operator: User) -> None:
    now = timezone.now()
    operation, letters = replayed(4, status=OperationStatus.PAUSED, now=now)
    operation.canary_size, operation.canary_failed = 4, True
    operation.save(update_fields=["canary_size", "canary_failed"])
    cancel_operation(operation=operation, actor=operator)
    come_back(letters, "MAXLEN", now=timezone.now())

    page = client_for(operator).get(f"/operations/{operation.pk}/")

    assert "Came back 4 to a dead-letter queue: 4 queue overflow" in shown(page.content.decode())
    operation.refresh_from_db()
    assert operation.canary_label == "failed: its messages came back; the operation was cancelled"


def test_the_reasons_read_as_words_commonest_first() -> None:
    came_back = CameBack({"MAXLEN": 2, "REJECTED": 3, "EXPIRED": 1, "DELIVERY_LIMIT": 2, "SOMETHING_NEW": 1})

    assert came_back.count == 9
    assert came_back.words == (
        "3 rejected, 2 delivery limit reached, 2 queue overflow, 1 expired (TTL), 1 SOMETHING_NEW"
    )


def test_reads_count_again_at_most_every_few_seconds_and_many_copies_cost_no_more(
    operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page polled by many readers counts once per RECOUNT_ON_READ_SECONDS; the sweep counts regardless. Many
    boomerangs of one dead letter (a message published twice, or forged copies) count it once."""
    monkeypatch.setattr(canary, "RECOUNT_ON_READ_SECONDS", 60)
    now = timezone.now()
    operation, letters = replayed(3, status=OperationStatus.PAUSED, now=now)
    come_back(letters[:1] * 50, "REJECTED", now=now)
    cache.delete(f"came-back-counted:{operation.pk}")
    try:
        assert "Came back 1 to a dead-letter queue: 1 rejected" in shown(
            client_for(operator).get(f"/operations/{operation.pk}/").content.decode()
        )
        come_back(letters[1:], "MAXLEN", now=now)
        again = client_for(operator).get(f"/operations/{operation.pk}/").content.decode()
        assert "Came back 1 to a dead-letter queue" in shown(again)  # counted a moment ago: the figures stand
        assert (
            api_client(token_for(operator)).get(f"/api/v1/operations/{operation.pk}/").json()["progress"]["came_back"]
            == 1
        )

        assert refresh_came_back(operation=operation, now=now)  # the sweep's count
        operation.refresh_from_db()
        assert (operation.returned, operation.returned_reasons) == (3, {"REJECTED": 1, "MAXLEN": 2})
    finally:
        cache.delete(f"came-back-counted:{operation.pk}")
