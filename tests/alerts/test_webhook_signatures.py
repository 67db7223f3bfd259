"""Webhook and Slack-compatible notifications are signed the Standard Webhooks way, with a secret per channel that
an admin sees once (when the channel is made or its secret rotated): a real receiver on 127.0.0.1 verifies them
with the `standardwebhooks` library, and refuses a tampered body, id or timestamp and another channel's secret."""

from __future__ import annotations

import base64
import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.delivery import deliver_notification, enqueue_due_notifications, send_test_notification
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Channel, Notification, NotificationKind, NotificationStatus
from dlqconsole.alerts.tasks import send_notification
from tests.alerts.conftest import Received, Receiver
from tests.conftest import client_for
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

# A signing secret as the pages show it (whsec_ and standard base64).
SECRET = re.compile(r"whsec_[A-Za-z0-9+/]+=*")


def shown_secrets(html: str) -> list[str]:
    return SECRET.findall(html)


def make_channel(client: Client, *, name: str, kind: str, target: str) -> tuple[Channel, str]:
    """Make a channel on the console's form; return it and the secret the page after it shows."""
    response = client.post(reverse("alerts:channel-new"), {"name": name, "kind": kind, "target": target}, follow=True)
    assert response.status_code == 200
    (secret,) = shown_secrets(response.content.decode())
    return Channel.objects.get(name=name), secret


def verify(secret: str, request: Received) -> Any:
    return Webhook(secret).verify(request.raw, request.headers)


def firing_notification(channel: Channel) -> Notification:
    rule("dlq_not_empty", channels=[channel])
    parked(2, queue="orders.dlq")
    evaluate_rules()
    return Notification.objects.get(channel=channel, kind=NotificationKind.FIRING)


def send_test(channel: Channel) -> Notification:
    notification = send_test_notification(channel=channel, actor=None)
    send_notification(notification.pk)
    notification.refresh_from_db()
    assert notification.status == NotificationStatus.SENT, notification.error
    return notification


# Receivers verify what is sent ---------------------------------------------------------------------------------


def test_a_firing_notice_verifies_with_the_standard_webhooks_library(admin_user: User, receiver: Receiver) -> None:
    channel, secret = make_channel(client_for(admin_user), name="signed", kind="webhook", target=receiver.url)
    notification = firing_notification(channel)

    # The Celery task's own function, run here: what a worker does with the notification.
    send_notification(notification.pk)

    (request,) = receiver.received
    payload = verify(secret, request)
    assert payload == request.body
    assert (payload["event"], payload["subject"]) == ("firing", "queue:orders.dlq")
    assert request.headers["webhook-id"] == f"msg_{notification.webhook_id.hex}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-signature"].startswith("v1,")


def test_a_slack_compatible_notification_is_signed_too(admin_user: User, receiver: Receiver) -> None:
    channel, secret = make_channel(client_for(admin_user), name="chat", kind="slack", target=receiver.url)

    send_test(channel)

    (request,) = receiver.received
    assert set(verify(secret, request)) == {"text"}


@pytest.mark.parametrize("tamper", ["body", "timestamp", "id", "another channel's secret"])
def test_a_tampered_notification_or_another_channels_secret_fails_verification(
    admin_user: User, receiver: Receiver, tamper: str
) -> None:
    client = client_for(admin_user)
    channel, secret = make_channel(client, name="signed", kind="webhook", target=receiver.url)
    _, other_secret = make_channel(client, name="other", kind="webhook", target=f"{receiver.url}/other")
    send_test(channel)
    (request,) = receiver.received
    verify(secret, request)  # as sent, it verifies

    raw, headers, key = request.raw, dict(request.headers), secret
    if tamper == "body":
        raw = raw.replace(b'"severity": "info"', b'"severity": "critical"')
        assert raw != request.raw
    elif tamper == "timestamp":
        # A second earlier: well inside the 5 minutes' tolerance, so only the signature can refuse it.
        headers["webhook-timestamp"] = str(int(headers["webhook-timestamp"]) - 1)
    elif tamper == "id":
        headers["webhook-id"] = "msg_replayed"
    else:
        key = other_secret

    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(key).verify(raw, headers)


