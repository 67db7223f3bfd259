"""A rule's expression is typed by people; one that backtracks catastrophically used to hold the ingest process
(or the web worker splitting a pattern) for good. Each search is bounded: at ingest one that runs out counts as no
match; a split (and its preview) that meets one is refused with the reason, as is one that takes too long in all."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters import rule_services
from dlqconsole.deadletters.grouping import rules
from dlqconsole.deadletters.models import DeadLetter, FailurePattern, FingerprintRule
from dlqconsole.deadletters.rule_services import save_fingerprint_rule, split_pattern, split_preview
from dlqconsole.deadletters.services import PatternError
from tests.conftest import client_for
from tests.deadletters.conftest import Ingest

pytestmark = [pytest.mark.django_db]

# (a|aa)+$ on 60 a's and a b tries about 10**12 ways before it fails.
CATASTROPHIC = r"(a|aa)+$"
HOSTILE = "a" * 60 + "b"


@pytest.fixture
def unprobed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the rule had been saved before expressions were probed when saved (or were slow only on real texts
    the probes do not resemble): the bounds at search time must hold on their own."""
    monkeypatch.setattr(rule_services, "_refuse_catastrophic", lambda expression: None)


@pytest.fixture(autouse=True)
def _no_slow_searches_counted() -> None:
    """Slow searches are counted per process by rule id; ids come back on SQLite, where each test rolls back."""
    rules._slow.clear()
    rules._disabling.clear()


def test_a_catastrophic_expression_is_refused_when_a_rule_is_saved(admin_user: User) -> None:
    with pytest.raises(PatternError, match=r"backtracks without end on a text like 'aaa…!'"):
        save_fingerprint_rule(rule=FingerprintRule(name="As", regex=CATASTROPHIC), actor=admin_user)

    assert not FingerprintRule.objects.exists()
    # Ordinary expressions pass the probes at once.
    save_fingerprint_rule(rule=FingerprintRule(name="Timeouts", regex=r"timed out after \d+ ?ms"), actor=admin_user)


def test_a_catastrophic_rule_does_not_stall_ingest(ingest: Ingest, admin_user: User, unprobed: None) -> None:
    rule = save_fingerprint_rule(rule=FingerprintRule(name="As", regex=CATASTROPHIC), actor=admin_user)

    (hostile, plain) = ingest(HOSTILE, "aaaa")

    rule.refresh_from_db()
    assert hostile.pattern_id != rule.pattern_id
    assert plain.pattern_id == rule.pattern_id  # the rule still works where it can answer


def test_a_catastrophic_split_preview_answers(ingest: Ingest, operator: User) -> None:
    (first, _) = ingest(HOSTILE, "a" * 61 + "c")

    response = client_for(operator).post(
        f"/patterns/{first.pattern_id}/split/", {"action": "preview", "name": "As", "regex": CATASTROPHIC}
    )

    assert response.status_code == 200
    assert response.context["split"]["preview"] is None
    assert "backtracks without end" in response.context["split"]["problem"]
    assert "backtracks without end" in response.content.decode()


def test_a_split_whose_rule_runs_out_of_time_is_refused_and_leaves_nothing(
    ingest: Ingest, operator: User, unprobed: None
) -> None:
    (first, second) = ingest(HOSTILE, "a" * 61 + "c")
    pattern = FailurePattern.objects.get(pk=first.pattern_id)
    assert second.pattern_id == pattern.pk

    with pytest.raises(PatternError, match="took longer than 50 ms"):
        split_pattern(pattern=pattern, name="As", regex=CATASTROPHIC, actor=operator)

    assert not FingerprintRule.objects.exists()
    assert set(DeadLetter.objects.values_list("pattern_id", flat=True)) == {pattern.pk}


def test_a_split_that_takes_too_long_in_all_is_refused(
    ingest: Ingest, operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first, _) = ingest("user alice not found", "user bob not found")
    monkeypatch.setattr(rule_services, "SPLIT_TIME_LIMIT", -1.0)
    pattern = FailurePattern.objects.get(pk=first.pattern_id)

    with pytest.raises(PatternError, match="took longer than"):
        split_pattern(pattern=pattern, name="Alice", regex="alice", actor=operator)
    with pytest.raises(PatternError, match="took longer than"):
        split_preview(pattern=pattern, regex="alice")

    assert not FingerprintRule.objects.exists()


def test_a_rule_that_keeps_running_out_of_time_is_disabled_for_everyone_with_the_reason(
    ingest: Ingest, admin_user: User, unprobed: None, django_capture_on_commit_callbacks
) -> None:
    rule = save_fingerprint_rule(rule=FingerprintRule(name="As", regex=CATASTROPHIC), actor=admin_user)
    ingest(HOSTILE, "aaaa")  # one search ran out: the rule stays, and still files what it can answer
    rule.refresh_from_db()
    assert rule.enabled

    with django_capture_on_commit_callbacks(execute=True):
        hostile = ingest(HOSTILE + "1", HOSTILE + "2")  # the second and third within a minute

    rule.refresh_from_db()
    assert not rule.enabled
    assert rule.disabled_reason.startswith(
        "Disabled by ingest: searches of its expression ran past 50 ms 3 times within 60 s (the last on a text "
        "beginning 'aaa"
    )
    assert all(letter.pattern_id != rule.pattern_id for letter in hostile)
    entry = AuditEntry.objects.get(action="fingerprint_rule.disable")
    assert (entry.actor_name, entry.target, entry.detail) == ("system", f"rule #{rule.pk}", rule.disabled_reason)
    # Every process reads the rules again: the next batch is grouped without it, and no search runs out.
    (plain,) = ingest("aaaa")
    assert plain.pattern_id != rule.pattern_id
    assert not rules._slow
    page = client_for(admin_user).get("/admin/deadletters/fingerprintrule/").content.decode()
    assert "Disabled by ingest: searches of its expression ran past 50 ms" in page

    # An admin who enables it again (after making it simpler) clears the reason.
    rule.enabled, rule.regex = True, r"^a+$"
    save_fingerprint_rule(rule=rule, actor=admin_user)
    rule.refresh_from_db()
    assert (rule.enabled, rule.disabled_reason) == (True, "")
    (again,) = ingest("aaaaa")
    assert again.pattern_id == rule.pattern_id


def test_slow_searches_spread_over_more_than_the_window_disable_nothing(
    ingest: Ingest,
    admin_user: User,
    unprobed: None,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks,
) -> None:
    rule = save_fingerprint_rule(rule=FingerprintRule(name="As", regex=CATASTROPHIC), actor=admin_user)
    clock = iter([0.0, 30.0, 61.0])
    monkeypatch.setattr(rules, "_clock", lambda: next(clock))

    with django_capture_on_commit_callbacks(execute=True):
        for n in range(3):
            ingest(HOSTILE + str(n))  # at 0, 30 and 61 s: never three within 60 s

    rule.refresh_from_db()
    assert rule.enabled
    assert not AuditEntry.objects.filter(action="fingerprint_rule.disable").exists()
