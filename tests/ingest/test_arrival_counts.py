"""Arrival counts (ArrivalCount): ingest adds each batch's newly stored dead letters to the batch's minute, per
source queue, in the batch's transaction; redeliveries add nothing; the hourly retention prunes old minutes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from dlqconsole.celery import app
from dlqconsole.deadletters.counters import arrival_minute, prune_arrival_counts
from dlqconsole.deadletters.models import ARRIVAL_COUNT_RETENTION, ArrivalCount
from dlqconsole.deadletters.tasks import delete_expired_exports_task, prune_arrival_counts_task
from dlqconsole.ingest.services import ingest_batch
from tests.factories import EnvelopeFactory
from tests.ingest.conftest import publish_dead_letters
from tests.support import DeadLetterQueue

AT = dt.datetime(2026, 11, 26, 9, 41, 37, 250000, tzinfo=dt.UTC)


def counted() -> dict[tuple[dt.datetime, str], int]:
    return {(row.minute, row.source_queue): row.count for row in ArrivalCount.objects.all()}


@pytest.mark.django_db
@pytest.mark.sqlite
def test_ingest_counts_each_batchs_arrivals_in_its_minute_per_queue() -> None:
    ingest_batch(
        letters=[
            EnvelopeFactory.build(queue="orders"),
            EnvelopeFactory.build(queue="orders"),
            EnvelopeFactory.build(queue="billing"),
        ],
        now=AT,
    )
    ingest_batch(letters=[EnvelopeFactory.build(queue="orders")], now=AT + dt.timedelta(seconds=10))
    ingest_batch(
        letters=[EnvelopeFactory.build(queue="orders"), EnvelopeFactory.build(queue="orders")],
        now=AT + dt.timedelta(seconds=30),
    )

    minute = dt.datetime(2026, 11, 26, 9, 41, tzinfo=dt.UTC)
    assert counted() == {
        (minute, "orders.dlq"): 3,
        (minute, "billing.dlq"): 1,
        (minute + dt.timedelta(minutes=1), "orders.dlq"): 2,
    }


@pytest.mark.django_db
@pytest.mark.sqlite
def test_redelivered_dead_letters_are_not_counted_again() -> None:
    first = [EnvelopeFactory.build(), EnvelopeFactory.build()]
    ingest_batch(letters=first, now=AT)
    for redelivered in first:
        redelivered.redelivered = True

    # Redelivered after a crash between commit and ack, next to one new dead letter.
    result = ingest_batch(letters=[*first, EnvelopeFactory.build()], now=AT + dt.timedelta(seconds=5))

    assert result.inserted == 1
    assert counted() == {(arrival_minute(AT), "orders.dlq"): 3}


@pytest.mark.django_db
@pytest.mark.sqlite
def test_a_batch_that_stores_nothing_new_writes_no_count() -> None:
    first = [EnvelopeFactory.build()]
    ingest_batch(letters=first, now=AT)
    first[0].redelivered = True

    ingest_batch(letters=first, now=AT + dt.timedelta(minutes=5))

    assert counted() == {(arrival_minute(AT), "orders.dlq"): 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_consume_dlq_counts_the_dead_letters_it_stores(dead_letter_queue: DeadLetterQueue, amqp_channel: Any) -> None:
    before = arrival_minute(timezone.now())
    publish_dead_letters(amqp_channel, dead_letter_queue, range(30))

    call_command("consume_dlq", queues=dead_letter_queue.dlq, batch_size=8, exit_when_idle=0.5)

    rows = list(ArrivalCount.objects.filter(source_queue=dead_letter_queue.dlq))
    assert sum(row.count for row in rows) == 30
    assert all(before <= row.minute <= timezone.now() for row in rows)


@pytest.mark.django_db
@pytest.mark.sqlite
@time_machine.travel(dt.datetime(2026, 11, 26, 9, 30, tzinfo=dt.UTC), tick=False)
def test_the_hourly_retention_prunes_arrival_counts_past_the_charts_window() -> None:
    # A moment mid-hour, pinned: at the real clock, in the last minutes of an hour, the pruned hour bucket moved.
    now = timezone.now()
    old = now - ARRIVAL_COUNT_RETENTION - dt.timedelta(minutes=2)
    kept = now - ARRIVAL_COUNT_RETENTION + dt.timedelta(minutes=2)
    for moment in (old, kept, now):
        ingest_batch(letters=[EnvelopeFactory.build()], now=moment)

    assert prune_arrival_counts_task() == 1

    assert set(ArrivalCount.objects.values_list("minute", flat=True)) == {arrival_minute(kept), arrival_minute(now)}
    assert prune_arrival_counts(now=now + dt.timedelta(minutes=5)) == 1
    assert list(ArrivalCount.objects.values_list("minute", flat=True)) == [arrival_minute(now)]


@pytest.mark.django_db
@pytest.mark.sqlite
@time_machine.travel(dt.datetime(2026, 11, 26, 9, 30, tzinfo=dt.UTC), tick=False)
def test_the_export_retention_deletes_export_files_only() -> None:
    old = timezone.now() - ARRIVAL_COUNT_RETENTION - dt.timedelta(minutes=2)
    ingest_batch(letters=[EnvelopeFactory.build()], now=old)

    delete_expired_exports_task()

    assert list(ArrivalCount.objects.values_list("minute", flat=True)) == [arrival_minute(old)]


def test_beat_runs_the_arrival_count_retention_hourly_on_the_control_queue() -> None:
    app.loader.import_default_modules()
    entries = [
        entry for entry in settings.CELERY_BEAT_SCHEDULE.values() if entry["task"] == "deadletters.prune_arrival_counts"
    ]

    assert [entry["schedule"] for entry in entries] == [3600.0]
    assert "deadletters.prune_arrival_counts" in settings.CONTROL_TASKS
    route = app.amqp.router.route({}, "deadletters.prune_arrival_counts", (), {})
    assert route["queue"].name == settings.DLQ_CONTROL_QUEUE
