"""A time window is also an id range on PostgreSQL (deadletters/time_bounds.py): the bound never changes which dead
letters match, whoever wrote them and in whatever order, and it keeps a window far from the newest rows from reading
every newer row."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import DeadLetter, HourIds
from dlqconsole.deadletters.time_bounds import highest_id_before, lowest_id_from
from tests.factories import ParsedDeadLetterFactory, store

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 11, 28, 12, 30, tzinfo=dt.UTC)
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="HourIds is kept on PostgreSQL")


def _at(moment: dt.datetime) -> DeadLetter:
    return store(ParsedDeadLetterFactory.build(), now=moment)[0]


def _matching(**window: Any) -> list[int]:
    return sorted(DeadLetterFilter.from_dict(window).apply().values_list("pk", flat=True))


def _by_time(*, since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[int]:
    return sorted(
        letter.pk
        for letter in DeadLetter.objects.all()
        if (since is None or letter.ingested_at >= since) and (until is None or letter.ingested_at < until)
    )


@postgres_only
def test_rows_written_out_of_time_order_match_a_window_exactly_as_their_times_say() -> None:
    # Ids rise while times jump back and forth by days, as no ingest writes them: the bounds must still hold.
    offsets = [0, 40, 2, 30, 1, 25, 26, 24, 3, 60, 0.5, 29]
    for hours in offsets:
        _at(NOW - dt.timedelta(days=hours))
    for days in (0.25, 1, 2.5, 24.5, 25, 26, 29.9, 45, 90):
        moment = NOW - dt.timedelta(days=days)
        until = moment.isoformat()
        assert _matching(until=until, status=["parked"]) == _by_time(until=moment)
        assert _matching(since=until, status=["parked"]) == _by_time(since=moment)
    assert _matching(
        since=(NOW - dt.timedelta(days=26)).isoformat(),
        until=(NOW - dt.timedelta(days=2)).isoformat(),
        status=["parked"],
    ) == _by_time(since=NOW - dt.timedelta(days=26), until=NOW - dt.timedelta(days=2))


@postgres_only
def test_each_hour_holds_the_lowest_and_highest_id_of_its_rows_written_or_moved_there() -> None:
    first = _at(NOW)
    second = _at(NOW + dt.timedelta(minutes=10))
    old = _at(NOW - dt.timedelta(days=3))
    hour = NOW.replace(minute=0)
    kept = HourIds.objects.get(hour=hour)
    assert (kept.min_id, kept.max_id) == (first.pk, second.pk)
    assert HourIds.objects.get(hour=hour - dt.timedelta(days=3)).max_id == old.pk
    # Moved back in time (an UPDATE of ingested_at): its new hour takes it in.
    DeadLetter.objects.filter(pk=second.pk).update(ingested_at=NOW - dt.timedelta(days=10))
    assert HourIds.objects.get(hour=hour - dt.timedelta(days=10)).max_id == second.pk
    assert highest_id_before(NOW - dt.timedelta(days=9)) == second.pk
    assert lowest_id_from(NOW - dt.timedelta(days=11)) == first.pk
    assert _matching(until=(NOW - dt.timedelta(days=9)).isoformat()) == [second.pk]
    # Deleting leaves the ranges (wider bounds, still true).
    DeadLetter.objects.filter(pk=old.pk).delete()
    assert HourIds.objects.filter(hour=hour - dt.timedelta(days=3)).exists()
    assert _matching(until=(NOW - dt.timedelta(days=2)).isoformat()) == [second.pk]


@postgres_only
def test_a_window_with_no_rows_is_empty_and_a_far_window_starts_its_walk_at_its_bound() -> None:
    old = _at(NOW - dt.timedelta(days=30))
    newer = [_at(NOW - dt.timedelta(minutes=minutes)) for minutes in range(5)]
    assert _matching(until=(NOW - dt.timedelta(days=40)).isoformat()) == []
    assert _matching(since=(NOW + dt.timedelta(days=1)).isoformat()) == []
    query = DeadLetterFilter.from_dict({"until": (NOW - dt.timedelta(days=25)).isoformat()}).apply()
    sql = str(query.query)
    assert f'"deadletters_deadletter"."id" <= {old.pk}' in sql
    assert list(query.values_list("pk", flat=True)) == [old.pk]
    assert max(letter.pk for letter in newer) > old.pk


@pytest.mark.sqlite
def test_windows_match_by_time_on_every_database() -> None:
    now = timezone.now()
    inside = _at(now - dt.timedelta(hours=30))
    _at(now - dt.timedelta(hours=1))
    _at(now - dt.timedelta(days=9))
    assert _matching(since="2d", until="1d") == [inside.pk]
