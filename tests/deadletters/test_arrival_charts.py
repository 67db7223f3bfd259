"""The dashboard's arrival charts count arrivals when they happen (ArrivalCount), so a purge or archive retention
does not make past arrivals vanish from them; an upgraded console's charts are seeded from the stored rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.models import Operation, OperationKind
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import run_operation, start_operation
from dlqconsole.operations.upkeep import delete_expired_archives
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, many, store


def run(kind: str, actor: User, **plan: Any) -> Operation:
    operation = plan_operation(kind=kind, actor=actor, **plan)
    start_operation(operation=operation, actor=actor)
    run_operation(operation_id=operation.pk)
    operation.refresh_from_db()
    return operation


def shown(html: str, label: str) -> str:
    """The figure the dashboard shows above `label`."""
    return html.split(f'</div><div class="label">{label}', 1)[0].rsplit(">", 1)[1]


@pytest.mark.django_db
@pytest.mark.sqlite
def test_purged_dead_letters_still_show_on_the_dashboards_arrival_charts(admin_user: User, viewer: User) -> None:
    now = timezone.now()
    store(*(EnvelopeFactory.build(queue="orders") for _ in range(4)), now=now - dt.timedelta(hours=3))
    many(3, queue="orders")
    many(2, queue="billing")

    purged = run(OperationKind.PURGE, admin_user, filter={"queue": ["orders.dlq"]})

    assert purged.succeeded == 7
    assert DeadLetter.objects.count() == 2
    hour = selectors.arrivals(width=dt.timedelta(minutes=5), buckets=12)
    day = selectors.arrivals(width=dt.timedelta(hours=1), buckets=24)
    assert sum(count for _, count in hour) == 5
    assert sum(count for _, count in day) == 9
    html = client_for(viewer).get("/").content.decode()
    assert (shown(html, "arrived last hour"), shown(html, "arrived last 24 h")) == ("5", "9")


@pytest.mark.django_db
@pytest.mark.sqlite
def test_archive_retention_leaves_the_arrivals_counted(admin_user: User) -> None:
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    store(EnvelopeFactory.build(), EnvelopeFactory.build(), now=now - dt.timedelta(hours=2))
    run(OperationKind.ARCHIVE, admin_user, filter={})

    assert delete_expired_archives(now=now + dt.timedelta(days=60)) == 2

    assert not DeadLetter.objects.exists()
    day = selectors.arrivals(now=now, width=dt.timedelta(hours=1), buckets=24)
    assert [count for _, count in day][-3:] == [2, 0, 0]


@pytest.mark.django_db
@pytest.mark.sqlite
def test_arrival_buckets_are_whole_minutes() -> None:
    with pytest.raises(ValueError, match="whole number of minutes"):
        selectors.arrivals(width=dt.timedelta(seconds=90), buckets=4)


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_the_migration_counts_the_arrivals_of_the_stored_dead_letters(migrate: Any) -> None:
    old = migrate([("deadletters", "0009_rule_regex_help")])
    Pattern = old.get_model("deadletters", "FailurePattern")
    Letter = old.get_model("deadletters", "DeadLetter")
    pattern = Pattern.objects.create(key="p1", template="Request timed out after <NUM>ms", error_type="TimeoutError")
    minute = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(hours=2)
    stored = [
        ("orders.dlq", minute + dt.timedelta(seconds=1), DeadLetterStatus.PARKED),
        ("orders.dlq", minute + dt.timedelta(seconds=59), DeadLetterStatus.REPLAYED),
        ("billing.dlq", minute + dt.timedelta(seconds=30), DeadLetterStatus.ARCHIVED),
        ("orders.dlq", minute + dt.timedelta(minutes=7), DeadLetterStatus.PARKED),
        ("orders.dlq", minute - dt.timedelta(days=5), DeadLetterStatus.PARKED),  # past the counts' retention
    ]
    for number, (queue, ingested_at, status) in enumerate(stored):
        Letter.objects.create(
            dedupe_key=f"k{number}",
            source_queue=queue,
            ingested_at=ingested_at,
            status=status,
            body=b"",
            fingerprint="p1",
            pattern=pattern,
        )

    new = migrate([("deadletters", "0010_arrivalcount")])

    Count = new.get_model("deadletters", "ArrivalCount")
    assert {(row.minute, row.source_queue): row.count for row in Count.objects.all()} == {
        (minute, "orders.dlq"): 2,
        (minute, "billing.dlq"): 1,
        (minute + dt.timedelta(minutes=7), "orders.dlq"): 1,
    }


@pytest.mark.django_db
@pytest.mark.sqlite
def test_each_minute_counts_in_its_bucket_and_a_consumer_clock_ahead_in_the_last() -> None:
    now = timezone.now().replace(minute=32, second=10, microsecond=0)
    store(EnvelopeFactory.build(), now=now.replace(minute=4, second=59) - dt.timedelta(hours=1))  # before the window
    store(EnvelopeFactory.build(), now=now.replace(minute=35, second=0) - dt.timedelta(hours=1))  # the first bucket
    store(EnvelopeFactory.build(queue="billing"), EnvelopeFactory.build(), now=now.replace(minute=29, second=59))
    store(EnvelopeFactory.build(), now=now.replace(minute=30, second=0))
    store(EnvelopeFactory.build(), now=now + dt.timedelta(minutes=4))

    hour = selectors.arrivals(now=now, width=dt.timedelta(minutes=5), buckets=12)

    assert hour[0][0] == now.replace(minute=35, second=0) - dt.timedelta(hours=1)
    assert [count for _, count in hour] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2]
