"""The patterns' sparklines count arrivals when they happen (PatternArrivalCount, per pattern and hour): a purge or
archive retention leaves them, a merge moves all of a pattern's counts to the pattern that absorbs it, a split moves
those of the dead letters it moves, and an upgraded console's sparklines are seeded from the stored rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.counters import arrival_hour, prune_arrival_counts
from dlqconsole.deadletters.models import (
    ARRIVAL_COUNT_RETENTION,
    DeadLetter,
    DeadLetterStatus,
    FailurePattern,
    PatternArrivalCount,
)
from dlqconsole.deadletters.rule_services import split_pattern
from dlqconsole.deadletters.services import merge_patterns
from dlqconsole.operations.models import OperationKind
from tests.conftest import client_for
from tests.deadletters.test_arrival_charts import run
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]
HOUR = dt.timedelta(hours=1)


def day(pattern: FailurePattern | int, *, now: dt.datetime) -> list[int]:
    pattern_id = pattern if isinstance(pattern, int) else pattern.pk
    return selectors.pattern_trends(pattern_ids=[pattern_id], now=now, width=HOUR, buckets=24)[pattern_id]


def test_ingest_counts_each_batch_in_its_pattern_and_hour() -> None:
    now = timezone.now().replace(minute=20)
    timeouts = store(EnvelopeFactory.build(), EnvelopeFactory.build(), now=now - 3 * HOUR)
    store(EnvelopeFactory.build(), now=now - 3 * HOUR + dt.timedelta(minutes=5))
    declines = store(EnvelopeFactory.build(error="card declined", error_type="CardError"), now=now)

    assert day(timeouts[0].pattern_id, now=now)[-4:] == [3, 0, 0, 0]
    assert day(declines[0].pattern_id, now=now)[-4:] == [0, 0, 0, 1]


def test_a_purge_leaves_the_patterns_sparkline(admin_user: User, viewer: User) -> None:
    now = timezone.now().replace(minute=20)
    stored = store(*(EnvelopeFactory.build() for _ in range(4)), now=now - 2 * HOUR)
    store(EnvelopeFactory.build(), now=now)
    pattern = FailurePattern.objects.get(pk=stored[0].pattern_id)

    purged = run(OperationKind.PURGE, admin_user, filter={"pattern": [pattern.pk]})

    assert purged.succeeded == 5 and not DeadLetter.objects.exists()
    assert day(pattern, now=now)[-3:] == [4, 0, 1]
    page = client_for(viewer).get(f"/patterns/{pattern.pk}/").content.decode()
    assert 'aria-label="5 in the last 24 buckets, peak 4, latest 1"' in page


def test_a_merge_moves_every_count_to_the_target_purged_arrivals_included(admin_user: User, operator: User) -> None:
    now = timezone.now().replace(minute=20)
    source_rows = store(
        EnvelopeFactory.build(error="user alice not found", error_type="LookupError"), now=now - 5 * HOUR
    )
    store(EnvelopeFactory.build(error="user alice not found", error_type="LookupError"), now=now - HOUR)
    target_rows = store(EnvelopeFactory.build(error="card declined", error_type="CardError"), now=now - HOUR)
    source = FailurePattern.objects.get(pk=source_rows[0].pattern_id)
    target = FailurePattern.objects.get(pk=target_rows[0].pattern_id)
    run(OperationKind.PURGE, admin_user, filter={"ids": [source_rows[0].pk]})

    merge_patterns(sources=[source], target=target, actor=operator)

    assert day(target, now=now)[-6:] == [1, 0, 0, 0, 2, 0]
    assert not PatternArrivalCount.objects.filter(pattern=source).exists()


def test_a_split_moves_the_counts_of_the_dead_letters_it_moves(operator: User) -> None:
    now = timezone.now().replace(minute=20)
    store(
        EnvelopeFactory.build(error="queue orders-eu full"),
        EnvelopeFactory.build(error="queue orders-us full"),
        now=now - 2 * HOUR,
    )
    rows = store(EnvelopeFactory.build(error="queue orders-eu full"), now=now)
    pattern = FailurePattern.objects.get(pk=rows[0].pattern_id)
    assert day(pattern, now=now)[-3:] == [2, 0, 1]

    part = split_pattern(pattern=pattern, name="EU queue full", regex="orders-eu", actor=operator)

    assert day(part, now=now)[-3:] == [1, 0, 1]
    assert day(pattern, now=now)[-3:] == [1, 0, 0]
    assert sum(day(part, now=now)) + sum(day(pattern, now=now)) == 3


def test_buckets_are_whole_hours() -> None:
    with pytest.raises(ValueError, match="whole number of hours"):
        selectors.pattern_trends(pattern_ids=[1], width=dt.timedelta(minutes=5), buckets=12)


def test_counts_past_the_retention_are_pruned() -> None:
    now = timezone.now()
    old = store(EnvelopeFactory.build(), now=now - ARRIVAL_COUNT_RETENTION - 2 * HOUR)
    store(EnvelopeFactory.build(), now=now)

    prune_arrival_counts(now=now)

    hours = list(PatternArrivalCount.objects.filter(pattern_id=old[0].pattern_id).values_list("hour", flat=True))
    assert [selectors._as_value(hour, PatternArrivalCount._meta.get_field("hour")) for hour in hours] == [
        arrival_hour(now)
    ]


@pytest.mark.django_db(transaction=True)
def test_the_migration_counts_the_arrivals_of_the_stored_dead_letters(migrate: Any) -> None:
    old = migrate([("deadletters", "0010_arrivalcount")])
    Pattern = old.get_model("deadletters", "FailurePattern")
    Letter = old.get_model("deadletters", "DeadLetter")
    first = Pattern.objects.create(key="p1", template="Request timed out after <NUM>ms", error_type="TimeoutError")
    second = Pattern.objects.create(key="p2", template="card declined", error_type="CardError")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - 2 * HOUR
    stored = [
        (first, hour + dt.timedelta(minutes=1), DeadLetterStatus.PARKED),
        (first, hour + dt.timedelta(minutes=59), DeadLetterStatus.REPLAYED),
        (second, hour + dt.timedelta(minutes=30), DeadLetterStatus.ARCHIVED),
        (first, hour + HOUR, DeadLetterStatus.PARKED),
        (first, hour - dt.timedelta(days=5), DeadLetterStatus.PARKED),  # past the counts' retention
    ]
    for number, (pattern, ingested_at, status) in enumerate(stored):
        Letter.objects.create(
            dedupe_key=f"k{number}",
            source_queue="orders.dlq",
            ingested_at=ingested_at,
            status=status,
            body=b"",
            fingerprint=pattern.key,
            pattern=pattern,
        )

    new = migrate([("deadletters", "0011_patternarrivalcount")])

    Count = new.get_model("deadletters", "PatternArrivalCount")
    assert {(row.pattern_id, row.hour): row.count for row in Count.objects.all()} == {
        (first.pk, hour): 2,
        (second.pk, hour): 1,
        (first.pk, hour + HOUR): 1,
    }
