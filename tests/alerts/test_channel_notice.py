"""A new channel hears nothing of alerts already firing: its form and its page say so, and what it will receive
is what the evaluation does (checked here against the real tick)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus, Channel, Notification, NotificationKind
from tests.alerts.conftest import settle
from tests.conftest import client_for
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db]

NOTICE = "Alerts already firing are not sent again to a new channel"


@pytest.mark.parametrize("page", ["alerts:channel-new", "alerts:channel-edit", "alerts:channel"])
def test_the_form_and_the_page_say_that_firing_alerts_are_not_resent(admin_user: User, page: str) -> None:
    channel = Channel.objects.create(name="ops", kind="email", target="ops@example.com")
    args = [] if page == "alerts:channel-new" else [channel.pk]

    html = client_for(admin_user).get(reverse(page, args=args)).content.decode()

    assert NOTICE in html
    assert "reminders of alerts still firing and not acknowledged" in html
    assert "recovery notice" in html


def test_what_the_notice_says_is_what_the_tick_does(db: None) -> None:
    old = Channel.objects.create(name="old", kind="email", target="old@example.com")
    watching = rule("dlq_not_empty", channels=[old], reminder_seconds=3600)
    letters = parked(2, queue="orders.dlq")
    now = timezone.now()
    evaluate_rules(now=now)
    alert = Alert.objects.get(status=AlertStatus.FIRING)

    new = Channel.objects.create(name="new", kind="email", target="new@example.com")
    watching.channels.add(new)
    evaluate_rules(now=now + dt.timedelta(minutes=5))
    # Not re-sent when attached.
    assert not Notification.objects.filter(channel=new).exists()

    evaluate_rules(now=now + dt.timedelta(hours=1, seconds=1))
    assert list(Notification.objects.filter(channel=new).values_list("kind", flat=True)) == [NotificationKind.REMINDER]

    settle(letters)
    evaluate_rules(now=now + dt.timedelta(hours=1, minutes=1))
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED
    assert list(Notification.objects.filter(channel=new).order_by("pk").values_list("kind", flat=True)) == [
        NotificationKind.REMINDER,
        NotificationKind.RESOLVED,
    ]
