"""Identical messages are several dead letters; only a redelivered copy of a stored one is a duplicate.

A dead letter's identity is a hash of everything the broker delivered. Two messages identical in every byte (no
message id, no timestamp) that die in the same queue in the same second hash the same, and so do the duplicates
that at-least-once dead-lettering of quorum queues can make. A first delivery (not marked redelivered) is never
dropped: it is stored as a further occurrence, linked to the first; a redelivered copy whose hash is stored is the
same dead letter coming back after a crash between commit and ack, and counts as a duplicate.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pika
import pytest
from django.core.management import call_command
from django.db import connection

from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount
from dlqconsole.ingest.envelope import ParsedDeadLetter, parse_envelope
from dlqconsole.ingest.services import ingest_batch
from tests.conftest import client_for
from tests.support import DeadLetterQueue

AT = dt.datetime(2026, 11, 27, 10, 0, tzinfo=dt.UTC)


def same(queue: str = "orders.dlq", *, redelivered: bool = False) -> ParsedDeadLetter:
    """The same message every time: no message id, no timestamp, the same death in the same second."""
    properties = pika.BasicProperties(
        content_type="application/json",
        headers={
            "x-death": [
                {
                    "count": 1,
                    "reason": "rejected",
                    "queue": "orders",
                    "time": AT,
                    "exchange": "",
                    "routing-keys": ["orders"],
                }
            ],
            "x-exception-message": "card declined",
        },
    )
    return parse_envelope(
        source_queue=queue, body=b'{"order": 7}', properties=properties, now=AT, redelivered=redelivered
    )


def stored() -> list[DeadLetter]:
    return list(DeadLetter.objects.order_by("pk"))


@pytest.mark.django_db
@pytest.mark.sqlite
def test_identical_messages_in_one_batch_are_all_stored_and_linked_to_the_first() -> None:
    result = ingest_batch(letters=[same(), same(), same()], now=AT)

    first, *copies = stored()
    assert (result.inserted, result.duplicates) == (3, 0)
    assert first.identical_to_id is None
    assert [copy.identical_to_id for copy in copies] == [first.pk, first.pk]
    assert len({row.dedupe_key for row in [first, *copies]}) == 3
    assert all(copy.dedupe_key.startswith(first.dedupe_key + ":") for copy in copies)
    assert DeadLetterCount.objects.get().count == 3


@pytest.mark.django_db
@pytest.mark.sqlite
def test_a_first_delivery_identical_to_a_stored_dead_letter_is_a_further_occurrence() -> None:
    ingest_batch(letters=[same()], now=AT)

    result = ingest_batch(letters=[same()], now=AT + dt.timedelta(seconds=1))

    first, copy = stored()
    assert result.inserted == 1
    assert copy.identical_to_id == first.pk
    assert first.pattern_id == copy.pattern_id
    assert DeadLetterCount.objects.get().count == 2


@pytest.mark.django_db
@pytest.mark.sqlite
def test_a_redelivered_copy_of_a_stored_dead_letter_is_a_duplicate() -> None:
    ingest_batch(letters=[same(), same()], now=AT)

    result = ingest_batch(letters=[same(redelivered=True), same(redelivered=True)], now=AT + dt.timedelta(seconds=1))

    assert (result.inserted, result.duplicates) == (0, 2)
    assert len(stored()) == 2


@pytest.mark.django_db
@pytest.mark.sqlite
def test_a_redelivered_message_never_stored_is_stored() -> None:
    # Its first delivery died with a consumer before any commit: nothing of it is stored.
    result = ingest_batch(letters=[same(redelivered=True)], now=AT)

    assert result.inserted == 1
    assert stored()[0].identical_to_id is None


@pytest.mark.django_db(transaction=True)
def test_two_consumers_each_given_the_same_content_store_it_twice() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers are a PostgreSQL matter")
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def consume() -> None:
        try:
            letters = [same() for _ in range(50)]
            start.wait()
            results.append(ingest_batch(letters=letters, now=AT).inserted)
        except BaseException as error:  # noqa: BLE001  (reported in the test thread)
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(results) == [50, 50]
    rows = stored()
    assert len(rows) == 100
    first = rows[0]
    assert sum(row.identical_to_id == first.pk for row in rows) == 99


@pytest.mark.django_db(transaction=True)
def test_two_identical_messages_published_to_a_dlq_are_two_dead_letters(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any
) -> None:
    properties = pika.BasicProperties(content_type="text/plain", headers={"x-exception-message": "boom"})
    for _ in range(2):
        amqp_channel.basic_publish(exchange="", routing_key=dead_letter_queue.dlq, body=b"same", properties=properties)

    call_command("consume_dlq", queues=dead_letter_queue.dlq, exit_when_idle=0.5)

    first, copy = DeadLetter.objects.filter(source_queue=dead_letter_queue.dlq).order_by("pk")
    assert (bytes(first.body), bytes(copy.body)) == (b"same", b"same")
    assert copy.identical_to_id == first.pk
    assert amqp_channel.queue_declare(queue=dead_letter_queue.dlq, passive=True).method.message_count == 0


@pytest.mark.django_db
def test_a_message_page_links_identical_copies_both_ways(viewer: Any) -> None:
    ingest_batch(letters=[same(), same()], now=AT)
    first, copy = stored()
    client = client_for(viewer)

    first_id = first.pk
    first_page = client.get(f"/messages/{first_id}/").content.decode()
    copy_page = client.get(f"/messages/{copy.pk}/").content.decode()
    first.delete()
    orphan_page = client.get(f"/messages/{copy.pk}/").content.decode()

    assert f'href="/messages/{copy.pk}/">#{copy.pk}</a>' in first_page.split('data-testid="identical-copies"')[1]
    assert f'href="/messages/{first_id}/">#{first_id}</a>' in copy_page.split('data-testid="identical-to"')[1]
    assert f"#{first_id} (no longer stored)" in orphan_page
