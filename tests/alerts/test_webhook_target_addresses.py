"""Webhook and Slack targets never reach link-local (cloud metadata), 'this network' or multicast addresses:
refused when the channel is saved, and refused at send time on what a host name resolves to."""

from __future__ import annotations

import ipaddress

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from dlqconsole.alerts.delivery import deliver_notification, send_test_notification
from dlqconsole.alerts.models import Channel, NotificationStatus
from dlqconsole.core import http
from dlqconsole.core.http import HttpError, post_json
from tests.alerts.conftest import Receiver
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/hook", "link-local"),
        ("http://[::ffff:169.254.169.254]/hook", "link-local"),
        ("http://0.0.0.0:8080/hook", "this network"),
        ("http://224.0.0.1/hook", "multicast"),
        # Cloud metadata services outside 169.254.0.0/16: AWS over IPv6, Alibaba.
        ("http://[fd00:ec2::254]/latest/meta-data/", "DLQ_WEBHOOK_DENIED_NETWORKS (fd00:ec2::254/128)"),
        ("http://100.100.100.200/latest/meta-data/", "DLQ_WEBHOOK_DENIED_NETWORKS (100.100.100.200/32)"),
        # IPv6 forms that carry traffic to 169.254.169.254: NAT64, 6to4, Teredo, IPv4-compatible.
        ("http://[64:ff9b::a9fe:a9fe]/hook", "(169.254.169.254) is a link-local"),
        ("http://[2002:a9fe:a9fe::1]/hook", "(169.254.169.254) is a link-local"),
        ("http://[2001:0:4136:e378:8000:63bf:5601:5601]/hook", "(169.254.169.254) is a link-local"),
        ("http://[::a9fe:a9fe]/hook", "(169.254.169.254) is a link-local"),
        # NAT64's local-use prefix (RFC 8215), with the IPv4 address after a /96, /64, /56 and /48 prefix.
        ("http://[64:ff9b:1:abcd::a9fe:a9fe]/hook", "(169.254.169.254) is a link-local"),
        ("http://[64:ff9b:1:0:a9:fea9:fe00:0]/hook", "(169.254.169.254) is a link-local"),
        ("http://[64:ff9b:1:a9:fe:a9fe::]/hook", "(169.254.169.254) is a link-local"),
        ("http://[64:ff9b:1:a9fe:a9:fe00::]/hook", "(169.254.169.254) is a link-local"),
    ],
)
@pytest.mark.parametrize("kind", ["webhook", "slack"])
def test_channel_form_refuses_a_denied_address(admin_user: User, kind: str, target: str, reason: str) -> None:
    response = client_for(admin_user).post(
        reverse("alerts:channel-new"), {"name": "Metadata", "kind": kind, "target": target}
    )

    assert response.status_code == 400
    assert not Channel.objects.filter(name="Metadata").exists()
    errors = response.context["form"].errors["target"]
    assert any(reason in error and "DLQ_WEBHOOK_DENIED_NETWORKS" in error for error in errors), errors


@pytest.mark.parametrize(
    "target",
    ["http://127.0.0.1:9000/hook", "http://10.1.2.3/services/x", "https://hooks.slack.com/services/T0/B0/secret"],
)
def test_channel_form_keeps_loopback_private_and_public_targets(admin_user: User, target: str) -> None:
    response = client_for(admin_user).post(
        reverse("alerts:channel-new"), {"name": "Fine", "kind": "slack", "target": target}
    )

    assert response.status_code == 302
    assert Channel.objects.get(name="Fine").target == target


def test_a_denied_address_saved_before_the_check_fails_at_send_time() -> None:
    # A channel stored before the form refused such targets (or through the admin's raw database) must still
    # never reach the metadata service.
    channel = Channel.objects.create(name="old", kind="webhook", target="http://169.254.169.254/latest/")
    notification = send_test_notification(channel=channel, actor=None)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    assert notification.attempts == 1
    assert notification.error.startswith("Refused: 169.254.169.254 is a link-local address")


def test_a_host_name_resolving_into_a_denied_network_fails_the_send(receiver: Receiver) -> None:
    # "localhost" resolves to 127.0.0.1; denying loopback for this test stands in for a name whose DNS answer is
    # 169.254.169.254 (the check is on the resolved address, so the receiver must hear nothing).
    url = receiver.url.replace("127.0.0.1", "localhost")
    channel = Channel.objects.create(name="rebound", kind="webhook", target=url)
    notification = send_test_notification(channel=channel, actor=None)

    with override_settings(DLQ_WEBHOOK_DENIED_NETWORKS=["127.0.0.0/8", "::1/128"]):
        deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    assert notification.error.startswith("Refused: localhost resolves to ")
    assert "DLQ_WEBHOOK_DENIED_NETWORKS" in notification.error
    assert receiver.received == []


def test_the_same_host_name_is_sent_to_when_its_network_is_allowed(receiver: Receiver) -> None:
    post_json(receiver.url.replace("127.0.0.1", "localhost"), payload={"ok": True})

    assert [item.body for item in receiver.received] == [{"ok": True}]


def test_a_refused_send_is_permanent() -> None:
    with pytest.raises(HttpError) as raised:
        post_json("http://[fe80::a9fe:a9fe]/x", payload={})

    assert raised.value.permanent
    assert "link-local" in raised.value.message


EMBEDDED_METADATA = [
    "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::1",
    "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo, client 169.254.169.254 (stored inverted)
    "::a9fe:a9fe",
    "64:ff9b:1:a9fe:a9:fe00::",
    "fd00:ec2::254",
    "100.100.100.200",
]


@pytest.mark.parametrize("address", EMBEDDED_METADATA)
def test_a_metadata_address_in_any_form_saved_before_the_check_fails_at_send_time(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    channel = Channel.objects.create(name="old", kind="webhook", target=f"http://{host}/latest/")
    notification = send_test_notification(channel=channel, actor=None)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    assert notification.error.startswith(f"Refused: {address}")
    assert "DLQ_WEBHOOK_DENIED_NETWORKS" in notification.error


@pytest.mark.parametrize("address", EMBEDDED_METADATA)
def test_a_host_name_resolving_to_a_metadata_address_in_any_form_is_refused(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resolver stands in for DNS answering with that address; the connection checks what it returns.
    monkeypatch.setattr(http, "_resolve", lambda host, port: [address])

    with pytest.raises(HttpError) as raised:
        post_json("http://hooks.example.net/x", payload={})

    assert raised.value.permanent
    assert raised.value.message.startswith(f"Refused: hooks.example.net resolves to {address}")


@pytest.mark.parametrize(
    "address", ["::1", "64:ff9b::a00:1", "64:ff9b:1:abcd::a00:1", "2002:a00:1::1", "fd00::1", "100.64.0.1"]
)
def test_loopback_and_private_addresses_in_those_forms_stay_allowed(address: str) -> None:
    assert http.refusal(ipaddress.ip_address(address)) is None
