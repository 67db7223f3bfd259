"""Each rule kind fires on real data (dead letters stored through ingest, counters kept exact) and resolves."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from dlqconsole.alerts.defaults import DEFAULT_RULES, install_default_rules
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus, Channel, Notification, NotificationKind
from dlqconsole.brokers.models import Broker
from dlqconsole.core.breaker import NACK, BreakerConfig, Event, get_breakers
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailurePattern, PatternStatus
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from tests.alerts.conftest import settle
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def open_alerts(alert_rule: AlertRule) -> dict[str, Alert]:
    return {alert.subject: alert for alert in Alert.objects.open().filter(rule=alert_rule)}


def test_default_rules_exist_after_migrate() -> None:
    names = set(AlertRule.objects.values_list("name", flat=True))
    assert {fields["name"] for fields in DEFAULT_RULES} <= names
    assert install_default_rules(AlertRule) == 0


def test_first_dead_letter_fires_the_default_rule_and_notifies(webhook: Channel) -> None:
    webhook.rules.add(*AlertRule.objects.all())
    assert evaluate_rules().fired == 0

    parked(1, queue="orders.dlq")
    evaluate_rules()

    alert = Alert.objects.get(rule__name="Dead letters waiting")
    assert (alert.status, alert.subject, alert.value) == (AlertStatus.FIRING, "queue:orders.dlq", 1)
    assert Notification.objects.filter(alert=alert, kind=NotificationKind.FIRING, channel=webhook).count() == 1


def test_not_empty_resolves_when_dead_letters_are_dealt_with(webhook: Channel) -> None:
    not_empty = rule("dlq_not_empty", channels=[webhook])
    letters = parked(3, queue="payments.dlq")
    evaluate_rules()
    assert open_alerts(not_empty)["queue:payments.dlq"].value == 3

    settle(letters[:2])
    evaluate_rules()
    assert open_alerts(not_empty)["queue:payments.dlq"].value == 1

    settle(letters[2:], status=DeadLetterStatus.ARCHIVED)
    evaluate_rules()
    alert = Alert.objects.get(rule=not_empty)
    assert alert.status == AlertStatus.RESOLVED
    assert list(alert.notifications.values_list("kind", flat=True).order_by("id")) == ["firing", "resolved"]


def test_ignored_patterns_do_not_alert() -> None:
    not_empty = rule("dlq_not_empty")
    letters = parked(2, queue="orders.dlq", message="Card declined for customer 42")
    FailurePattern.objects.filter(pk=letters[0].pattern_id).update(status=PatternStatus.IGNORED)

    evaluate_rules()
    assert open_alerts(not_empty) == {}

    parked(1, queue="orders.dlq", message="Connection reset by peer 10.0.0.1:5432", error_type="ConnectionError")
    evaluate_rules()
    assert open_alerts(not_empty)["queue:orders.dlq"].value == 1


def test_queue_scope_matches_the_work_queue_or_its_dlq() -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    by_work_queue = rule("dlq_not_empty", queue="orders")
    parked(1, queue="orders.dlq")
    parked(1, queue="emails.dlq", message="SMTP 451 try later", error_type="SMTPError")

    evaluate_rules()

    assert set(open_alerts(by_work_queue)) == {"queue:orders.dlq"}


def test_pattern_scope_counts_only_that_pattern() -> None:
    timeouts = parked(2, queue="orders.dlq")
    parked(5, queue="orders.dlq", message="Validation failed: field email", error_type="ValidationError")
    pattern_rule = rule("dlq_not_empty", pattern=FailurePattern.objects.get(pk=timeouts[0].pattern_id))

    evaluate_rules()

    alerts = open_alerts(pattern_rule)
    assert list(alerts) == [f"pattern:{timeouts[0].pattern_id}"]
    assert alerts[f"pattern:{timeouts[0].pattern_id}"].value == 2


def test_dead_letters_still_in_the_broker_count_as_waiting() -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    not_empty = rule("dlq_not_empty")
    QueueSample.objects.create(queue="orders.dlq", messages=7, consumers=0)

    evaluate_rules()

    alert = open_alerts(not_empty)["queue:orders.dlq"]
    assert alert.value == 7
    assert "7 not yet ingested" in alert.summary


def test_growth_fires_above_the_rate_and_resolves_when_it_slows() -> None:
    growth = rule("dlq_growth", threshold=100, window_seconds=60, severity="critical")
    start = timezone.now()
    parked(5, queue="orders.dlq")
    evaluate_rules(now=start)
    assert open_alerts(growth) == {}

    parked(150, queue="orders.dlq")
    evaluate_rules(now=start + dt.timedelta(seconds=30))
    alert = open_alerts(growth)["queue:orders.dlq"]
    assert (alert.status, alert.value, alert.severity) == (AlertStatus.FIRING, 150, "critical")

    parked(20, queue="orders.dlq")
    evaluate_rules(now=start + dt.timedelta(seconds=60))
    assert open_alerts(growth)["queue:orders.dlq"].value == 170

    # A window after the burst only 20 more arrived: below the threshold.
    evaluate_rules(now=start + dt.timedelta(seconds=125))
    assert open_alerts(growth) == {}
    assert Alert.objects.get(rule=growth).status == AlertStatus.RESOLVED


def test_shed_dead_letters_are_no_growth() -> None:
    """Shed messages are taken off a flooded work queue on purpose: they page no one."""
    growth = rule("dlq_growth", threshold=100, window_seconds=60, severity="critical")
    start = timezone.now()
    parked(5, queue="orders")
    evaluate_rules(now=start)

    parked(150, queue="orders", reason="SHED")
    evaluate_rules(now=start + dt.timedelta(seconds=30))
    assert open_alerts(growth) == {}

    parked(150, queue="orders")
    evaluate_rules(now=start + dt.timedelta(seconds=60))
    assert open_alerts(growth)["queue:orders"].value == 150


def test_shed_dead_letters_waiting_are_no_dead_letters_waiting() -> None:
    """Restored and waiting for their retry, shed messages still page no one."""
    waiting = rule("dlq_not_empty", threshold=0)
    parked(3, queue="orders", reason="SHED")

    evaluate_rules(now=timezone.now())

    assert open_alerts(waiting) == {}


def test_growth_ignores_dead_letters_that_only_moved_from_broker_to_database() -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    growth = rule("dlq_growth", threshold=100, window_seconds=60)
    start = timezone.now()
    QueueSample.objects.create(queue="orders.dlq", messages=120, consumers=0, sampled_at=start)
    evaluate_rules(now=start)

    # The consumer drains the 120 into the database: nothing new arrived.
    parked(120, queue="orders.dlq")
    QueueSample.objects.create(queue="orders.dlq", messages=0, consumers=1, sampled_at=start + dt.timedelta(seconds=5))
    evaluate_rules(now=start + dt.timedelta(seconds=10))

    assert open_alerts(growth) == {}


def test_unignoring_a_pattern_is_not_growth() -> None:
    growth = rule("dlq_growth", threshold=100, window_seconds=60)
    letters = parked(300, queue="orders.dlq", message="Card declined for customer 42")
    FailurePattern.objects.filter(pk=letters[0].pattern_id).update(status=PatternStatus.IGNORED)
    start = timezone.now()
    evaluate_rules(now=start)

    FailurePattern.objects.filter(pk=letters[0].pattern_id).update(status=PatternStatus.OPEN)
    evaluate_rules(now=start + dt.timedelta(seconds=10))
    evaluate_rules(now=start + dt.timedelta(seconds=20))

    assert open_alerts(growth) == {}


def test_new_pattern_fires_and_resolves_when_triaged() -> None:
    new_pattern = rule("new_pattern", window_seconds=3600)
    letters = parked(2, queue="orders.dlq", message="KeyError: 'customer_id'", error_type="KeyError")
    evaluate_rules()
    subject = f"pattern:{letters[0].pattern_id}"
    alert = open_alerts(new_pattern)[subject]
    assert alert.status == AlertStatus.FIRING
    assert "KeyError" in alert.summary or "customer_id" in alert.summary

    FailurePattern.objects.filter(pk=letters[0].pattern_id).update(status=PatternStatus.ACKNOWLEDGED)
    evaluate_rules()

    assert open_alerts(new_pattern) == {}


def test_new_pattern_resolves_when_its_dead_letters_are_gone_and_old_patterns_never_fire() -> None:
    old = parked(1, queue="orders.dlq", message="Old failure", error_type="OldError")
    FailurePattern.objects.filter(pk=old[0].pattern_id).update(first_seen_at=timezone.now() - dt.timedelta(days=2))
    new_pattern = rule("new_pattern", window_seconds=3600)
    letters = parked(2, queue="orders.dlq", message="Brand new failure", error_type="NewError")
    evaluate_rules()
    assert set(open_alerts(new_pattern)) == {f"pattern:{letters[0].pattern_id}"}

    settle(letters)
    evaluate_rules()

    assert open_alerts(new_pattern) == {}


def test_patterns_named_by_a_person_are_not_new(operator) -> None:  # type: ignore[no-untyped-def]
    from dlqconsole.deadletters.rule_services import split_pattern

    letters = parked(2, queue="orders.dlq", message="user alice not found", error_type="LookupError")
    letters += parked(1, queue="orders.dlq", message="user svc-import not found", error_type="LookupError")
    pattern = DeadLetter.objects.get(pk=letters[0].pk).pattern  # the second batch mined "user <*> not found"
    assert DeadLetter.objects.get(pk=letters[2].pk).pattern_id == pattern.pk
    FailurePattern.objects.filter(pk=pattern.pk).update(status=PatternStatus.ACKNOWLEDGED)
    new_pattern = rule("new_pattern", window_seconds=3600)

    part = split_pattern(pattern=pattern, name="service accounts", regex="svc-", actor=operator)
    FailurePattern.objects.filter(pk=part.pk).update(status=PatternStatus.OPEN)  # even left open
    evaluate_rules()

    assert open_alerts(new_pattern) == {}
    fresh = parked(1, queue="orders.dlq", message="Brand new failure", error_type="NewError")
    evaluate_rules()
    assert set(open_alerts(new_pattern)) == {f"pattern:{fresh[0].pattern_id}"}


def test_reopened_pattern_fires_and_resolves_when_resolved_again() -> None:
    reopened = rule("pattern_reopened", window_seconds=3600)
    letters = parked(1, queue="orders.dlq", message="Payment gateway 502", error_type="GatewayError")
    pattern = FailurePattern.objects.get(pk=letters[0].pattern_id)
    pattern.status = PatternStatus.RESOLVED
    pattern.save()
    evaluate_rules()
    assert open_alerts(reopened) == {}

    parked(1, queue="orders.dlq", message="Payment gateway 502", error_type="GatewayError")
    evaluate_rules()
    alert = open_alerts(reopened)[f"pattern:{pattern.pk}"]
    assert alert.status == AlertStatus.FIRING

    FailurePattern.objects.filter(pk=pattern.pk).update(status=PatternStatus.RESOLVED)
    evaluate_rules()
    assert open_alerts(reopened) == {}


def test_oldest_dead_letter_age() -> None:
    oldest = rule("oldest_age", threshold=3600)
    letters = parked(2, queue="orders.dlq")
    evaluate_rules()
    assert open_alerts(oldest) == {}

    later = timezone.now() + dt.timedelta(hours=2)
    evaluate_rules(now=later)
    alert = open_alerts(oldest)["queue:orders.dlq"]
    assert alert.value > 7000

    settle(letters)
    evaluate_rules(now=later + dt.timedelta(seconds=2))
    assert open_alerts(oldest) == {}


def test_condition_must_hold_for_the_rules_duration() -> None:
    not_empty = rule("dlq_not_empty", for_seconds=30)
    start = timezone.now()
    letters = parked(1, queue="orders.dlq")
    evaluate_rules(now=start)
    assert open_alerts(not_empty)["queue:orders.dlq"].status == AlertStatus.PENDING

    evaluate_rules(now=start + dt.timedelta(seconds=31))
    assert open_alerts(not_empty)["queue:orders.dlq"].status == AlertStatus.FIRING

    settle(letters)
    evaluate_rules(now=start + dt.timedelta(seconds=40))
    assert Alert.objects.get(rule=not_empty).status == AlertStatus.RESOLVED


def test_pending_alert_that_clears_leaves_nothing() -> None:
    not_empty = rule("dlq_not_empty", for_seconds=30)
    letters = parked(1, queue="orders.dlq")
    evaluate_rules()
    settle(letters)
    evaluate_rules()

    assert not Alert.objects.filter(rule=not_empty).exists()


def test_disabling_a_rule_ends_its_alerts_without_a_notice(webhook: Channel) -> None:
    not_empty = rule("dlq_not_empty", channels=[webhook])
    parked(1, queue="orders.dlq")
    evaluate_rules()
    AlertRule.objects.filter(pk=not_empty.pk).update(enabled=False)

    evaluate_rules()

    assert Alert.objects.get(rule=not_empty).status == AlertStatus.RESOLVED
    assert list(Notification.objects.values_list("kind", flat=True)) == ["firing"]


def test_operation_paused_by_its_safeguards_fires_and_resolves_on_resume(operator) -> None:  # type: ignore[no-untyped-def]
    from dlqconsole.operations.models import Operation, OperationKind, OperationStatus

    paused = rule("operation_paused", severity="critical")
    breaker = Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.PAUSED,
        filter={"queue": ["orders.dlq"]},
        total=100,
        succeeded=40,
        pause_reason="publishing keeps failing: 5 failures in a row; the last: connection reset",
        paused_automatically=True,
    )
    # Paused by a person, whatever the reason they gave: they know already.
    Operation.objects.create(
        kind=OperationKind.MOVE, status=OperationStatus.PAUSED, total=5, pause_reason="publishing keeps failing"
    )

    evaluate_rules()

    alert = open_alerts(paused)[f"operation:{breaker.pk}"]
    assert set(open_alerts(paused)) == {f"operation:{breaker.pk}"}
    assert alert.severity == "critical"
    assert "publishing keeps failing" in alert.summary and "40 of 100 done" in alert.summary
    assert alert.link.endswith(f"/operations/{breaker.pk}/")

    Operation.objects.filter(pk=breaker.pk).update(status=OperationStatus.RUNNING, pause_reason="")
    evaluate_rules()
    assert open_alerts(paused) == {}


def test_a_long_pattern_name_in_a_summary_is_cut_at_a_word() -> None:
    from dlqconsole.alerts.conditions import LABEL_CHARS, PatternFacts, _pattern_label

    words = "UniqueViolation at orders/handlers.py:handle_order_created → clients/base.py:call: duplicate key value"
    long = PatternFacts(
        pk=7, status="open", template=words + " violates unique constraint <*> " * 3, total_count=1, merged=False
    )

    label = _pattern_label(long)

    assert label.endswith("…") and len(label) <= LABEL_CHARS
    assert long.template.startswith(label[:-1]) and long.template[len(label) - 1] == " "
    assert _pattern_label(PatternFacts(pk=8, status="open", template="", total_count=0, merged=False)) == "pattern #8"


def test_a_circuit_breaker_that_opens_fires_until_it_closes() -> None:
    orders = f"orders-{uuid.uuid4().hex[:8]}"
    staging = Broker.objects.create(name=f"staging-{uuid.uuid4().hex[:6]}", url="amqp://guest:guest@localhost/x")
    breakers = get_breakers()
    config = BreakerConfig.from_settings()
    keys = [f"queue:{orders}", f"broker:{staging.name}:queue:{orders}"]
    for key in keys:
        breakers.record(key, [Event(NACK, reason="refused")] * config.failures, config=config)
    everywhere = rule("breaker_open", severity="critical")
    on_staging = rule("breaker_open", broker=staging)
    on_its_dlq = rule("breaker_open", queue=f"{orders}.dlq")
    elsewhere = rule("breaker_open", queue="payments")
    try:
        evaluate_rules()

        assert {f"breaker:{key}" for key in keys} <= set(open_alerts(everywhere))
        assert set(open_alerts(on_staging)) == {f"breaker:{keys[1]}"}
        assert set(open_alerts(on_its_dlq)) == {f"breaker:{key}" for key in keys}
        assert open_alerts(elsewhere) == {}
        alert = open_alerts(everywhere)[f"breaker:{keys[0]}"]
        assert alert.severity == "critical"
        assert alert.summary.startswith(f"Circuit open for queue {orders}: {config.failures} failures in a row")
        assert "replays into it wait (probing at " in alert.summary

        breakers.close(keys[0])
        evaluate_rules()
        assert set(open_alerts(on_its_dlq)) == {f"breaker:{keys[1]}"}
    finally:
        for key in keys:
            breakers.close(key)


def test_the_breaker_rule_is_installed_by_default() -> None:
    assert AlertRule.objects.filter(kind="breaker_open", name="Circuit breaker open", enabled=True).exists()
