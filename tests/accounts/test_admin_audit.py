"""Every add, change and delete made in the Django admin writes an audit row, for every registered model (users
and groups included), without doubling the rows of admins that already write their own."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.models import AlertRule, Channel

pytestmark = [pytest.mark.django_db]

# The admin's split date and time widgets of a created_at field.
CREATED = {"created_at_0": "2026-01-01", "created_at_1": "00:00:00"}


@pytest.fixture
def root() -> User:
    return User.objects.create_superuser("root", password="pw-root")


@pytest.fixture
def root_client(root: User) -> Client:
    client = Client()
    client.force_login(root)
    return client


def test_every_registered_admin_writes_audit_rows() -> None:
    unaudited = [
        f"{model._meta.label}: {type(model_admin).__name__}"
        for model, model_admin in admin.site._registry.items()
        if not isinstance(model_admin, AuditedModelAdmin)
    ]

    assert unaudited == []
    assert {User, Group} <= set(admin.site._registry)


def test_adding_a_user_is_audited_without_the_password(root_client: Client, root: User) -> None:
    response = root_client.post(
        reverse("admin:auth_user_add"),
        {
            "username": "newbie",
            "usable_password": "true",
            "password1": "Long-pass-4711",
            "password2": "Long-pass-4711",
            "role": "viewer",
        },
    )

    assert response.status_code == 302
    user = User.objects.get(username="newbie")
    entry = AuditEntry.objects.get(action="admin.auth.user.add")
    assert (entry.actor, entry.target) == (root, f"user:{user.pk}")
    assert entry.detail.startswith("newbie: Added.")
    assert "Long-pass-4711" not in entry.detail and "pbkdf2" not in entry.detail


def test_changing_a_users_role_is_audited_with_the_new_role(root_client: Client, root: User) -> None:
    user = User.objects.create_user("vera", password="pw-vera")

    response = root_client.post(
        reverse("admin:auth_user_change", args=[user.pk]),
        {
            "username": "vera",
            "is_active": "on",
            "role": "admin",
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
        },
    )

    assert response.status_code == 302
    assert list(user.groups.values_list("name", flat=True)) == ["admin"]
    entry = AuditEntry.objects.get(action="admin.auth.user.change")
    assert entry.actor == root and entry.target == f"user:{user.pk}"
    assert "Changed Role" in entry.detail
    assert "role=admin" in entry.detail


def test_adding_a_group_is_audited(root_client: Client) -> None:
    root_client.post(reverse("admin:auth_group_add"), {"name": "auditors"})

    group = Group.objects.get(name="auditors")
    assert AuditEntry.objects.get(action="admin.auth.group.add").target == f"group:{group.pk}"


def test_saving_a_group_without_a_change_writes_no_audit_row(root_client: Client) -> None:
    group = Group.objects.create(name="auditors")

    response = root_client.post(reverse("admin:auth_group_change", args=[group.pk]), {"name": "auditors"})
    renamed = root_client.post(reverse("admin:auth_group_change", args=[group.pk]), {"name": "reviewers"})

    assert response.status_code == renamed.status_code == 302
    (entry,) = AuditEntry.objects.filter(action="admin.auth.group.change")  # the rename only
    assert "reviewers" in entry.detail


def test_editing_an_alert_rule_is_audited_with_what_changed(root_client: Client) -> None:
    rule = AlertRule.objects.get(name="Dead letters waiting")

    response = root_client.post(
        reverse("admin:alerts_alertrule_change", args=[rule.pk]),
        {
            "name": rule.name,
            "kind": rule.kind,
            "queue": "",
            "threshold": "25",
            "window_seconds": rule.window_seconds,
            "for_seconds": rule.for_seconds,
            "severity": rule.severity,
            "cooldown_seconds": rule.cooldown_seconds,
            "reminder_seconds": rule.reminder_seconds,
            "enabled": "on",
            **CREATED,
        },
    )

    assert response.status_code == 302
    entry = AuditEntry.objects.get(action="admin.alerts.alertrule.change")
    assert entry.target == f"alertrule:{rule.pk}"
    assert "Changed Threshold" in entry.detail and "threshold=25.0" in entry.detail


def test_a_channel_target_change_is_audited_without_the_secret(root_client: Client) -> None:
    channel = Channel.objects.create(name="Slack", kind="slack", target="https://hooks.slack.com/services/T/B/old")

    response = root_client.post(
        reverse("admin:alerts_channel_change", args=[channel.pk]),
        {
            "name": "Slack",
            "kind": "slack",
            "target": "https://hooks.slack.com/services/T/B/n3w-s3cr3t",
            "enabled": "on",
            "notice_window_rules": "[]",
            **CREATED,
        },
    )

    assert response.status_code == 302
    entry = AuditEntry.objects.get(action="admin.alerts.channel.change")
    assert "Changed Target" in entry.detail
    assert "n3w-s3cr3t" not in entry.detail


def test_deleting_one_and_bulk_deleting_several_are_audited_one_row_each(root_client: Client) -> None:
    first, second, third = (
        Channel.objects.create(name=f"c{n}", kind="email", target="a@example.com") for n in range(3)
    )

    root_client.post(reverse("admin:alerts_channel_delete", args=[first.pk]), {"post": "yes"})
    root_client.post(
        reverse("admin:alerts_channel_changelist"),
        {"action": "delete_selected", "_selected_action": [str(second.pk), str(third.pk)], "post": "yes"},
    )

    assert not Channel.objects.exists()
    deleted = AuditEntry.objects.filter(action="admin.alerts.channel.delete")
    assert sorted(deleted.values_list("target", flat=True)) == [f"channel:{c.pk}" for c in (first, second, third)]
    assert {entry.detail for entry in deleted} == {"c0 (email)", "c1 (email)", "c2 (email)"}


@pytest.mark.parametrize(
    ("kind", "threshold", "error"),
    [
        ("dlq_growth", "", "how many new dead letters within the window alert"),
        ("oldest_age", "", "how long the oldest dead letter may wait"),
        ("queue_depth", "0", "0 would fire on an empty queue"),
    ],
)
def test_the_admin_refuses_a_rule_that_would_fire_on_nothing_or_never(
    root_client: Client, kind: str, threshold: str, error: str
) -> None:
    response = root_client.post(
        reverse("admin:alerts_alertrule_add"),
        {
            "name": "careless",
            "kind": kind,
            "queue": "",
            "threshold": threshold,
            "window_seconds": 60,
            "for_seconds": 0,
            "severity": "warning",
            "cooldown_seconds": 0,
            "reminder_seconds": 0,
            "enabled": "on",
            **CREATED,
        },
    )

    assert response.status_code == 200 and error in response.content.decode()
    assert not AlertRule.objects.filter(name="careless").exists()
