"""A tick reads what several rules share once for all of them, and the shortcuts read the same facts."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus, GrowthSample
from dlqconsole.deadletters.models import DeadLetter, FailurePattern, PatternStatus
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def statements(capture: CaptureQueriesContext, *fragments: str) -> int:
    return sum(all(fragment in query["sql"] for fragment in fragments) for query in capture.captured_queries)


def test_rules_naming_patterns_read_the_patterns_and_their_counts_once() -> None:
    patterns = []
    failures = [
        ("CardDeclined", "Card declined by the issuer"),
        ("ConnectionError", "Connection reset by peer"),
        ("ValidationError", "Field email is not a valid address"),
        ("SMTPError", "Mailbox unavailable, try again later"),
    ]
    for number, (error_type, message) in enumerate(failures):
        letters = parked(number + 1, queue="orders.dlq", error_type=error_type, message=message)
        patterns.append(letters[0].pattern_id)
    assert len(set(patterns)) == 4
    scoped = [rule("dlq_not_empty", pattern_id=pk) for pk in patterns]
    rule("new_pattern", window_seconds=3600)
    rule("pattern_reopened", window_seconds=3600, queue="orders.dlq")

    with CaptureQueriesContext(connection) as capture:
        evaluate_rules()

    assert statements(capture, '"deadletters_failurepattern"."template"') == 1
    assert statements(capture, 'FROM "deadletters_deadlettercount"', '"pattern_id" IN') == 1
    # What the rules make of it is what they made reading pattern by pattern.
    values = {alert.rule_id: alert.value for alert in Alert.objects.filter(rule__in=scoped)}
    assert values == {alert_rule.pk: number + 1 for number, alert_rule in enumerate(scoped)}


def test_growth_rules_read_their_totals_a_window_ago_in_one_statement() -> None:
    short = rule("dlq_growth", threshold=10, window_seconds=60)
    long = rule("dlq_growth", threshold=10, window_seconds=120)
    parked(5, queue="orders.dlq")
    start = timezone.now()
    evaluate_rules(now=start)
    parked(30, queue="orders.dlq")

    # Half a window later the history is shorter than either window: the oldest total within it is read apart.
    with CaptureQueriesContext(connection) as capture:
        evaluate_rules(now=start + dt.timedelta(seconds=30))
    assert statements(capture, "FROM alerts_growthsample") == 2
    assert {alert.rule_id: alert.value for alert in Alert.objects.open()} == {short.pk: 30, long.pk: 30}

    # Once both windows have history, one statement serves both rules.
    with CaptureQueriesContext(connection) as capture:
        evaluate_rules(now=start + dt.timedelta(seconds=150))
    assert statements(capture, "FROM alerts_growthsample") == 1
    assert Alert.objects.open().count() == 0
    assert GrowthSample.objects.filter(subject="queue:orders.dlq").count() == 3


def test_oldest_age_passes_over_the_dead_letters_of_ignored_patterns() -> None:
    oldest = rule("oldest_age", threshold=3600)
    noisy = parked(2, queue="orders.dlq", message="Card declined for customer 42")
    kept = parked(1, queue="orders.dlq", message="Connection reset by peer 10.0.0.1", error_type="ConnectionError")
    now = timezone.now()
    DeadLetter.objects.filter(pk__in=[letter.pk for letter in noisy]).update(ingested_at=now - dt.timedelta(days=3))
    DeadLetter.objects.filter(pk=kept[0].pk).update(ingested_at=now - dt.timedelta(hours=2))
    FailurePattern.objects.filter(pk=noisy[0].pattern_id).update(status=PatternStatus.IGNORED)

    evaluate_rules(now=now)

    alert = Alert.objects.get(rule=oldest)
    assert alert.status == AlertStatus.FIRING
    assert alert.value == pytest.approx(7200, abs=5)
