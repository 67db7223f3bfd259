"""A webhook's secret may be anywhere in its URL (a ntfy topic, a short key, a path parameter), and viewers read
the audit log and the alert pages: audit rows name a webhook channel's target by scheme and host only, and a
failed send's error never quotes the URL's path, query or password."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.models import Channel
from dlqconsole.core.http import HttpError, post_json
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db]

LEAKED = [
    ("https://ntfy.sh/my-secret-topic-abc", "my-secret-topic-abc", "https://ntfy.sh/…"),
    ("https://example.com/alert/s3cr3t-short", "s3cr3t-short", "https://example.com/…"),
    ("https://example.com/notify;token=abcdefabcdefabcdef12", "abcdefabcdefabcdef12", "https://example.com/…"),
    ("https://bot:pa55word@example.com/in?key=k3y", "pa55word", "https://example.com/…"),
]


@pytest.mark.parametrize(("target", "secret", "written"), LEAKED)
@pytest.mark.parametrize("kind", ["webhook", "slack"])
def test_the_audit_row_of_a_saved_channel_names_only_scheme_and_host(
    admin_user: User, viewer: User, kind: str, target: str, secret: str, written: str
) -> None:
    client = client_for(admin_user)
    response = client.post(reverse("alerts:channel-new"), {"name": "Leaky", "kind": kind, "target": target})
    assert response.status_code == 302
    channel = Channel.objects.get(name="Leaky")
    response = client.post(
        reverse("alerts:channel-edit", args=[channel.pk]), {"name": "Leaky 2", "kind": kind, "target": target}
    )
    assert response.status_code == 302

    rows = AuditEntry.objects.filter(action__startswith="alerts.channel.")
    assert rows.count() == 2
    for row in rows:
        assert row.detail.endswith(f"({kind}) {written}")
        assert secret not in row.detail
    assert secret not in client_for(viewer).get(reverse("accounts:audit")).content.decode()


def test_an_e_mail_channel_audit_row_keeps_its_addresses(admin_user: User) -> None:
    client_for(admin_user).post(
        reverse("alerts:channel-new"), {"name": "Mail", "kind": "email", "target": "oncall@example.com"}
    )

    assert "oncall@example.com" in AuditEntry.objects.get(action="alerts.channel.create").detail


def test_a_connection_error_does_not_quote_the_path_query_or_password() -> None:
    # Port 9 on loopback refuses the connection: urllib3's error quotes the URL's path and query.
    with pytest.raises(HttpError) as raised:
        post_json("http://bot:pa55word@127.0.0.1:9/alert/s3cr3t-short?key=k3y-value", payload={}, timeout=2)

    message = raised.value.message
    assert message.startswith("Connection failed:")
    assert "s3cr3t" not in message and "k3y-value" not in message and "pa55word" not in message


def test_a_target_that_is_not_http_is_not_quoted_in_the_error() -> None:
    with pytest.raises(HttpError) as raised:
        post_json("ftp://example.com/s3cr3t-path", payload={})

    assert "s3cr3t" not in raised.value.message and "'ftp'" in raised.value.message
