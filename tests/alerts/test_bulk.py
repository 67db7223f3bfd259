"""Acknowledging and silencing many alerts at once from the alerts list: roles on the server, CSRF, one audit row
per bulk action, and each alert moved through the same lifecycle step as a single acknowledgement."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus, Channel, Notification, NotificationKind
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true"}


@pytest.fixture
def firing(db: None) -> list[Alert]:
    """Three firing alerts, one per dead-letter queue."""
    rule("dlq_not_empty", reminder_seconds=60)
    for queue in ("orders.dlq", "payments.dlq", "emails.dlq"):
        parked(1, queue=queue)
    evaluate_rules()
    alerts = list(Alert.objects.filter(status=AlertStatus.FIRING).order_by("pk"))
    assert len(alerts) == 3
    return alerts


def statuses(alerts: list[Alert]) -> list[str]:
    return [Alert.objects.get(pk=alert.pk).status for alert in alerts]


def test_operator_acknowledges_ticked_alerts_and_gets_the_list_back(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    client.force_login(operator)
    chosen = firing[:2]

    response = client.post(
        reverse("alerts:bulk"),
        {"action": "acknowledge", "scope": "selected", "ids": [str(alert.pk) for alert in chosen]},
        headers=HTMX,
    )

    assert response.status_code == 200
    body = response.content.decode()
    assert body.strip().startswith('<section id="alert-current"')
    assert "Acknowledged 2 alerts." in body
    assert statuses(firing) == [AlertStatus.ACKNOWLEDGED, AlertStatus.ACKNOWLEDGED, AlertStatus.FIRING]
    assert {Alert.objects.get(pk=alert.pk).acknowledged_by for alert in chosen} == {operator}
    entry = AuditEntry.objects.get(action="alerts.alert.bulk_acknowledge")
    assert entry.actor == operator and entry.count == 2
    # The ids once, in the filter; the detail says what was done to which rules' alerts, in words.
    assert entry.filter == {"ids": [alert.pk for alert in chosen]}
    assert entry.detail == f"acknowledged: {chosen[0].rule.name} (2)"
    # One row for the bulk action, not one per alert.
    assert not AuditEntry.objects.filter(action="alerts.alert.acknowledge").exists()


def test_acknowledging_all_firing_skips_nothing_else_and_stops_reminders(
    client: Client, operator: User, firing: list[Alert], webhook: Channel
) -> None:
    firing[0].rule.channels.set([webhook])
    client.force_login(operator)

    page = client.get(reverse("alerts:list")).content.decode()
    shown = re.findall(r'name="shown" value="(\d+)"', page)
    response = client.post(
        reverse("alerts:bulk"), {"action": "acknowledge", "scope": "firing", "shown": shown}, follow=True
    )

    assert sorted(shown) == sorted(str(alert.pk) for alert in firing)
    assert response.redirect_chain == [(reverse("alerts:list"), 302)]
    assert "Acknowledged 3 alerts." in response.content.decode()
    assert statuses(firing) == [AlertStatus.ACKNOWLEDGED] * 3
    # As with a single acknowledgement, the tick sends no reminder for them when one would be due.
    evaluate_rules(now=timezone.now() + dt.timedelta(minutes=5))
    assert not Notification.objects.filter(kind=NotificationKind.REMINDER).exists()


def test_all_firing_means_the_alerts_the_page_showed_not_one_that_fired_since(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    client.force_login(operator)
    shown = [str(alert.pk) for alert in firing[:2]]  # the third fired after the page was drawn

    response = client.post(
        reverse("alerts:bulk"), {"action": "acknowledge", "scope": "firing", "shown": shown}, headers=HTMX
    )

    assert "Acknowledged 2 alerts." in response.content.decode()
    assert statuses(firing) == [AlertStatus.ACKNOWLEDGED, AlertStatus.ACKNOWLEDGED, AlertStatus.FIRING]


def test_alerts_no_longer_firing_are_skipped_and_named_in_the_audit(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    Alert.objects.filter(pk=firing[1].pk).update(status=AlertStatus.RESOLVED, resolved_at=timezone.now())
    client.force_login(operator)

    response = client.post(
        reverse("alerts:bulk"),
        {"action": "acknowledge", "scope": "selected", "ids": [str(firing[0].pk), str(firing[1].pk)]},
        headers=HTMX,
    )

    body = response.content.decode()
    assert "Acknowledged 1 alert." in body and "1 skipped: no longer firing." in body
    entry = AuditEntry.objects.get(action="alerts.alert.bulk_acknowledge")
    assert (entry.count, entry.filter["ids"], entry.filter["skipped"]) == (1, [firing[0].pk], [firing[1].pk])
    assert entry.detail.endswith("; 1 skipped (no longer firing)")


def test_operator_silences_ticked_alerts(client: Client, operator: User, firing: list[Alert]) -> None:
    client.force_login(operator)

    response = client.post(
        reverse("alerts:bulk"),
        {"action": "silence", "scope": "selected", "duration": "14400", "ids": [str(firing[0].pk), str(firing[2].pk)]},
        headers=HTMX,
    )

    assert response.status_code == 200
    silenced = [Alert.objects.get(pk=alert.pk).silenced_until for alert in firing]
    assert silenced[1] is None
    for until in (silenced[0], silenced[2]):
        assert until is not None
        assert dt.timedelta(hours=3, minutes=59) < until - timezone.now() <= dt.timedelta(hours=4)
    # Silenced, not acknowledged: they still show as firing.
    assert statuses(firing) == [AlertStatus.FIRING] * 3
    entry = AuditEntry.objects.get(action="alerts.alert.bulk_silence")
    assert entry.count == 2 and entry.filter["ids"] == [firing[0].pk, firing[2].pk]
    assert entry.detail.startswith("silenced until ")


def test_viewer_cannot_bulk_acknowledge_or_silence(client: Client, viewer: User, firing: list[Alert]) -> None:
    client.force_login(viewer)
    ids = [str(alert.pk) for alert in firing]

    acknowledge = client.post(reverse("alerts:bulk"), {"action": "acknowledge", "scope": "firing"})
    silence = client.post(reverse("alerts:bulk"), {"action": "silence", "duration": "3600", "ids": ids})

    assert acknowledge.status_code == silence.status_code == 403
    assert statuses(firing) == [AlertStatus.FIRING] * 3
    assert [Alert.objects.get(pk=alert.pk).silenced_until for alert in firing] == [None] * 3
    assert not AuditEntry.objects.filter(action__startswith="alerts.alert").exists()


def test_viewer_sees_no_checkboxes(client: Client, viewer: User, firing: list[Alert]) -> None:
    client.force_login(viewer)

    body = client.get(reverse("alerts:list"), headers=HTMX).content.decode()

    assert 'name="ids"' not in body and 'id="alert-bulk"' not in body


def test_operator_sees_checkboxes_tied_to_the_bulk_form_in_page_and_fragment(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    client.force_login(operator)

    for response in (client.get(reverse("alerts:list")), client.get(reverse("alerts:list"), headers=HTMX)):
        body = response.content.decode()
        assert f'<form id="alert-bulk" class="bulkbar" method="post" action="{reverse("alerts:bulk")}"' in body
        assert f'name="ids" value="{firing[0].pk}" form="alert-bulk"' in body
        assert "all 3 firing" in body


def test_bulk_needs_the_csrf_token(operator: User, firing: list[Alert]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)

    response = client.post(reverse("alerts:bulk"), {"action": "acknowledge", "scope": "firing"})

    assert response.status_code == 403
    assert statuses(firing) == [AlertStatus.FIRING] * 3


def test_bulk_with_nothing_ticked_says_so_and_changes_nothing(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    client.force_login(operator)

    response = client.post(reverse("alerts:bulk"), {"action": "acknowledge", "scope": "selected"}, headers=HTMX)

    assert response.status_code == 200
    assert "Tick the alerts to act on" in response.content.decode()
    assert statuses(firing) == [AlertStatus.FIRING] * 3
    assert not AuditEntry.objects.filter(action__startswith="alerts.alert").exists()


def test_get_is_not_allowed_on_bulk(client: Client, operator: User) -> None:
    client.force_login(operator)

    assert client.get(reverse("alerts:bulk")).status_code == 405


def test_ids_in_other_digits_are_refused_not_a_server_error(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    # '²' and '١' pass str.isdigit() but int() refuses the first; neither names an alert.
    client.force_login(operator)

    response = client.post(
        reverse("alerts:bulk"), {"action": "acknowledge", "scope": "selected", "ids": ["²", "١"]}, headers=HTMX
    )

    assert response.status_code == 200
    assert "Alert ids are whole numbers." in response.content.decode()
    assert statuses(firing) == [AlertStatus.FIRING] * 3
