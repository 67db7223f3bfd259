"""A failed send reads as a reason people understand ("connection refused by 127.0.0.1:9", "timed out after 5 s
waiting for ...", "HTTP 500 (Internal Server Error) from ..."), with the library's raw text still there, folded
away. The failures are real: a closed port, a slow and a failing receiver on 127.0.0.1, a refusing mail port."""

from __future__ import annotations

import re
import socket
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from dlqconsole.alerts.delivery import deliver_notification, send_test_notification
from dlqconsole.alerts.failures import summarise_failure
from dlqconsole.alerts.models import Channel, Notification, NotificationStatus
from tests.alerts.conftest import Receiver

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true"}


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def failed_test_send(channel: Channel) -> Notification:
    notification = send_test_notification(channel=channel, actor=None)
    deliver_notification(notification_id=notification.pk)
    notification.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    return notification


def test_connection_refused_names_the_host_and_port(admin_user: User, client: Client) -> None:
    port = closed_port()
    channel = Channel.objects.create(name="down", kind="webhook", target=f"http://127.0.0.1:{port}/hook/s3cr3t")
    notification = failed_test_send(channel)
    assert "Max retries exceeded" in notification.error  # what people were shown until now
    client.force_login(admin_user)

    fragment = client.get(reverse("alerts:notification", args=[notification.pk]), headers=HTMX).content.decode()
    page = client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()

    for html in (fragment, page):
        assert f'<span class="failure">connection refused by 127.0.0.1:{port}</span>' in html
        # The raw text is still there for whoever needs it, folded away.
        raw = re.search(r'<details class="raw-error"><summary>raw error</summary><pre>(.*?)</pre>', html, re.S)
        assert raw is not None and unescape(raw.group(1)) == notification.error


def test_http_error_names_the_status_and_host_not_the_secret_path(receiver: Receiver) -> None:
    receiver.status = 500
    channel = Channel.objects.create(name="hook", kind="webhook", target=receiver.url + "/T0/s3cr3t")
    notification = failed_test_send(channel)

    summary = summarise_failure(notification.error, kind=channel.kind, target=channel.target)

    port = receiver.url.split(":")[2].split("/")[0]
    assert summary == f"HTTP 500 (Internal Server Error) from 127.0.0.1:{port}"
    assert "s3cr3t" not in summary


@override_settings(DLQ_HTTP_TIMEOUT_SECONDS=0.3)
def test_timeout_says_how_long_it_waited(receiver: Receiver) -> None:
    receiver.delay = 1.0
    channel = Channel.objects.create(name="slow", kind="webhook", target=receiver.url)
    notification = failed_test_send(channel)

    summary = summarise_failure(notification.error, kind=channel.kind, target=channel.target)

    assert summary.startswith("timed out after 0.3 s waiting for 127.0.0.1:")


@override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1")
def test_mail_server_refusing_connections_is_named() -> None:
    port = closed_port()
    channel = Channel.objects.create(name="mail", kind="email", target="oncall@example.com")
    with override_settings(EMAIL_PORT=port):
        notification = failed_test_send(channel)

        summary = summarise_failure(notification.error, kind=channel.kind, target=channel.target)

    assert summary == f"connection refused by 127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("error", "summary"),
    [
        (
            "Connection failed: HTTPSConnectionPool(host='hooks.nowhere.invalid', port=443): Max retries exceeded "
            'with url: /x (Caused by NameResolutionError("<urllib3.connection.HTTPSConnection object at 0x7f>: '
            "Failed to resolve 'hooks.nowhere.invalid' ([Errno -2] Name or service not known)\"))",
            "host name of hooks.nowhere.invalid:443 not found (DNS)",
        ),
        (
            "Connection failed: ('Connection aborted.', RemoteDisconnected('Remote end closed connection without "
            "response'))",
            "hooks.example.com closed the connection without answering",
        ),
        (
            "Connection failed: HTTPSConnectionPool(host='hooks.example.com', port=443): Max retries exceeded with "
            "url: /x (Caused by SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
            "verify failed: self-signed certificate (_ssl.c:1006)')))",
            "hooks.example.com:443's TLS certificate is not trusted",
        ),
        ("HTTP 418: teapot", "HTTP 418 (I'm a Teapot) from hooks.example.com"),
        ("Channel disabled: Permanent error: HTTP 410: gone", "Channel disabled: Permanent error: HTTP 410: gone"),
    ],
)
def test_other_common_failures_read_as_reasons(error: str, summary: str) -> None:
    assert summarise_failure(error, kind="slack", target="https://hooks.example.com/services/T0/B0/s3cr3t") == summary


def test_an_unrecognised_error_is_shown_once_without_a_raw_copy(admin_user: User, client: Client) -> None:
    channel = Channel.objects.create(name="odd", kind="webhook", target="http://127.0.0.1:9/")
    notification = Notification.objects.create(
        channel=channel, kind="test", status=NotificationStatus.FAILED, error="Something odd"
    )
    client.force_login(admin_user)

    html = client.get(reverse("alerts:notification", args=[notification.pk]), headers=HTMX).content.decode()

    assert '<span class="failure">Something odd</span>' in html and "raw-error" not in html


def test_channel_page_says_test_sends_are_not_counted(admin_user: User, client: Client) -> None:
    channel = Channel.objects.create(name="down", kind="webhook", target=f"http://127.0.0.1:{closed_port()}/")
    failed_test_send(channel)
    client.force_login(admin_user)

    html = client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()

    channel.refresh_from_db()
    assert (channel.sent_count, channel.failed_count) == (0, 0)
    assert "0 / 0 alert notifications" in html and "test sends are not counted" in html
    assert "test sends are not counted" in client.get(reverse("alerts:channels")).content.decode()
