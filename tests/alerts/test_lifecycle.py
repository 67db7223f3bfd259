"""The alert lifecycle on real data: cooldown, reminders, silence, acknowledge and recovery notices."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from dlqconsole.alerts.changes import acknowledge_alert, silence_alert
from dlqconsole.alerts.errors import AlertError
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus, Channel, Notification
from tests.alerts.conftest import settle
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def kinds() -> list[str]:
    return list(Notification.objects.order_by("id").values_list("kind", flat=True))


def at(start: dt.datetime, seconds: float) -> dt.datetime:
    return start + dt.timedelta(seconds=seconds)


def test_no_repeat_within_the_cooldown(webhook: Channel) -> None:
    rule("dlq_not_empty", channels=[webhook], cooldown_seconds=300, reminder_seconds=0)
    start = timezone.now()
    letters = parked(1)
    evaluate_rules(now=start)
    settle(letters)
    evaluate_rules(now=at(start, 10))
    assert kinds() == ["firing", "resolved"]

    # It comes back 20 s later: the alert fires on the page, but the channel hears nothing until the cooldown ends.
    again = parked(1)
    evaluate_rules(now=at(start, 20))
    alert = Alert.objects.get(status=AlertStatus.FIRING)
    assert kinds() == ["firing", "resolved"]
    assert alert.next_notify_at == at(start, 310)

    evaluate_rules(now=at(start, 309))
    assert kinds() == ["firing", "resolved"]
    evaluate_rules(now=at(start, 311))
    assert kinds() == ["firing", "resolved", "firing"]
    settle(again)


def test_a_flap_inside_the_cooldown_sends_nothing_at_all(webhook: Channel) -> None:
    rule("dlq_not_empty", channels=[webhook], cooldown_seconds=300)
    start = timezone.now()
    first = parked(1)
    evaluate_rules(now=start)
    settle(first)
    evaluate_rules(now=at(start, 5))
    second = parked(1)
    evaluate_rules(now=at(start, 10))
    settle(second)
    evaluate_rules(now=at(start, 15))

    # The second alert was never announced, so it also ends without a recovery notice.
    assert kinds() == ["firing", "resolved"]
    assert Alert.objects.filter(status=AlertStatus.RESOLVED).count() == 2


def test_reminder_while_still_firing(webhook: Channel) -> None:
    rule("dlq_not_empty", channels=[webhook], reminder_seconds=600)
    start = timezone.now()
    parked(1)
    evaluate_rules(now=start)
    evaluate_rules(now=at(start, 300))
    assert kinds() == ["firing"]

    evaluate_rules(now=at(start, 601))
    evaluate_rules(now=at(start, 900))
    evaluate_rules(now=at(start, 1202))

    assert kinds() == ["firing", "reminder", "reminder"]
    assert Alert.objects.get().notified_count == 3


def test_acknowledged_alert_gets_no_reminders_but_a_recovery_notice(webhook: Channel, operator) -> None:  # type: ignore[no-untyped-def]
    rule("dlq_not_empty", channels=[webhook], reminder_seconds=600)
    start = timezone.now()
    letters = parked(1)
    evaluate_rules(now=start)
    alert = acknowledge_alert(alert=Alert.objects.get(), actor=operator, now=at(start, 60))

    evaluate_rules(now=at(start, 1300))
    assert kinds() == ["firing"]
    assert Alert.objects.get(pk=alert.pk).status == AlertStatus.ACKNOWLEDGED

    settle(letters)
    evaluate_rules(now=at(start, 1310))
    assert kinds() == ["firing", "resolved"]
    assert Alert.objects.get(pk=alert.pk).status == AlertStatus.RESOLVED


def test_only_a_firing_alert_can_be_acknowledged(operator) -> None:  # type: ignore[no-untyped-def]
    rule("dlq_not_empty", for_seconds=60)
    parked(1)
    evaluate_rules()
    pending = Alert.objects.get()

    with pytest.raises(AlertError):
        acknowledge_alert(alert=pending, actor=operator)


def test_silenced_alert_sends_no_reminder_and_no_recovery(webhook: Channel, operator) -> None:  # type: ignore[no-untyped-def]
    rule("dlq_not_empty", channels=[webhook], reminder_seconds=600)
    start = timezone.now()
    letters = parked(1)
    evaluate_rules(now=start)
    silence_alert(alert=Alert.objects.get(), actor=operator, until=at(start, 3600))

    evaluate_rules(now=at(start, 601))
    settle(letters)
    evaluate_rules(now=at(start, 700))

    assert kinds() == ["firing"]
    assert Alert.objects.get().status == AlertStatus.RESOLVED


def test_silence_ends_and_the_alert_speaks_again(webhook: Channel, operator) -> None:  # type: ignore[no-untyped-def]
    rule("dlq_not_empty", channels=[webhook], reminder_seconds=600)
    start = timezone.now()
    parked(1)
    evaluate_rules(now=start)
    silence_alert(alert=Alert.objects.get(), actor=operator, until=at(start, 1000))

    evaluate_rules(now=at(start, 900))
    assert kinds() == ["firing"]
    evaluate_rules(now=at(start, 1001))
    assert kinds() == ["firing", "reminder"]


def test_silenced_rule_holds_back_the_first_notice_until_the_silence_ends(webhook: Channel) -> None:
    start = timezone.now()
    rule("dlq_not_empty", channels=[webhook], silenced_until=at(start, 120))
    parked(1)

    evaluate_rules(now=start)
    assert Alert.objects.get().status == AlertStatus.FIRING
    assert kinds() == []

    evaluate_rules(now=at(start, 121))
    assert kinds() == ["firing"]


def test_a_rule_without_channels_still_raises_alerts() -> None:
    rule("dlq_not_empty")
    parked(1)

    evaluate_rules()

    alert = Alert.objects.get()
    assert alert.status == AlertStatus.FIRING
    # Nobody was told: the alert does not count a notice that went nowhere.
    assert (alert.notified_count, alert.last_notified_at) == (0, None)
    assert kinds() == []


def test_an_alert_nobody_was_told_about_is_announced_as_firing_once_a_channel_exists(webhook: Channel) -> None:
    alert_rule = rule("dlq_not_empty", reminder_seconds=600)
    start = timezone.now()
    parked(1)
    evaluate_rules(now=start)
    alert_rule.channels.set([webhook])

    evaluate_rules(now=at(start, 601))

    # Its first notice, not a reminder of one nobody received.
    assert kinds() == ["firing"]
    alert = Alert.objects.get()
    assert (alert.notified_count, alert.last_notified_at) == (1, at(start, 601))


def test_an_alert_nobody_was_told_about_resolves_without_a_recovery_notice(webhook: Channel) -> None:
    alert_rule = rule("dlq_not_empty", reminder_seconds=600)
    start = timezone.now()
    letters = parked(1)
    evaluate_rules(now=start)
    alert_rule.channels.set([webhook])

    settle(letters)
    evaluate_rules(now=at(start, 10))

    assert Alert.objects.get().status == AlertStatus.RESOLVED
    assert kinds() == []
