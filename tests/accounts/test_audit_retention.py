"""The audit log does not grow without end: beat deletes rows older than DLQ_AUDIT_RETENTION_DAYS in small batches
(a task on the control queue, hourly), and each batch leaves a row saying how many went and up to when. Every
moment here is pinned: nothing depends on the clock."""

from __future__ import annotations

import datetime as dt

import pytest
from django.conf import settings

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import delete_expired_audit_entries
from dlqconsole.celery import app

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

NOW = dt.datetime(2031, 3, 10, 12, 0, tzinfo=dt.UTC)


def written(action: str, *, days_ago: float, count: int = 1) -> list[int]:
    at = NOW - dt.timedelta(days=days_ago)
    return [AuditEntry.objects.create(action=action, target="pattern:1", created_at=at).pk for _ in range(count)]


def retention_rows() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action="audit.retention").order_by("pk"))


def test_rows_older_than_the_retention_go_in_batches_and_each_batch_says_how_many_and_until_when(settings) -> None:
    settings.DLQ_AUDIT_RETENTION_DAYS = 400
    old = written("pattern.merge", days_ago=401, count=5)
    kept = written("pattern.split", days_ago=399, count=2)

    deleted = delete_expired_audit_entries(now=NOW, batch_size=2)

    rows = retention_rows()
    cutoff = NOW - dt.timedelta(days=400)
    assert deleted == 5
    assert not AuditEntry.objects.filter(pk__in=old).exists()
    assert set(AuditEntry.objects.exclude(action="audit.retention").values_list("pk", flat=True)) == set(kept)
    assert [row.count for row in rows] == [2, 2, 1]
    assert all(row.filter == {"until": cutoff.isoformat()} for row in rows)
    assert all(row.created_at == NOW and row.actor_name == "system" for row in rows)
    assert "older than 400 days" in rows[0].detail and "2030-02-03" in rows[0].detail


def test_a_row_exactly_as_old_as_the_retention_is_kept(settings) -> None:
    settings.DLQ_AUDIT_RETENTION_DAYS = 30
    (boundary,) = written("pattern.merge", days_ago=30)
    (older,) = written("pattern.merge", days_ago=30.001)

    assert delete_expired_audit_entries(now=NOW) == 1

    assert list(AuditEntry.objects.exclude(action="audit.retention").values_list("pk", flat=True)) == [boundary]
    assert older != boundary


def test_a_run_with_nothing_to_delete_writes_nothing() -> None:
    written("pattern.merge", days_ago=1, count=3)

    assert delete_expired_audit_entries(now=NOW) == 0

    assert retention_rows() == []
    assert AuditEntry.objects.count() == 3


def test_the_retention_rows_of_one_run_are_not_taken_by_the_next(settings) -> None:
    settings.DLQ_AUDIT_RETENTION_DAYS = 400
    written("pattern.merge", days_ago=500, count=3)

    first = delete_expired_audit_entries(now=NOW)
    second = delete_expired_audit_entries(now=NOW + dt.timedelta(hours=1))

    assert (first, second) == (3, 0)
    assert [row.count for row in retention_rows()] == [3]


def test_beat_runs_the_retention_hourly_on_the_control_queue() -> None:
    app.loader.import_default_modules()
    entries = [entry for entry in settings.CELERY_BEAT_SCHEDULE.values() if entry["task"] == "accounts.prune_audit"]

    assert [entry["schedule"] for entry in entries] == [3600.0]
    assert "accounts.prune_audit" in settings.CONTROL_TASKS
    assert "accounts.prune_audit" in app.tasks
    route = app.amqp.router.route({}, "accounts.prune_audit", (), {})
    assert route["queue"].name == settings.DLQ_CONTROL_QUEUE
