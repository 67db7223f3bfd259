"""Every time on the alert, rule and channel pages names its zone ("2026-11-26 08:23:00 CET"): an on-call engineer
in another zone than the console read "silenced until Nov 26, 08:23" and could not tell when that was."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from dlqconsole.alerts.models import Alert, AlertStatus, Channel, Notification, NotificationStatus
from tests.factories import rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true"}


def utc(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2099, 11, 26, hour, minute, 5, 250000, tzinfo=dt.UTC)


def local(moment: dt.datetime) -> str:
    """The stamp of a moment in Europe/Berlin (CET in November), to the second."""
    return f"{moment + dt.timedelta(hours=1):%Y-%m-%d %H:%M:%S} CET"


@pytest.fixture
def times() -> dict[str, dt.datetime]:
    return {
        "started": utc(7),
        "fired": utc(7, 1),
        "acknowledged": utc(7, 2),
        "resolved": utc(7, 3),
        "notified": utc(7, 4),
        "silenced": utc(9, 23),
        "created": utc(7, 5),
        "retry": utc(7, 6),
        "disabled": utc(7, 7),
    }


@override_settings(TIME_ZONE="Europe/Berlin")
def test_alert_page_times_name_their_zone(client: Client, admin_user: User, times: dict[str, dt.datetime]) -> None:
    channel = Channel.objects.create(name="hook", kind="webhook", target="http://127.0.0.1:9/")
    alert = Alert.objects.create(
        rule=rule("dlq_not_empty", channels=[channel]),
        subject="queue:orders.dlq",
        subject_label="orders.dlq",
        severity="warning",
        status=AlertStatus.ACKNOWLEDGED,
        summary="3 dead letters wait",
        started_at=times["started"],
        fired_at=times["fired"],
        acknowledged_at=times["acknowledged"],
        silenced_until=times["silenced"],
        last_notified_at=times["notified"],
        notified_count=1,
    )
    Notification.objects.create(channel=channel, alert=alert, kind="firing", status="sent", created_at=times["created"])
    client.force_login(admin_user)

    html = client.get(reverse("alerts:detail", args=[alert.pk])).content.decode()
    listing = client.get(reverse("alerts:list")).content.decode()

    for name in ("started", "fired", "acknowledged", "notified", "silenced", "created"):
        assert local(times[name]) in html, name
    assert f"silenced until {local(times['silenced'])}" in listing
    assert f'title="{local(times["fired"])}"' in listing

    Alert.objects.filter(pk=alert.pk).update(status=AlertStatus.RESOLVED, resolved_at=times["resolved"])
    history = client.get(reverse("alerts:list"), headers={**HTMX, "HX-Target": "alert-history"}).content.decode()
    assert local(times["fired"]) in history and local(times["resolved"]) in history


@override_settings(TIME_ZONE="Europe/Berlin")
def test_rule_and_channel_page_times_name_their_zone(
    client: Client, admin_user: User, times: dict[str, dt.datetime]
) -> None:
    rule("dlq_not_empty", silenced_until=times["silenced"])
    channel = Channel.objects.create(
        name="hook", kind="webhook", target="http://127.0.0.1:9/", enabled=False, disabled_at=times["disabled"]
    )
    Notification.objects.create(
        channel=channel,
        kind="test",
        status=NotificationStatus.RETRYING,
        created_at=times["created"],
        next_attempt_at=times["retry"],
    )
    client.force_login(admin_user)

    rules = client.get(reverse("alerts:rules")).content.decode()
    page = client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()

    assert f"silenced until {local(times['silenced'])}" in rules
    for name in ("disabled", "created", "retry"):
        assert local(times[name]) in page, name


@override_settings(TIME_ZONE="Europe/Berlin")
def test_silence_confirmation_names_the_zone(client: Client, admin_user: User) -> None:
    silenced = rule("dlq_not_empty")
    client.force_login(admin_user)

    response = client.post(reverse("alerts:rule-silence", args=[silenced.pk]), {"duration": "3600"}, follow=True)

    assert re.search(r"silenced until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d CET\.", response.content.decode())