def test_a_retried_notification_keeps_its_id_and_another_notification_gets_its_own(
    admin_user: User, receiver: Receiver
) -> None:
    channel, secret = make_channel(client_for(admin_user), name="signed", kind="webhook", target=receiver.url)
    notification = firing_notification(channel)
    receiver.status = 503
    deliver_notification(notification_id=notification.pk)
    notification.refresh_from_db()
    assert notification.status == NotificationStatus.RETRYING
    receiver.status = 200

    assert notification.next_attempt_at is not None
    enqueue_due_notifications(now=notification.next_attempt_at)
    deliver_notification(notification_id=notification.pk)
    send_test(channel)

    notification.refresh_from_db()
    assert (notification.status, notification.attempts) == (NotificationStatus.SENT, 2)
    first, retried, other = receiver.received
    assert first.headers["webhook-id"] == retried.headers["webhook-id"] == f"msg_{notification.webhook_id.hex}"
    assert other.headers["webhook-id"] != first.headers["webhook-id"]
    for request in (first, retried, other):
        verify(secret, request)


def test_every_channel_is_made_with_a_secret_of_its_own() -> None:
    first = Channel.objects.create(name="a", kind="webhook", target="http://127.0.0.1:9/a")
    second = Channel.objects.create(name="b", kind="slack", target="http://127.0.0.1:9/b")

    assert first.signing_secret != second.signing_secret
    for channel in (first, second):
        assert channel.signing_secret.startswith("whsec_")
        assert len(base64.b64decode(channel.signing_secret.removeprefix("whsec_"))) == 32


# Shown once ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["webhook", "slack"])
def test_the_secret_is_shown_once_on_the_page_after_the_channel_is_made(admin_user: User, kind: str) -> None:
    client = client_for(admin_user)

    response = client.post(
        reverse("alerts:channel-new"),
        {"name": "signed", "kind": kind, "target": "https://hooks.example.com/services/T/B/x"},
        follow=True,
    )

    channel = Channel.objects.get(name="signed")
    assert response.redirect_chain == [(reverse("alerts:channel", args=[channel.pk]), 302)]
    assert shown_secrets(response.content.decode()) == [channel.signing_secret]
    # Neither the browser nor a proxy keeps the page that shows it.
    assert "no-store" in response["Cache-Control"]
    later = [
        client.get(reverse("alerts:channel", args=[channel.pk])),
        client.get(reverse("alerts:channel", args=[channel.pk]), headers={"HX-Request": "true"}),
        client.get(reverse("alerts:channels")),
        client.get(reverse("alerts:channel-edit", args=[channel.pk])),
        client.get(reverse("accounts:audit")),
    ]
    for page in later:
        assert page.status_code == 200
        assert shown_secrets(page.content.decode()) == []
    assert not AuditEntry.objects.filter(detail__contains="whsec_").exists()


def test_an_edit_does_not_show_the_secret_again(admin_user: User) -> None:
    client = client_for(admin_user)
    channel, _ = make_channel(client, name="signed", kind="webhook", target="https://hooks.example.com/in")

    response = client.post(
        reverse("alerts:channel-edit", args=[channel.pk]),
        {"name": "renamed", "kind": "webhook", "target": "https://hooks.example.com/in"},
        follow=True,
    )

    assert "renamed" in response.content.decode()
    assert shown_secrets(response.content.decode()) == []


def test_an_e_mail_channel_has_no_secret_to_show(admin_user: User) -> None:
    response = client_for(admin_user).post(
        reverse("alerts:channel-new"), {"name": "mail", "kind": "email", "target": "oncall@example.com"}, follow=True
    )

    html = response.content.decode()
    assert response.status_code == 200 and "mail" in html
    assert shown_secrets(html) == []
    assert "Rotate" not in html


