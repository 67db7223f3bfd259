"""A channel added during an incident is told of the alerts already open when an admin asks: one digest."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.delivery import deliver_notification
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus, Channel, Notification, NotificationKind
from tests.alerts.conftest import Receiver
from tests.conftest import client_for
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db]


def test_a_new_channel_gets_the_open_alerts_once_as_one_digest(
    webhook: Channel, receiver: Receiver, admin_user: User
) -> None:
    firing = rule("dlq_not_empty", channels=[webhook])
    parked(2, queue="orders.dlq")
    parked(1, queue="payments.dlq")
    evaluate_rules()
    assert Alert.objects.filter(rule=firing, status=AlertStatus.FIRING).count() == 2
    late = Channel.objects.create(name="late webhook", kind="webhook", target=receiver.url + "?late")
    firing.channels.add(late)
    evaluate_rules()
    assert not Notification.objects.filter(channel=late).exists()  # nothing new fired: the notice says so

    page = client_for(admin_user).get(f"/alerts/channels/{late.pk}/").content.decode()
    assert f'action="/alerts/channels/{late.pk}/send-open/"' in page
    response = client_for(admin_user).post(f"/alerts/channels/{late.pk}/send-open/", follow=True)

    digest = Notification.objects.get(channel=late)
    assert digest.kind == NotificationKind.DIGEST and digest.context["count"] == 2
    assert digest.context["requested_by"] == admin_user.username
    assert "2 open alerts queued for this channel as one digest." in response.content.decode()
    deliver_notification(notification_id=digest.pk)
    received = receiver.wait_for(lambda item: item.path.endswith("?late"), timeout=5)
    assert received is not None
    assert received.body["event"] == "digest" and received.body["count"] == 2
    assert {notice["label"] for notice in received.body["notices"]} == {"orders.dlq", "payments.dlq"}
    assert AuditEntry.objects.get(action="alerts.channel.send_open").target == f"channel:{late.pk}"


def test_nothing_open_or_a_disabled_channel_is_refused_with_the_reason(webhook: Channel, admin_user: User) -> None:
    rule("dlq_not_empty", channels=[webhook])
    client = client_for(admin_user)

    quiet = client.post(f"/alerts/channels/{webhook.pk}/send-open/", follow=True).content.decode()
    Channel.objects.filter(pk=webhook.pk).update(enabled=False)
    disabled = client.post(f"/alerts/channels/{webhook.pk}/send-open/", follow=True).content.decode()

    assert "No alert of this channel&#x27;s rules is firing or acknowledged now" in quiet
    assert "The channel is disabled" in disabled
    assert not Notification.objects.exists()


def test_only_admins_may_send_the_open_alerts(webhook: Channel, operator: User) -> None:
    rule("dlq_not_empty", channels=[webhook])
    parked(1)
    evaluate_rules()
    before = Notification.objects.count()

    assert client_for(operator).post(f"/alerts/channels/{webhook.pk}/send-open/").status_code == 403
    assert Notification.objects.count() == before
