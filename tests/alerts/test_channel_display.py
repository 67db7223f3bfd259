"""Channels can be told apart: names are unique without regard to case, and the target shows its scheme, host,
port and first path segment (the list cut in the middle, the channel page whole), every other path segment and
every parameter and query value masked, the same way on both."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils.html import escape

from dlqconsole.alerts.models import Channel
from dlqconsole.alerts.notifiers.webhook import WebhookNotifier
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db]


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        (
            "https://hooks.slack.com/services/T0123ABC/B0456DEF/abcdefghijklmnopqrstuvwx",
            "https://hooks.slack.com/services/••••",
        ),
        ("https://chat.example.com/hooks/k3y", "https://chat.example.com/hooks/••••"),
        ("https://discord.com/api/webhooks/123456/abcDEF_123-xyz", "https://discord.com/api/••••"),
        (
            "https://ops.example.com/alerts/orders?token=abc&team=x",
            "https://ops.example.com/alerts/••••?token=••••&team=••••",
        ),
        ("https://bot:pa55@ops.example.com/in", "https://bot:••••@ops.example.com/••••"),
        ("https://0f8fad5bd9cb469fa16570867728950e@ops.example.com/in", "https://••••@ops.example.com/••••"),
        ("https://x.example.com/in/0f8fad5bd9cb469fa16570867728950e/go", "https://x.example.com/in/••••"),
        ("http://127.0.0.1:9000/alerts/dlq", "http://127.0.0.1:9000/alerts/••••"),
        ("http://127.0.0.1:9000/", "http://127.0.0.1:9000/"),
        # Secrets that do not look like tokens: a topic name (ntfy), a short key, a path parameter.
        ("https://ntfy.sh/my-secret-topic-abc", "https://ntfy.sh/••••"),
        ("https://example.com/alert/s3cr3t-short", "https://example.com/alert/••••"),
        ("https://example.com/notify;token=abcdefabcdefabcdef12", "https://example.com/••••"),
        ("https://example.com/notify;token=s3cr3t/in", "https://example.com/notify;token=••••/••••"),
    ],
)
def test_a_webhook_target_is_shown_with_every_path_segment_past_the_first_masked(target: str, shown: str) -> None:
    assert WebhookNotifier.display_target(target) == shown


def test_two_slack_webhooks_are_told_apart_by_name_and_never_show_their_path(admin_user: User) -> None:
    first = Channel.objects.create(
        name="orders", kind="slack", target="https://hooks.slack.com/services/T0AAA/B0ORDERS/s3cr3tOrdersToken0001"
    )
    second = Channel.objects.create(
        name="payments", kind="slack", target="https://hooks.slack.com/services/T0AAA/B0PAYMNT/s3cr3tPaymentToken02"
    )
    client = client_for(admin_user)

    listing = client.get(reverse("alerts:channels")).content.decode()
    pages = [client.get(reverse("alerts:channel", args=[c.pk])).content.decode() for c in (first, second)]

    for html in (listing, *pages):
        assert "s3cr3t" not in html and "B0ORDERS" not in html and "B0PAYMNT" not in html
    assert "https://hooks.slack.com/services/••••" in listing
    assert "orders" in pages[0] and "https://hooks.slack.com/services/••••" in pages[0]
    assert "payments" in pages[1]
    # Their masked targets look alike; a keyed tag of each whole target tells them apart, in the list and on
    # each page.
    assert first.target_tag != second.target_tag
    assert f"#{first.target_tag}" in listing and f"#{second.target_tag}" in listing
    assert f"#{first.target_tag}" in pages[0] and f"#{second.target_tag}" in pages[1]


def test_channels_with_the_same_target_have_the_same_tag_and_a_bare_target_none(db: None) -> None:
    hook = "https://hooks.slack.com/services/T0AAA/B0ORDERS/s3cr3tOrdersToken0001"
    first = Channel.objects.create(name="a", kind="slack", target=hook)
    second = Channel.objects.create(name="b", kind="webhook", target=hook)
    email = Channel.objects.create(name="c", kind="email", target="oncall@example.com")

    assert len(first.target_tag) == 6 and first.target_tag == second.target_tag
    assert first.target_tag not in hook
    assert email.target_tag == ""


def test_a_long_target_is_cut_in_the_middle_in_the_list_and_whole_on_its_page(admin_user: User) -> None:
    target = "https://alerts.internal.example.com:8443/receivers/platform-team?team=dead-letters&region=eu-west-1&x=1"
    channel = Channel.objects.create(name="long", kind="webhook", target=target)
    client = client_for(admin_user)

    listing = client.get(reverse("alerts:channels")).content.decode()
    page = client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()

    assert escape(channel.target_short) in listing and "…" in channel.target_short
    assert channel.target_short.startswith("https://alerts.internal.example.com:8443/")
    assert channel.target_short.endswith("&x=••••")
    assert f'title="{escape(channel.target_display)}"' in listing
    assert escape(channel.target_display) in page and "dead-letters" not in page


def test_a_target_is_escaped_on_the_channel_page(admin_user: User) -> None:
    channel = Channel.objects.create(name="odd", kind="webhook", target='https://x.example.com/a"><b>bold/x?<i>=1')

    page = client_for(admin_user).get(reverse("alerts:channel", args=[channel.pk])).content.decode()

    assert "<b>bold" not in page and "&lt;b&gt;bold" in page
    assert "<i>=" not in page and "&lt;i&gt;=••••" in page


def test_a_duplicate_channel_name_is_refused_without_regard_to_case(admin_user: User) -> None:
    Channel.objects.create(name="On-call", kind="email", target="a@example.com")
    client = client_for(admin_user)

    response = client.post(
        reverse("alerts:channel-new"), {"name": "on-CALL", "kind": "email", "target": "b@example.com"}
    )

    assert response.status_code == 400
    assert Channel.objects.count() == 1
    assert "already exists" in response.context["form"].errors["name"][0]


def test_a_channel_keeps_its_own_name_when_edited(admin_user: User) -> None:
    channel = Channel.objects.create(name="On-call", kind="email", target="a@example.com")

    response = client_for(admin_user).post(
        reverse("alerts:channel-edit", args=[channel.pk]),
        {"name": "On-call", "kind": "email", "target": "c@example.com"},
    )

    assert response.status_code == 302
    channel.refresh_from_db()
    assert channel.target == "c@example.com"


def test_the_admin_refuses_a_duplicate_channel_name_too(db: None) -> None:
    Channel.objects.create(name="On-call", kind="email", target="a@example.com")
    root = User.objects.create_superuser("root", password="pw-root")

    response = client_for(root).post(
        reverse("admin:alerts_channel_add"),
        {
            "name": "ON-CALL",
            "kind": "email",
            "target": "b@example.com",
            "enabled": "on",
            "notice_window_rules": "[]",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
    )

    assert response.status_code == 200 and "already exists" in response.content.decode()
    assert Channel.objects.count() == 1


def test_a_direction_control_in_a_channel_name_cannot_reorder_the_console_sentences(admin_user: User) -> None:
    name = "pager \u202eevil"
    client = client_for(admin_user)

    saved = client.post(
        reverse("alerts:channel-new"),
        {"name": name, "kind": "email", "target": "oncall@example.com", "attach_to_all_rules": "on"},
        follow=True,
    ).content.decode()
    channel = Channel.objects.get(name=name)
    rules = client.get(reverse("alerts:rules")).content.decode()

    # In the notice (plain text) the name sits in a first-strong isolate; in the page's own markup in an element
    # the style sheet isolates (span), so an override inside it ends there.
    assert f"Channel “\u2068{name}\u2069” saved. Send a test to check it." in saved
    assert f"<h1>Channel “<span>{name}</span>”</h1>" in saved
    assert f"<span>{name}</span>" in rules
    assert Channel.objects.filter(pk=channel.pk).exists()


@pytest.mark.parametrize(
    ("kind", "target", "error"),
    [
        ("webhook", "http://169.254.169.254/latest/meta-data/", "DLQ_WEBHOOK_DENIED_NETWORKS"),
        ("slack", "ftp://hooks.example.com/x", "Enter an http(s) URL."),
        ("webhook", "https://hooks.example.com/" + "x" * 2100, "The URL is 2,126 characters long; at most 2,048."),
        ("email", "not an address", "Enter a valid email address."),
    ],
)
def test_the_admin_checks_a_target_as_the_console_form_does(db: None, kind: str, target: str, error: str) -> None:
    root = User.objects.create_superuser("root", password="pw-root")

    response = client_for(root).post(
        reverse("admin:alerts_channel_add"),
        {
            "name": "Metadata",
            "kind": kind,
            "target": target,
            "enabled": "on",
            "notice_window_rules": "[]",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
    )

    assert response.status_code == 200 and error in response.content.decode()
    assert not Channel.objects.exists()


def test_the_admin_saves_a_target_normalised_by_its_kind(db: None) -> None:
    root = User.objects.create_superuser("root", password="pw-root")

    client_for(root).post(
        reverse("admin:alerts_channel_add"),
        {
            "name": "Pager",
            "kind": "email",
            "target": " a@example.com; b@example.com ",
            "enabled": "on",
            "notice_window_rules": "[]",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
    )

    assert Channel.objects.get(name="Pager").target == "a@example.com, b@example.com"


def test_a_direction_control_in_a_channel_name_ends_before_its_kind_in_the_rule_form(admin_user: User) -> None:
    Channel.objects.create(name="pager \u202eevil", kind="email", target="oncall@example.com")

    form = client_for(admin_user).get(reverse("alerts:rule-new")).content.decode()

    assert "\u2068pager \u202eevil\u2069 (email)" in form