def test_an_e_mail_channel_turned_into_a_webhook_gets_a_fresh_secret_shown_once(admin_user: User) -> None:
    client = client_for(admin_user)
    channel = Channel.objects.create(name="mail", kind="email", target="oncall@example.com")
    unshown = channel.signing_secret

    response = client.post(
        reverse("alerts:channel-edit", args=[channel.pk]),
        {"name": "mail", "kind": "webhook", "target": "https://hooks.example.com/in"},
        follow=True,
    )

    channel.refresh_from_db()
    assert channel.signing_secret != unshown
    assert shown_secrets(response.content.decode()) == [channel.signing_secret]
    again = client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()
    assert shown_secrets(again) == []


def test_the_admin_shows_the_secret_once_after_adding_a_channel_and_never_in_its_form(db: None) -> None:
    root = User.objects.create_superuser("root", password="pw-root")
    client = client_for(root)

    response = client.post(
        reverse("admin:alerts_channel_add"),
        {
            "name": "from admin",
            "kind": "webhook",
            "target": "https://hooks.example.com/in",
            "enabled": "on",
            "notice_window_rules": "[]",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
        follow=True,
    )

    channel = Channel.objects.get(name="from admin")
    assert shown_secrets(response.content.decode()) == [channel.signing_secret]
    pages = [
        client.get(reverse("admin:alerts_channel_change", args=[channel.pk])),
        client.get(reverse("admin:alerts_channel_changelist")),
        client.get(reverse("admin:alerts_channel_history", args=[channel.pk])),
        client.get(reverse("alerts:channel", args=[channel.pk])),
    ]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert channel.signing_secret not in html and shown_secrets(html) == []
    assert "Rotate" in pages[0].content.decode()  # the admin's form says where to rotate it
    assert not AuditEntry.objects.filter(detail__contains=channel.signing_secret).exists()


def test_a_change_in_the_admin_keeps_the_secret(db: None) -> None:
    root = User.objects.create_superuser("root", password="pw-root")
    channel = Channel.objects.create(name="hook", kind="webhook", target="https://hooks.example.com/in")
    secret = channel.signing_secret

    response = client_for(root).post(
        reverse("admin:alerts_channel_change", args=[channel.pk]),
        {
            "name": "hook 2",
            "kind": "webhook",
            "target": "https://hooks.example.com/in",
            "enabled": "on",
            "notice_window_rules": "[]",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
    )

    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.name, channel.signing_secret) == ("hook 2", secret)


# Rotation ------------------------------------------------------------------------------------------------------


def test_rotating_changes_the_secret_shows_it_once_and_writes_an_audit_row_without_it(admin_user: User) -> None:
    client = client_for(admin_user)
    channel, old = make_channel(client, name="signed", kind="webhook", target="https://hooks.example.com/in")

    response = client.post(reverse("alerts:channel-rotate-secret", args=[channel.pk]), follow=True)

    channel.refresh_from_db()
    new = channel.signing_secret
    assert new != old and channel.previous_signing_secret == old
    assert response.redirect_chain == [(reverse("alerts:channel", args=[channel.pk]), 302)]
    assert shown_secrets(response.content.decode()) == [new]
    assert "no-store" in response["Cache-Control"]
    assert shown_secrets(client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()) == []
    entry = AuditEntry.objects.get(action="alerts.channel.rotate_secret")
    assert (entry.actor, entry.target) == (admin_user, f"channel:{channel.pk}")
    assert "signed" in entry.detail
    assert old not in entry.detail and new not in entry.detail and "whsec_" not in entry.detail


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_viewer_or_operator_cannot_rotate_a_secret(viewer: User, operator: User, role: str) -> None:
    user = viewer if role == "viewer" else operator
    channel = Channel.objects.create(name="signed", kind="webhook", target="https://hooks.example.com/in")
    secret = channel.signing_secret

    response = client_for(user).post(reverse("alerts:channel-rotate-secret", args=[channel.pk]))

    assert response.status_code == 403
    channel.refresh_from_db()
    assert (channel.signing_secret, channel.previous_signing_secret) == (secret, "")
    assert not AuditEntry.objects.filter(action="alerts.channel.rotate_secret").exists()


def test_rotation_needs_a_post_with_the_csrf_token(admin_user: User) -> None:
    channel = Channel.objects.create(name="signed", kind="webhook", target="https://hooks.example.com/in")
    secret = channel.signing_secret
    url = reverse("alerts:channel-rotate-secret", args=[channel.pk])

    assert client_for(admin_user).get(url).status_code == 405
    assert client_for(admin_user, enforce_csrf_checks=True).post(url).status_code == 403

    channel.refresh_from_db()
    assert channel.signing_secret == secret


def test_an_e_mail_channel_has_no_secret_to_rotate(admin_user: User) -> None:
    channel = Channel.objects.create(name="mail", kind="email", target="oncall@example.com")
    secret = channel.signing_secret

    response = client_for(admin_user).post(reverse("alerts:channel-rotate-secret", args=[channel.pk]), follow=True)

    assert "not signed" in response.content.decode()
    channel.refresh_from_db()
    assert channel.signing_secret == secret
    assert not AuditEntry.objects.filter(action="alerts.channel.rotate_secret").exists()


def test_after_a_rotation_both_secrets_sign_until_the_overlap_ends(admin_user: User, receiver: Receiver) -> None:
    client = client_for(admin_user)
    channel, old = make_channel(client, name="signed", kind="webhook", target=receiver.url)
    response = client.post(reverse("alerts:channel-rotate-secret", args=[channel.pk]), follow=True)
    (new,) = shown_secrets(response.content.decode())
    channel.refresh_from_db()
    assert channel.previous_signing_secret_until is not None
    assert channel.previous_signing_secret_until > timezone.now() + dt.timedelta(hours=23)
    assert "also signs until" in response.content.decode()

    send_test(channel)
    Channel.objects.filter(pk=channel.pk).update(previous_signing_secret_until=timezone.now() - dt.timedelta(seconds=1))
    send_test(channel)

    during, after = receiver.received
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    verify(old, during)
    verify(new, during)
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    verify(new, after)
    with pytest.raises(WebhookVerificationError):
        verify(old, after)


# The documentation's own example -------------------------------------------------------------------------------


def test_the_hmac_example_of_the_documentation_verifies_a_real_notification(
    admin_user: User, receiver: Receiver
) -> None:
    docs = (Path(settings.BASE_DIR) / "docs" / "webhooks.md").read_text()
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", docs, re.S) if "import hmac" in block]
    namespace: dict[str, Any] = {}
    exec(example, namespace)  # the receiver's code exactly as the documentation gives it
    channel, secret = make_channel(client_for(admin_user), name="signed", kind="webhook", target=receiver.url)
    send_test(channel)
    (request,) = receiver.received

    assert namespace["verify"](secret, request.headers, request.raw) == request.body
    with pytest.raises(ValueError, match="signature"):
        namespace["verify"](secret, request.headers, request.raw.replace(b"info", b"crit"))


# Channels made before signing ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_each_existing_channel_a_secret_and_each_notification_an_id(migrate: Any) -> None:
    old = migrate([("alerts", "0006_rule_number_bounds")])
    OldChannel = old.get_model("alerts", "Channel")
    OldNotification = old.get_model("alerts", "Notification")
    channels = [
        OldChannel.objects.create(name=f"c{n}", kind="webhook", target=f"http://127.0.0.1:9/{n}") for n in range(3)
    ]
    for channel in channels:
        for _ in range(2):
            OldNotification.objects.create(channel=channel, kind="test", status="queued", context={})

    new = migrate([("alerts", "0007_webhook_signing")])

    secrets = list(new.get_model("alerts", "Channel").objects.values_list("signing_secret", flat=True))
    assert len(set(secrets)) == 3
    assert all(len(base64.b64decode(secret.removeprefix("whsec_"))) == 32 for secret in secrets)
    ids = list(new.get_model("alerts", "Notification").objects.values_list("webhook_id", flat=True))
    assert len(set(ids)) == len(ids) == 6
