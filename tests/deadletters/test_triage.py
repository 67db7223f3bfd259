from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import FailurePattern, PatternEvent, PatternStatus
from dlqconsole.deadletters.services import (
    PatternError,
    assign_pattern,
    merge_patterns,
    set_pattern_note,
    set_pattern_status,
)
from tests.deadletters.conftest import Ingest

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


@pytest.fixture
def timeout_pattern(ingest: Ingest) -> FailurePattern:
    return ingest("payment gateway timed out after 30000ms")[0].pattern


def test_status_change_is_recorded_in_history_and_audit(timeout_pattern: FailurePattern, operator: User) -> None:
    set_pattern_status(
        pattern=timeout_pattern, status=PatternStatus.ACKNOWLEDGED, actor=operator, note="PSP incident OPS-12"
    )

    timeout_pattern.refresh_from_db()
    assert timeout_pattern.status == PatternStatus.ACKNOWLEDGED
    event = timeout_pattern.events.get(kind=PatternEvent.Kind.STATUS)
    assert (event.from_status, event.to_status, event.detail, event.actor) == (
        "open",
        "acknowledged",
        "PSP incident OPS-12",
        operator,
    )
    audit = AuditEntry.objects.get(action="pattern.status")
    assert (audit.actor, audit.target) == (operator, f"pattern #{timeout_pattern.pk}")


def test_unknown_status_is_refused(timeout_pattern: FailurePattern, operator: User) -> None:
    with pytest.raises(PatternError, match="'fixed' is not a pattern status"):
        set_pattern_status(pattern=timeout_pattern, status="fixed", actor=operator)

    timeout_pattern.refresh_from_db()
    assert timeout_pattern.status == PatternStatus.OPEN
    assert not timeout_pattern.events.filter(kind=PatternEvent.Kind.STATUS).exists()


def test_setting_the_same_status_again_records_nothing(timeout_pattern: FailurePattern, operator: User) -> None:
    set_pattern_status(pattern=timeout_pattern, status=PatternStatus.OPEN, actor=operator)

    assert not timeout_pattern.events.filter(kind=PatternEvent.Kind.STATUS).exists()
    assert not AuditEntry.objects.filter(action="pattern.status").exists()


def test_owner_and_note_are_set_and_recorded(timeout_pattern: FailurePattern, operator: User, admin_user: User) -> None:
    assign_pattern(pattern=timeout_pattern, owner=operator, actor=admin_user, note="Waiting for the PSP")
    set_pattern_note(pattern=timeout_pattern, note="PSP fixed it, replaying", actor=operator)
    assign_pattern(pattern=timeout_pattern, owner=None, actor=operator)

    timeout_pattern.refresh_from_db()
    assert (timeout_pattern.owner, timeout_pattern.note) == (None, "PSP fixed it, replaying")
    details = list(
        timeout_pattern.events.filter(kind=PatternEvent.Kind.NOTE).order_by("id").values_list("detail", flat=True)
    )
    assert details == [
        "owner nobody → otto-operator; note changed",
        "note changed",
        "owner otto-operator → nobody",
    ]
    assert AuditEntry.objects.filter(action="pattern.assign").count() == 3


def test_inactive_user_cannot_own_a_pattern(timeout_pattern: FailurePattern, operator: User) -> None:
    gone = User.objects.create_user("gone", is_active=False)

    with pytest.raises(PatternError, match="not an active user"):
        assign_pattern(pattern=timeout_pattern, owner=gone, actor=operator)


def test_a_merged_pattern_cannot_be_triaged(ingest: Ingest, operator: User) -> None:
    source = ingest("disk full on worker")[0].pattern
    target = ingest("payment gateway timed out after 30000ms")[0].pattern
    merge_patterns(sources=[source], target=target, actor=operator)

    with pytest.raises(PatternError, match=f"was merged into #{target.pk}"):
        set_pattern_status(pattern=source, status=PatternStatus.RESOLVED, actor=operator)


def test_merge_history_counts_one_dead_letter_in_the_singular(ingest: Ingest, operator: User) -> None:
    source = ingest("disk full on worker")[0].pattern
    target = ingest("payment gateway timed out after 30000ms")[0].pattern
    merge_patterns(sources=[source], target=target, actor=operator)

    absorbed = PatternEvent.objects.get(pattern=target, kind=PatternEvent.Kind.MERGED)
    assert absorbed.detail.startswith(f"Absorbed #{source.pk} (1 dead letter, 1 in all)")


def test_resolved_pattern_reopens_when_a_new_dead_letter_arrives(
    ingest: Ingest, timeout_pattern: FailurePattern, operator: User
) -> None:
    set_pattern_status(pattern=timeout_pattern, status=PatternStatus.RESOLVED, actor=operator)

    ingest("payment gateway timed out after 15000ms")

    timeout_pattern.refresh_from_db()
    assert timeout_pattern.status == PatternStatus.OPEN
    reopened = timeout_pattern.events.get(kind=PatternEvent.Kind.REOPENED)
    assert (reopened.from_status, reopened.to_status) == ("resolved", "open")


def test_ignored_and_acknowledged_patterns_stay_so_when_dead_letters_arrive(ingest: Ingest, operator: User) -> None:
    ignored = ingest("disk full on worker")[0].pattern
    acknowledged = ingest("payment gateway timed out after 30000ms")[0].pattern
    set_pattern_status(pattern=ignored, status=PatternStatus.IGNORED, actor=operator)
    set_pattern_status(pattern=acknowledged, status=PatternStatus.ACKNOWLEDGED, actor=operator)

    ingest("disk full on worker", "payment gateway timed out after 1000ms")

    ignored.refresh_from_db()
    acknowledged.refresh_from_db()
    assert (ignored.status, acknowledged.status) == (PatternStatus.IGNORED, PatternStatus.ACKNOWLEDGED)
    assert not PatternEvent.objects.filter(kind=PatternEvent.Kind.REOPENED).exists()
