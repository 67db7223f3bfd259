"""An alert whose rule (or itself) is silenced still fires and shows, marked "silenced until <time with zone>" on
the alerts list, its page and the dashboard's firing alerts card: it does not read as a plain "Firing" that
somebody is being told about."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from dlqconsole.alerts.changes import silence_rule
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true"}


@pytest.fixture
def firing_alert(db: None) -> Alert:
    rule("dlq_not_empty")
    parked(1, queue="orders.dlq")
    evaluate_rules()
    return Alert.objects.select_related("rule").get(status=AlertStatus.FIRING)


def pages(client: Client, alert: Alert) -> dict[str, str]:
    return {
        "list": client.get(reverse("alerts:list")).content.decode(),
        "list fragment": client.get(reverse("alerts:list"), headers=HTMX).content.decode(),
        "detail": client.get(reverse("alerts:detail", args=[alert.pk])).content.decode(),
        "dashboard": client.get(reverse("dashboard")).content.decode(),
    }


@override_settings(TIME_ZONE="Europe/Berlin")
def test_alerts_of_a_silenced_rule_are_marked_silenced_everywhere(
    client: Client, viewer: User, firing_alert: Alert
) -> None:
    until = dt.datetime(2099, 11, 26, 7, 23, tzinfo=dt.UTC)
    silence_rule(rule=firing_alert.rule, actor=None, until=until)
    # An alert raised after the rule was silenced carries no silence of its own.
    firing_alert.refresh_from_db()
    assert firing_alert.silenced_until is None
    client.force_login(viewer)

    for name, html in pages(client, firing_alert).items():
        # The list and the dashboard: "silenced until <time>"; the alert's page: a "Silenced until" line.
        assert re.search(r"silenced until( |</dt><dd>)2099-11-26 08:23:00 CET", html, re.IGNORECASE), name


def test_an_alert_silenced_on_its_own_is_marked_with_its_time(
    client: Client, viewer: User, firing_alert: Alert
) -> None:
    until = timezone.now() + dt.timedelta(hours=1)
    Alert.objects.filter(pk=firing_alert.pk).update(silenced_until=until)
    client.force_login(viewer)
    local = timezone.localtime(until)

    for name, html in pages(client, firing_alert).items():
        assert re.search(f"silenced until( |</dt><dd>){local:%Y-%m-%d %H:%M:%S} UTC", html, re.IGNORECASE), name
        assert "whole rule" not in html, name


def test_an_ended_silence_leaves_no_marker(client: Client, viewer: User, firing_alert: Alert) -> None:
    past = timezone.now() - dt.timedelta(minutes=1)
    Alert.objects.filter(pk=firing_alert.pk).update(silenced_until=past)
    silence_rule(rule=firing_alert.rule, actor=None, until=past)
    client.force_login(viewer)

    for name, html in pages(client, firing_alert).items():
        assert "silenced until" not in html.lower(), name
